"""apt_source's check of a repository signing key (tasks/key-fetch.yml): the task's own command,
rendered by Ansible's templar from the role's files and run with the real gpg against test keys
(tests/unit/keys: throw-away identities), and each repository role's published fingerprints."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
KEYS = Path(__file__).resolve().parent / "keys"
ONE = "A7CBA431456D364F1B34163591A975D60BE2107F"  # keys/one.asc
TWO = "1FC569FA05221567E3E17861D74A5D5E718FFFBA"  # with ONE in keys/one-and-two.gpg
CHECK = next(t for t in yaml.safe_load((ROLES / "apt_source/tasks/key-fetch.yml").read_text())
             if t["name"] == "Check the repository signing key's fingerprints")
VARS = yaml.safe_load((ROLES / "apt_source/vars/main.yml").read_text())
DEFAULTS = yaml.safe_load((ROLES / "apt_source/defaults/main.yml").read_text())
# Each repository role: the variable holding its vendor's fingerprints, the task file whose
# block passes it to apt_source.
CALLERS = {
    "nvidia_driver": "nvidia_driver_cuda_repo_key_fingerprints",
    "docker_engine": "docker_engine_repo_key_fingerprints",
    "nvidia_container_toolkit": "nvidia_container_toolkit_repo_key_fingerprints",
}


def render(expr: Any, **variables: Any) -> Any:
    from ansible.template import Templar, trust_as_template

    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=None, variables=trusted).template(trust_as_template(expr))


def role_vars(**given: Any) -> dict[str, Any]:
    """apt_source's defaults and vars, as the key task sees them, with ``given`` on top."""
    return {**DEFAULTS, **VARS, **CHECK["vars"], **given}


def check(keyring: Path, fingerprints: list[str], **given: Any) -> subprocess.CompletedProcess:
    """Run the task's command as Ansible would, on a copy of a test key as the keyring."""
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed here")
    variables = role_vars(apt_source_keyring=str(keyring), apt_source_key_fingerprints=fingerprints,
                          apt_source_key_url="https://repo.example/gpgkey",
                          apt_source_key_fingerprints_var="demo_repo_key_fingerprints", **given)
    assert render("{{ %s }}" % CHECK["when"], **variables) is True
    argv = render(CHECK["ansible.builtin.command"]["argv"], **variables)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def keyring(tmp_path: Path) -> Any:
    def copy(name: str) -> Path:
        path = tmp_path / "keyrings" / "demo.asc"
        path.parent.mkdir(exist_ok=True)
        shutil.copyfile(KEYS / name, path)
        return path

    return copy


def test_a_key_with_a_listed_fingerprint_stays(keyring: Any) -> None:
    path = keyring("one.asc")
    spaced = " ".join(re.findall("....", ONE)).lower()  # as vendors print them
    done = check(path, [TWO, "0x" + spaced])
    assert done.returncode == 0, done.stderr
    assert path.read_bytes() == (KEYS / "one.asc").read_bytes()


def test_a_key_with_another_fingerprint_is_removed_naming_it_and_the_variable(
    keyring: Any,
) -> None:
    path = keyring("one.asc")
    done = check(path, [TWO])
    assert done.returncode == 1
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message  # what umprov shows of a failed command
    assert message.startswith("demo_repo_key_fingerprints: the signing key from "
                              f"https://repo.example/gpgkey has fingerprint {ONE}, not one")
    assert f"removed {path}" in message and message.endswith(f"Expected: {TWO}")
    assert not path.exists()


def test_every_key_in_the_keyring_must_be_listed(keyring: Any) -> None:
    path = keyring("one-and-two.gpg")  # a vendor's key with another slipped in beside it
    done = check(path, [ONE])
    assert done.returncode == 1 and f"has fingerprint {TWO}," in done.stderr
    assert not path.exists()
    path = keyring("one-and-two.gpg")
    assert check(path, [ONE, TWO]).returncode == 0 and path.exists()


def test_a_file_that_is_no_key_is_removed(keyring: Any, tmp_path: Path) -> None:
    path = keyring("one.asc")
    path.write_text("<html>Sign in to the captive portal</html>\n")
    done = check(path, [ONE], apt_source_key="x")
    assert done.returncode == 1
    assert "the signing key from its text is no OpenPGP key gpg can read" in done.stderr
    assert not path.exists()


def test_no_fingerprints_no_check_and_no_gpg_needed() -> None:
    assert render("{{ %s }}" % CHECK["when"], **role_vars()) is False
    assert render("{{ __apt_source_prerequisites }}", **role_vars()) == [
        "ca-certificates", "python3-apt", "python3-debian"]
    given = role_vars(apt_source_key_fingerprints=[ONE])
    assert render("{{ __apt_source_prerequisites }}", **given)[-1] == "gpg"


@pytest.mark.parametrize(("role", "variable"), CALLERS.items())
def test_each_repository_role_checks_its_vendors_key_by_default(role: str, variable: str) -> None:
    defaults = yaml.safe_load((ROLES / role / "defaults/main.yml").read_text())
    assert defaults[variable], f"{role} checks no fingerprint by default"
    assert all(re.fullmatch("[0-9A-F]{40}", f) for f in defaults[variable]), defaults[variable]
    setup = (ROLES / role / "tasks/setup-Debian.yml").read_text()
    block = next(t for t in yaml.safe_load(setup) if "block" in t)["vars"]
    assert block["apt_source_key_fingerprints_var"] == variable
    assert variable in block["apt_source_key_fingerprints"]


def current(keyring: Path, fingerprints: list[str], **given: Any) -> bool:
    """__apt_source_key_current as the role sees it after apt_source_dpkg read the host."""
    import sys

    sys.path.insert(0, str(ROLES / "apt_source" / "library"))
    from apt_source_dpkg import _first_line, _sha256

    probe = {"keyring_sha256": _sha256(str(keyring)),
             "keyring_stamp": _first_line(f"{keyring}.verified")}
    variables = role_vars(**{"apt_source_keyring": str(keyring),
                             "apt_source_key_fingerprints": fingerprints,
                             "apt_source_key_url": "https://repo.example/gpgkey",
                             "apt_source_dpkg": probe, **given})
    return render("{{ __apt_source_key_current | bool }}", **variables) is True


def test_a_checked_key_is_stamped_and_left_alone_until_anything_changes(keyring: Any) -> None:
    """A converged host skips the download and gpg: the check stamps the keyring, and the stamp
    holds only for that keyring, origin and fingerprint list."""
    path = keyring("one.asc")
    assert not current(path, [ONE])  # never checked
    assert check(path, [ONE]).returncode == 0
    assert current(path, [ONE])
    assert not current(path, [ONE, TWO])  # the pinned list changed
    assert not current(path, [ONE], apt_source_key_url="https://other.example/key")
    assert not current(path, [])  # nothing pinned: always fetched and checked, as before
    path.write_bytes(path.read_bytes() + b"\n")  # the keyring changed on the host
    assert not current(path, [ONE])


def test_a_refused_key_takes_its_stamp_with_it(keyring: Any) -> None:
    path = keyring("one.asc")
    assert check(path, [ONE]).returncode == 0
    assert check(path, [TWO]).returncode == 1
    assert not path.exists() and not Path(f"{path}.verified").exists()

