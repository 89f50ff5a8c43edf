"""The lab's stand-in apt repository: really signed, really listing the real package names."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from umprov_lab import stand_in_repo

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("dpkg-deb", "gpg", "gpgv", "dpkg")),
    reason="needs dpkg-deb, dpkg, gpg and gpgv on the control machine (Debian: dpkg, gnupg, gpgv)",
)


def _stanzas(packages_file: Path) -> list[dict[str, str]]:
    stanzas = []
    for block in packages_file.read_text().strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line[:1] in (" ", "\t"):
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        stanzas.append(fields)
    return stanzas


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("labrepo")
    return stand_in_repo.build_stand_in_repo(base / "repo", key_dir=base / "key")


@pytest.mark.parametrize("which", ["cuda_repo", "toolkit_repo"])
def test_inrelease_verifies_with_the_lab_key(repo: dict, which: str) -> None:
    folder = repo[which]
    for keyring in (repo["public_key_gpg"], repo["root"] / "umprov-lab.gpg"):
        proc = subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(folder / "InRelease")],
            capture_output=True, text=True, check=False,
        )
        assert proc.returncode == 0, proc.stderr
    detached = subprocess.run(
        ["gpgv", "--keyring", str(repo["public_key_gpg"]),
         str(folder / "Release.gpg"), str(folder / "Release")],
        capture_output=True, text=True, check=False,
    )
    assert detached.returncode == 0, detached.stderr
    assert repo["public_key_text"].startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_tampered_release_fails_verification(repo: dict, tmp_path: Path) -> None:
    tampered = tmp_path / "InRelease"
    tampered.write_text(
        (repo["cuda_repo"] / "InRelease").read_text().replace("umprov-lab", "umprov-lbb", 1)
    )
    proc = subprocess.run(
        ["gpgv", "--keyring", str(repo["public_key_gpg"]), str(tampered)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode != 0


def test_release_hashes_match_the_indexes(repo: dict) -> None:
    import hashlib

    for which in ("cuda_repo", "toolkit_repo"):
        folder = repo[which]
        release = (folder / "Release").read_text()
        for name in ("Packages", "Packages.gz"):
            digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
            assert f" {digest} " in release, f"{which}: {name} hash not in Release"


def test_cuda_repo_lists_driver_packages_at_real_names_and_versions(repo: dict) -> None:
    stanzas = _stanzas(repo["cuda_repo"] / "Packages")
    versions: dict[str, set[str]] = {}
    for stanza in stanzas:
        versions.setdefault(stanza["Package"], set()).add(stanza["Version"])
        deb = repo["cuda_repo"] / stanza["Filename"]
        assert deb.is_file(), stanza["Filename"]
        assert deb.stat().st_size == int(stanza["Size"])
    for name in ("nvidia-driver-pinning-580", "nvidia-fabricmanager-580", "libnvidia-nscq-580"):
        assert name in versions, name
        assert all(v.startswith("580.") for v in versions[name])
    # Branch-neutral names carry every branch, as NVIDIA's repository does: 590 is newer.
    for name in ("nvidia-open", "cuda-drivers", "nvidia-persistenced", "nvidia-driver-cuda",
                 "nvidia-kernel-open-dkms", "nvidia-kernel-dkms"):
        assert {v.split(".")[0] for v in versions[name]} == {"580", "590"}, name
    assert versions["nvidia-fabricmanager-580"] == {
        v for v in versions["nvidia-open"] if v.startswith("580.")}
    assert versions["nvidia-driver-pinning-590"] == {"590.48.01-1"}


def test_pinning_package_keeps_the_branch(repo: dict) -> None:
    """The stand-in's apt preferences pin the branch-neutral names to the branch."""
    stanza = next(s for s in _stanzas(repo["cuda_repo"] / "Packages")
                  if s["Package"] == "nvidia-driver-pinning-580")
    deb = repo["cuda_repo"] / stanza["Filename"]
    listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(listing)) as tar:
        member = tar.extractfile("./etc/apt/preferences.d/nvidia-driver-pinning-580")
        text = member.read().decode() if member else ""
    assert "Pin: version 580.*" in text and "Pin-Priority: 1000" in text
    assert "nvidia-open" in text.split("Package:", 1)[1].splitlines()[0]


def test_toolkit_repo_lists_toolkit_packages(repo: dict) -> None:
    stanzas = _stanzas(repo["toolkit_repo"] / "Packages")
    names = {(s["Package"], s["Version"]) for s in stanzas}
    for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                 "libnvidia-container-tools", "libnvidia-container1"):
        assert (name, "1.17.8-1") in names, name


def test_stand_in_tools_behave_honestly(repo: dict, tmp_path: Path) -> None:
    cuda = repo["cuda_repo"]
    smi_deb = next(cuda.glob("nvidia-driver-cuda_580.95.05-1_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(smi_deb), str(tmp_path)], check=True)
    smi = subprocess.run([str(tmp_path / "usr/bin/nvidia-smi")],
                         capture_output=True, text=True, check=False)
    assert smi.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in smi.stdout

    base_deb = next(repo["toolkit_repo"].glob("nvidia-container-toolkit-base_1.17.8-1_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(base_deb), str(tmp_path)], check=True)
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-driver": "json-file", "runtimes": {"runsc": {"path": "runsc"}}}')
    ctk = str(tmp_path / "usr/bin/nvidia-ctk")
    subprocess.run(["python3", ctk, "runtime", "configure", "--runtime=docker",
                    f"--config={daemon}"], check=True, capture_output=True)
    import json

    merged = json.loads(daemon.read_text())
    assert merged["log-driver"] == "json-file"
    assert merged["runtimes"]["runsc"] == {"path": "runsc"}
    assert merged["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    if not Path("/proc/driver/nvidia/version").exists():
        cdi = subprocess.run(["python3", ctk, "cdi", "generate"],
                             capture_output=True, text=True, check=False)
        assert cdi.returncode != 0
        assert "NVML" in cdi.stderr


def test_role_variables_point_at_served_folders(repo: dict) -> None:
    variables = stand_in_repo.role_variables("http://lab-repo:8000/", repo)
    assert variables["nvidia_driver_cuda_repo_url"] == (
        "http://lab-repo:8000/compute/cuda/repos/debian12/x86_64/")
    assert variables["nvidia_container_toolkit_repo_url"].endswith(
        "/libnvidia-container/stable/deb/" + repo["arch"] + "/")
    assert variables["nvidia_driver_cuda_repo_key_url"] == "http://lab-repo:8000/umprov-lab.asc"


def test_rebuild_keeps_the_same_key(tmp_path: Path) -> None:
    first = stand_in_repo.build_stand_in_repo(tmp_path / "a", key_dir=tmp_path / "key",
                                              driver_versions=("580.95.05-1",),
                                              toolkit_versions=("1.17.8-1",))
    second = stand_in_repo.build_stand_in_repo(tmp_path / "a", key_dir=tmp_path / "key",
                                               driver_versions=("580.95.05-1",),
                                               toolkit_versions=("1.17.8-1",))
    assert first["fingerprint"] == second["fingerprint"]


def test_lab_inventory_names_the_folders_the_build_made(repo: dict) -> None:
    """One architecture everywhere: the URLs a lab inventory holds lead to signed folders."""
    from umprov_lab.inventory import lab_role_vars

    variables = lab_role_vars("t")
    base = stand_in_repo.repo_url("t") + "/"
    for key in ("nvidia_driver_cuda_repo_url", "nvidia_container_toolkit_repo_url"):
        assert variables[key].startswith(base), variables[key]
        assert (repo["root"] / variables[key].removeprefix(base) / "InRelease").is_file(), key
    assert variables["nvidia_driver_cuda_repo_key_url"] == base + "umprov-lab.asc"
    assert (repo["root"] / "umprov-lab.asc").is_file()


def test_lab_inventory_names_the_lab_keys_fingerprint_for_the_roles_check(
    repo: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roles check the downloaded key against its vendor's fingerprint by default; the lab's
    stand-in repository signs with its own key, whose fingerprint the lab inventory names."""
    from umprov_lab.inventory import lab_role_vars

    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path))
    assert "nvidia_driver_cuda_repo_key_fingerprints" not in lab_role_vars("t")  # not built yet
    (tmp_path / ".lab" / "t").mkdir(parents=True)
    (tmp_path / ".lab" / "t" / "repo-key").symlink_to(Path(repo["gnupghome"]).parent)
    variables = lab_role_vars("t")
    for name in ("nvidia_driver_cuda_repo_key_fingerprints",
                 "nvidia_container_toolkit_repo_key_fingerprints"):
        assert variables[name] == [repo["fingerprint"]], name
