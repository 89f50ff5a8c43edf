"""A signed apt repository that stands in for NVIDIA's CUDA and container-toolkit repositories.

The lab cannot reach NVIDIA's repositories, so it builds its own, on the control machine, with
the real package names and versions and honest contents: an ``nvidia-smi`` that says it cannot
reach a driver (as on a host without a GPU), an ``nvidia-ctk`` that really merges the runtime into
daemon.json, a ``nvidia-container-runtime`` that execs runc. What each package holds is in
``repo/`` (``packages.toml`` and the files it names). The repositories are flat (suite ``/``),
like NVIDIA's, and signed with a lab key (InRelease and Release.gpg), so the roles install
from them through the same variables and the same ``Signed-By`` path as in production.

Layout under ``dest``, which a container of the lab serves over http (``ensure_repo``)::

    compute/cuda/repos/debian12/x86_64/   Packages, Release, InRelease, Release.gpg, *.deb
    libnvidia-container/stable/deb/amd64/ the same, for the container toolkit
    umprov-lab.asc / umprov-lab.gpg       the lab's public key, armored and dearmored

(the folder names follow the architecture: ``sbsa`` and ``arm64`` on aarch64).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess  # noqa: S404 - gpg on the control machine
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from umprov_lab import apt_repo, data
from umprov_lab.apt_repo import Package
from umprov_lab.arch import Arch, host_arch
from umprov_lab.layout import LABEL, Progress, container_name, lab_dir, network_name, quiet

DRIVER_BRANCH = "580"
DRIVER_VERSIONS = ("580.82.07-1", "580.95.05-1")
# As in NVIDIA's repository, a newer branch beside the wanted one: apt's candidate for
# nvidia-open is that branch until the host installs nvidia-driver-pinning-580.
NEWER_DRIVER_BRANCH = "590"
NEWER_DRIVER_VERSIONS = ("590.48.01-1",)
TOOLKIT_VERSIONS = ("1.17.7-1", "1.17.8-1")
CUDA_DISTROS = ("debian12",)
KEY_UID = "umprov lab repository signing key <lab-repo@umprov.invalid>"
KEY_NAME = "umprov-lab"
REPO_PORT = 8080


@functools.cache
def _manifest() -> dict[str, Any]:
    return tomllib.loads(data.read("repo/packages.toml"))


def stand_in_packages(repo: str, version: str, arch: str, **values: str) -> list[Package]:
    """The packages of ``repo`` (a table of packages.toml) at ``version``, for ``arch``."""
    spec = _manifest()[repo]
    values = {"VERSION": version, "UPSTREAM": version.split("-", 1)[0],
              "STAND_IN": spec["stand_in"], **values}

    def fill(text: str) -> str:
        return data.fill(text, values, f"repo/packages.toml [{repo}]")

    packages = []
    for entry in spec["packages"]:
        files: dict[str, tuple[int, str]] = {}
        conffiles: list[str] = []
        for item in entry["files"]:
            path = fill(item["path"])
            if "source" in item:
                content = data.render(f"repo/{item['source']}", **values, **item.get("with", {}))
            else:
                content = fill(item["text"])
            files[path] = (item.get("mode", 0o644), content)
            if item.get("conffile"):
                conffiles.append(path)
        packages.append(Package(
            name=fill(entry["name"]),
            version=version,
            description=f"{fill(entry['summary'])}\n {spec['stand_in']}.",
            arch=entry.get("architecture", arch),
            depends=[fill(d) for d in entry.get("depends", [])],
            conflicts=entry.get("conflicts", []),
            provides=entry.get("provides", []),
            section=entry.get("section", spec["section"]),
            files=files,
            conffiles=conffiles,
        ))
    return packages


def _driver_packages(versions: tuple[str, ...], branch: str, arch: str) -> list[Package]:
    return [p for v in versions for p in stand_in_packages("cuda", v, arch, BRANCH=branch)]


def relative_urls(arch: Arch, distro: str = CUDA_DISTROS[0]) -> dict[str, str]:
    """Where the repositories and the key lie under the served folder."""
    return {
        "cuda_repo": f"compute/cuda/repos/{distro}/{arch.cuda}/",
        "toolkit_repo": f"libnvidia-container/stable/deb/{arch.debian}/",
        "public_key_asc": f"{KEY_NAME}.asc",
        "public_key_gpg": f"{KEY_NAME}.gpg",
    }


def _repositories(
    dest: Path,
    arch: Arch,
    driver_branch: str,
    driver_versions: tuple[str, ...],
    toolkit_versions: tuple[str, ...],
    cuda_distros: tuple[str, ...],
) -> dict[str, tuple[Path, list[Package], str]]:
    """What to build: repository name -> (folder, packages, Release label)."""
    manifest = _manifest()
    driver_pkgs = _driver_packages(driver_versions, driver_branch, arch.debian)
    if driver_branch != NEWER_DRIVER_BRANCH:
        driver_pkgs += _driver_packages(NEWER_DRIVER_VERSIONS, NEWER_DRIVER_BRANCH, arch.debian)
    repos: dict[str, tuple[Path, list[Package], str]] = {}
    for distro in cuda_distros:
        label = data.fill(manifest["cuda"]["label"], {"DISTRO": distro}, "repo/packages.toml")
        repos[f"cuda-{distro}"] = (dest / relative_urls(arch, distro)["cuda_repo"], driver_pkgs,
                                   label)
    toolkit_pkgs = [p for v in toolkit_versions
                    for p in stand_in_packages("libnvidia-container", v, arch.debian)]
    repos["libnvidia-container"] = (dest / relative_urls(arch)["toolkit_repo"], toolkit_pkgs,
                                    manifest["libnvidia-container"]["label"])
    return repos


def build_stand_in_repo(
    dest: Path,
    *,
    key_dir: Path,
    arch: Arch | None = None,
    driver_branch: str = DRIVER_BRANCH,
    driver_versions: tuple[str, ...] = DRIVER_VERSIONS,
    toolkit_versions: tuple[str, ...] = TOOLKIT_VERSIONS,
    cuda_distros: tuple[str, ...] = CUDA_DISTROS,
) -> dict:
    """Build the signed stand-in repositories under ``dest``; the signing key lives in ``key_dir``.

    Returns a dict with the folders to serve and the public key:

    - ``root``: ``dest`` (serve it over http)
    - ``cuda_repos``: ``{distro: folder}``, each a flat repository (suite ``/``) for
      ``nvidia_driver_cuda_repo_url``; ``cuda_repo``: the first of them
    - ``toolkit_repo``: flat repository for ``nvidia_container_toolkit_repo_url``
    - ``relative_urls``: the same folders relative to ``root`` (append to the http base URL)
    - ``public_key_asc`` / ``public_key_gpg``: the key, ASCII-armored and dearmored
      (both also copied into ``root``), ``public_key_text``: the armored key itself,
      ``fingerprint``
    - ``arch``: the Debian architecture built for
    - ``packages``: ``{repository name: {package: [versions]}}``
    """
    apt_repo.require_tools()
    arch = arch or host_arch()
    dest = Path(dest).resolve()
    key_dir = Path(key_dir).resolve()
    key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    repos = _repositories(dest, arch, driver_branch, driver_versions, toolkit_versions,
                          cuda_distros)
    cuda_repos = {distro: repos[f"cuda-{distro}"][0] for distro in cuda_distros}
    toolkit = repos["libnvidia-container"][0]

    home, fingerprint = apt_repo.ensure_signing_key(key_dir, KEY_UID)
    try:
        asc = key_dir / f"{KEY_NAME}.asc"
        gpg_bin = key_dir / f"{KEY_NAME}.gpg"
        apt_repo.gpg(home, "--yes", "--armor", "--output", str(asc), "--export", fingerprint)
        apt_repo.gpg(home, "--yes", "--output", str(gpg_bin), "--export", fingerprint)
        dest.mkdir(parents=True, exist_ok=True)
        listing: dict[str, dict[str, list[str]]] = {}
        with tempfile.TemporaryDirectory(prefix="umprov-lab-repo-") as tmp:
            for name, (folder, pkgs, repo_label) in repos.items():
                apt_repo.build_repo(folder, pkgs, label=repo_label, arch=arch.debian,
                                    work=Path(tmp), home=home, fingerprint=fingerprint)
                shutil.copyfile(asc, folder / f"{KEY_NAME}.asc")
                listing[name] = {}
                for pkg in pkgs:
                    listing[name].setdefault(pkg.name, []).append(pkg.version)
        shutil.copyfile(asc, dest / f"{KEY_NAME}.asc")
        shutil.copyfile(gpg_bin, dest / f"{KEY_NAME}.gpg")
    finally:
        apt_repo.stop_agent(home)

    first = next(iter(cuda_repos.values()))
    return {
        "root": dest,
        "cuda_repos": cuda_repos,
        "cuda_repo": first,
        "toolkit_repo": toolkit,
        "relative_urls": relative_urls(arch, cuda_distros[0]),
        "public_key_asc": asc,
        "public_key_gpg": gpg_bin,
        "public_key_text": asc.read_text(encoding="ascii"),
        "fingerprint": fingerprint,
        "gnupghome": home,
        "arch": arch.debian,
        "packages": listing,
    }


def role_variables(base_url: str, repo: dict) -> dict[str, str]:
    """The role variables that point the roles at a served stand-in repository.

    ``base_url`` is where ``repo["root"]`` is served, e.g. ``http://lab-repo:8000``.
    """
    base = base_url.rstrip("/") + "/"
    urls = repo["relative_urls"]
    return {
        "nvidia_driver_cuda_repo_url": base + urls["cuda_repo"],
        "nvidia_driver_cuda_repo_key_url": base + urls["public_key_asc"],
        "nvidia_container_toolkit_repo_url": base + urls["toolkit_repo"],
        "nvidia_container_toolkit_repo_key_url": base + urls["public_key_asc"],
    }


# ---------------------------------------------------------------------------------------------
# Serving it to a lab


def signing_fingerprint(name: str) -> str | None:
    """The fingerprint of the key a lab's stand-in repository is signed with, which the roles
    check the downloaded key against; None before the repository was first built."""
    home = lab_dir(name) / "repo-key" / "gnupg"
    if not home.is_dir():
        return None
    proc = subprocess.run(  # noqa: S603 - public keys only: no agent is started
        ["gpg", "--batch", "--no-tty", "--homedir", str(home), "--with-colons",  # noqa: S607
         "--list-keys", KEY_UID],
        capture_output=True, text=True, check=False,
    )
    fprs = [ln.split(":")[9] for ln in proc.stdout.splitlines() if ln.startswith("fpr:")]
    return fprs[0] if proc.returncode == 0 and fprs else None


def repo_url(name: str) -> str:
    return f"http://{container_name(name, 'repo')}:{REPO_PORT}"


def _recipe_stamp() -> str:
    """Changes with the builder or anything a package holds: then the repository is rebuilt."""
    code = b"".join(Path(m.__file__).read_bytes() for m in (apt_repo, data))
    this = Path(__file__).read_bytes()
    return hashlib.sha256(code + this + data.digest("repo").encode()).hexdigest()[:16]


def ensure_repo(client: Any, name: str, image: str, progress: Progress = quiet) -> list[str]:
    """Build the signed stand-in repository (once per recipe) and serve it on the lab network."""
    from docker.errors import NotFound

    changes: list[str] = []
    directory = lab_dir(name)
    root = directory / "repo"
    stamp = directory / "repo.stamp"
    if not stamp.exists() or stamp.read_text() != _recipe_stamp():
        progress("building the lab's signed stand-in apt repository")
        build_stand_in_repo(root, key_dir=directory / "repo-key")
        stamp.write_text(_recipe_stamp())
        changes.append("built the stand-in apt repository")
    server = container_name(name, "repo")
    try:
        container = client.containers.get(server)
        if container.status != "running":
            container.start()
            changes.append(f"started {server}")
    except NotFound:
        progress(f"serving the repository from {server}")
        client.containers.run(
            image,
            ["python3", "-m", "http.server", str(REPO_PORT), "--directory", "/srv/repo"],
            name=server,
            hostname=server,
            detach=True,
            network=network_name(name),
            labels={LABEL: name, f"{LABEL}.role": "repo"},
            volumes={str(root): {"bind": "/srv/repo", "mode": "ro"}},
            restart_policy={"Name": "always"},
            user="nobody",
        )
        changes.append(f"created {server}")
    return changes


def _main() -> None:  # pragma: no cover - a convenience for building the repo by hand
    import argparse
    import json

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--key-dir", type=Path, required=True)
    parser.add_argument("--base-url", default="")
    args = parser.parse_args()
    result = build_stand_in_repo(args.dest, key_dir=args.key_dir)
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.items()
           if k not in ("public_key_text", "cuda_repos")}
    if args.base_url:
        out["role_variables"] = role_variables(args.base_url, result)
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":  # pragma: no cover
    os.umask(0o022)
    _main()
