"""apt_source's dpkg probe (roles/apt_source/library/apt_source_dpkg.py), run as Ansible runs it,
against a stand-in dpkg-query: what the repository roles decide from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import fakebin

MODULE = Path(__file__).resolve().parents[2] / "roles/apt_source/library/apt_source_dpkg.py"

# dpkg-query -W's answer in the module's format: installed, held and installed, held but removed,
# known but not installed; an unknown name makes it exit 1, as the real one does.
DPKG_LINES = (
    "nvidia-open\t580.95.05-1\thi \n"
    "nvidia-driver-pinning-580\t580-1\tii \n"
    "cuda-drivers\t\thn \n"
    "docker.io\t\tun \n"
    "python3-apt\t2.6.0\tii \n"
    "ca-certificates\t20230311\tii \n"
)


def run_module(tmp_path: Path, args: dict[str, Any], *, rc: int = 1) -> dict[str, Any]:
    bin_dir = tmp_path / "bin"
    fakebin.shell(bin_dir, "dpkg-query",
                  f"printf '%s' '{DPKG_LINES}'\necho 'no packages found' >&2\nexit {rc}\n")
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    return json.loads(proc.stdout)


def test_installed_and_held_packages_are_read(tmp_path: Path) -> None:
    out = run_module(tmp_path, {"packages": ["nvidia-open", "cuda-drivers", "docker.io", "gone"]})
    assert "failed" not in out, out
    assert out["installed"] == {"nvidia-open": "580.95.05-1", "nvidia-driver-pinning-580": "580-1",
                                "python3-apt": "2.6.0", "ca-certificates": "20230311"}
    assert out["held"] == ["nvidia-open", "cuda-drivers"]
    assert out["changed"] is False


def test_missing_prerequisites_are_named_in_order(tmp_path: Path) -> None:
    prerequisites = ["ca-certificates", "python3-apt", "python3-debian"]
    out = run_module(tmp_path, {"packages": [], "prerequisites": prerequisites})
    assert out["missing"] == ["python3-debian"]
    assert out["blind"] is False  # outside check mode apt_source installs them


def test_check_mode_without_the_apt_bindings_is_blind(tmp_path: Path) -> None:
    out = run_module(tmp_path, {"packages": ["nvidia-open"], "_ansible_check_mode": True})
    assert out["blind"] is True  # python3-debian is missing, and check mode cannot install it


@pytest.mark.parametrize("rc", [2, 64])
def test_a_dpkg_query_that_fails_fails_the_task(tmp_path: Path, rc: int) -> None:
    out = run_module(tmp_path, {"packages": ["nvidia-open"]}, rc=rc)
    assert out["failed"] is True
    assert f"rc {rc}" in out["msg"] and "no packages found" in out["msg"]


def test_a_keyring_is_read_with_its_stamp(tmp_path: Path) -> None:
    import hashlib

    keyring = tmp_path / "demo.asc"
    out = run_module(tmp_path, {"keyring": str(keyring)})
    assert (out["keyring_sha256"], out["keyring_stamp"]) == ("", "")  # absent: never current
    keyring.write_bytes(b"key bytes")
    (tmp_path / "demo.asc.verified").write_text("abc https://x/key FPR\nignored\n")
    out = run_module(tmp_path, {"keyring": str(keyring)})
    assert out["keyring_sha256"] == hashlib.sha256(b"key bytes").hexdigest()
    assert out["keyring_stamp"] == "abc https://x/key FPR"
    assert run_module(tmp_path, {})["keyring_sha256"] == ""  # no keyring asked for


def test_a_source_file_is_read_as_apt_reads_it(tmp_path: Path) -> None:
    source = tmp_path / "umprov-x.sources"
    source.write_text("# a comment\nEnabled: yes\nX-Repolib-Name: umprov-x\nSuites: /\n"
                      "Description: one\n  two\n")
    source.chmod(0o644)
    out = run_module(tmp_path, {"source": str(source)})
    assert out["source"] == {"mode": "0644", "paragraphs": [
        {"Enabled": "yes", "X-Repolib-Name": "umprov-x", "Suites": "/",
         "Description": "one\ntwo"}]}
    assert run_module(tmp_path, {"source": str(tmp_path / "absent")})["source"] == {}


def test_files_are_read_as_copy_compares_them_and_a_fifo_is_never_read(tmp_path: Path) -> None:
    import grp
    import hashlib
    import pwd

    written = tmp_path / "written.conf"
    written.write_bytes(b"content\n")
    written.chmod(0o640)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block the module for ever
    stat = written.stat()
    sha = hashlib.sha256(b"content\n").hexdigest()
    out = run_module(tmp_path, {"files": [str(written), str(fifo), str(tmp_path / "absent")]})
    assert out["files"] == {
        str(written): f"{sha} 0640 "
                      f"{pwd.getpwuid(stat.st_uid)[0]} {grp.getgrgid(stat.st_gid)[0]}",
        str(fifo): "", str(tmp_path / "absent"): ""}


def test_units_are_read_from_systemctl_is_enabled(tmp_path: Path) -> None:
    # rc 1 and "disabled" for a disabled unit; nothing on stdout for an unknown one.
    fakebin.shell(tmp_path / "bin", "systemctl",
                  'case "$2" in a) echo enabled ;; b) echo disabled; exit 1 ;;'
                  ' *) echo "Failed to get unit file state" >&2; exit 1 ;; esac\n')
    out = run_module(tmp_path, {"units": ["a", "b", "c"]})
    assert out["units"] == {"a": "enabled", "b": "disabled", "c": ""}
