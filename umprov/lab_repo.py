"""A signed apt repository that stands in for NVIDIA's CUDA and container-toolkit repositories.

The lab cannot reach NVIDIA's repositories, so it builds its own, on the control machine, with
the real package names and versions and honest contents: an ``nvidia-smi`` that says it cannot
reach a driver (as on a host without a GPU), an ``nvidia-ctk`` that really merges the runtime into
daemon.json, a ``nvidia-container-runtime`` that execs runc. The repositories are flat (suite
``/``), like NVIDIA's, and signed with a lab key (InRelease and Release.gpg), so the roles install
from them through the same variables and the same ``Signed-By`` path as in production.

Needs ``dpkg-deb`` and ``gpg`` on the control machine (Debian: dpkg, gnupg). The Packages and
Release indexes are written here, so apt-utils is not needed.

Layout under ``dest`` (serve ``dest`` over http, for example ``python3 -m http.server``)::

    compute/cuda/repos/debian12/x86_64/   Packages, Release, InRelease, Release.gpg, *.deb
    libnvidia-container/stable/deb/amd64/ the same, for the container toolkit
    umprov-lab.asc / umprov-lab.gpg       the lab's public key, armored and dearmored
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess  # noqa: S404 - the builder runs dpkg-deb and gpg on the control machine
import tempfile
import textwrap
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

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

_DEB_ARCH_TO_CUDA = {"amd64": "x86_64", "arm64": "sbsa"}


class LabRepoError(RuntimeError):
    """The stand-in repository could not be built (a tool is missing or failed)."""


@dataclass
class _Package:
    name: str
    version: str
    description: str
    arch: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    section: str = "multiverse/devel"
    # path inside the package -> (mode, content)
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    conffiles: list[str] = field(default_factory=list)


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)  # noqa: S603
    except FileNotFoundError as exc:
        raise LabRepoError(f"{argv[0]} is not installed on the control machine") from exc
    except subprocess.CalledProcessError as exc:
        raise LabRepoError(f"{' '.join(argv[:3])} failed: {exc.stderr.strip()}") from exc


# --------------------------------------------------------------------------- package contents

_SMI_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
_NVML_MESSAGE = (
    "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
    "cannot open shared object file: no such file or directory"
)

_NVIDIA_SMI = """\
#!/bin/sh
# umprov lab stand-in for nvidia-smi: there is no GPU and no kernel module on a lab host, and
# this prints what the real tool prints there, with the same exit code.
case "$1" in
  --version)
    echo "NVIDIA-SMI version  : {upstream} (umprov lab stand-in)"
    exit 0 ;;
esac
echo "{message}"
exit 9
"""

_NVIDIA_PERSISTENCED = """\
#!/bin/sh
# umprov lab stand-in for nvidia-persistenced: without a kernel module it fails, as the real one.
echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
logger -t nvidia-persistenced \\
  "no NVIDIA driver: /dev/nvidiactl is missing (umprov lab stand-in)" 2>/dev/null || true
exit 1
"""

_PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user root
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

_NVIDIA_MODPROBE = """\
#!/bin/sh
# umprov lab stand-in for nvidia-modprobe: it can only succeed where a driver is loaded.
if [ -r /proc/driver/nvidia/version ]; then
  exit 0
fi
echo "nvidia-modprobe: no NVIDIA kernel module is available (umprov lab stand-in)" >&2
exit 1
"""

_FABRICMANAGER = """\
#!/bin/sh
# umprov lab stand-in for nv-fabricmanager: there are no NVSwitch devices on a lab host.
echo "Fabric Manager {upstream} (umprov lab stand-in)"
echo "NVSwitch devices not found: no /proc/driver/nvidia-nvswitch/devices" >&2
exit 1
"""

_FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

_PINNING_PREFS = """\
# Keeps the NVIDIA driver packages on the {branch} branch (umprov lab stand-in for
# NVIDIA's nvidia-driver-pinning-{branch}).
Package: {packages}
Pin: version {branch}.*
Pin-Priority: 1000
"""

_KERNEL_README = """\
umprov lab stand-in for NVIDIA's {flavour} kernel module sources, driver {upstream}.
A lab host has no GPU and no headers for its kernel, so nothing is registered with DKMS and no
module is built; on a real host this package carries the module sources that DKMS builds.
"""

_NVIDIA_CTK = r'''#!/usr/bin/python3
"""umprov lab stand-in for nvidia-ctk {upstream}: the subcommands the roles and tests use.

runtime configure really edits the runtime's config (Docker: daemon.json, keeping every key);
cdi generate fails as the real one does without a driver (NVML cannot be loaded), and writes a
spec with no devices where a driver answers.
"""
import argparse
import json
import os
import sys

VERSION = "{upstream}"


def runtime_configure(args):
    if args.runtime != "docker":
        print(f"ERRO[0000] unsupported runtime {{args.runtime!r}} in the umprov lab stand-in",
              file=sys.stderr)
        return 1
    path = args.config or "/etc/docker/daemon.json"
    config = {{}}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
        if text:
            config = json.loads(text)
    runtimes = config.setdefault("runtimes", {{}})
    runtimes["nvidia"] = {{"args": [], "path": "nvidia-container-runtime"}}
    if args.set_as_default:
        config["default-runtime"] = "nvidia"
    if args.dry_run:
        print(json.dumps(config, indent=4))
        return 0
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".nvidia-ctk.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=4)
        fh.write("\n")
    os.replace(tmp, path)
    print(f"INFO[0000] Wrote updated config to {{path}}")
    print("INFO[0000] It is recommended that docker daemon be restarted.")
    return 0


def cdi_generate(args):
    if not os.path.exists("/proc/driver/nvidia/version"):
        print("ERRO[0000] failed to generate CDI spec: failed to create device CDI specs: "
              "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND", file=sys.stderr)
        return 1
    spec = (
        "---\n"
        "cdiVersion: 0.5.0\n"
        "kind: nvidia.com/gpu\n"
        "devices: []\n"
        "containerEdits: {{}}\n"
    )
    if args.output:
        os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(spec)
        print(f"INFO[0000] Generated CDI spec with version 0.5.0 to {{args.output}}")
    else:
        sys.stdout.write(spec)
    return 0


def cdi_list(_args):
    print("INFO[0000] Found 0 CDI devices")
    return 0


def dev_char_symlinks(_args):
    if not os.path.exists("/proc/driver/nvidia/version"):
        print("INFO[0000] No NVIDIA devices found; no /dev/char symlinks created")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nvidia-ctk")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--debug", "-d", action="store_true")
    sub = parser.add_subparsers(dest="command")

    runtime = sub.add_parser("runtime").add_subparsers(dest="action")
    configure = runtime.add_parser("configure")
    configure.add_argument("--runtime", default="docker")
    configure.add_argument("--config", default="")
    configure.add_argument("--set-as-default", action="store_true")
    configure.add_argument("--dry-run", action="store_true")
    configure.set_defaults(func=runtime_configure)

    cdi = sub.add_parser("cdi").add_subparsers(dest="action")
    generate = cdi.add_parser("generate")
    generate.add_argument("--output", default="")
    generate.add_argument("--format", default="yaml")
    generate.set_defaults(func=cdi_generate)
    cdi.add_parser("list").set_defaults(func=cdi_list)

    system = sub.add_parser("system").add_subparsers(dest="action")
    links = system.add_parser("create-dev-char-symlinks")
    links.add_argument("--create-all", action="store_true")
    links.set_defaults(func=dev_char_symlinks)

    args = parser.parse_args(argv)
    if args.version:
        print(f"NVIDIA Container Toolkit CLI version {{VERSION}} (umprov lab stand-in)")
        return 0
    func = getattr(args, "func", None)
    if func is None:
        parser.print_usage(sys.stderr)
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
'''

_CONTAINER_RUNTIME = """\
#!/bin/sh
# umprov lab stand-in for nvidia-container-runtime: with no GPU there is nothing to inject, so it
# is runc, as the real runtime is for a container that asks for no GPU.
exec runc "$@"
"""

_CONTAINER_RUNTIME_HOOK = """\
#!/bin/sh
# umprov lab stand-in for nvidia-container-runtime-hook: a container that requests no GPU
# passes through untouched; one that requests a GPU fails as it would without a driver.
case "${{NVIDIA_VISIBLE_DEVICES:-void}}" in
  void|none|"") exit 0 ;;
esac
echo "{message}" >&2
exit 1
"""

_CONTAINER_CLI = """\
#!/bin/sh
# umprov lab stand-in for nvidia-container-cli.
case "$1" in
  --version|-V) echo "cli-version: {upstream} (umprov lab stand-in)"; exit 0 ;;
esac
echo "{message}" >&2
exit 1
"""

_TOOLKIT_CONFIG = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
"""


def _driver_packages(version: str, branch: str, arch: str) -> list[_Package]:
    upstream = version.split("-", 1)[0]
    exact = f"(= {version})"
    doc = "/usr/share/doc/{}/README.umprov-lab"
    stand_in = "umprov lab stand-in for the package of the same name in NVIDIA's CUDA repository"
    pinned = ["nvidia-open", "cuda-drivers", "nvidia-driver-cuda", "nvidia-kernel-dkms",
              "nvidia-kernel-open-dkms", "nvidia-persistenced", "nvidia-modprobe",
              f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"]
    return [
        _Package(
            f"nvidia-driver-pinning-{branch}", version,
            f"Pins the NVIDIA driver to the {branch} branch\n {stand_in}.", "all",
            files={f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}":
                   (0o644, _PINNING_PREFS.format(branch=branch, packages=" ".join(pinned)))},
            conffiles=[f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}"],
        ),
        _Package(
            "nvidia-driver-cuda", version,
            f"NVIDIA driver CUDA integration components\n {stand_in}.", arch,
            files={"/usr/bin/nvidia-smi":
                   (0o755, _NVIDIA_SMI.format(upstream=upstream, message=_SMI_MESSAGE))},
        ),
        _Package(
            "nvidia-persistenced", version,
            f"NVIDIA Persistence Daemon\n {stand_in}.", arch,
            files={
                "/usr/bin/nvidia-persistenced": (0o755, _NVIDIA_PERSISTENCED),
                "/lib/systemd/system/nvidia-persistenced.service": (0o644, _PERSISTENCED_UNIT),
            },
        ),
        _Package(
            "nvidia-modprobe", version,
            f"Load the NVIDIA kernel driver and create device files\n {stand_in}.", arch,
            files={"/usr/bin/nvidia-modprobe": (0o755, _NVIDIA_MODPROBE)},
        ),
        _Package(
            "nvidia-kernel-open-dkms", version,
            f"NVIDIA open kernel module sources (DKMS)\n {stand_in}.", arch,
            conflicts=["nvidia-kernel-dkms"], provides=["nvidia-kernel-dkms-any"],
            files={doc.format("nvidia-kernel-open-dkms"):
                   (0o644, _KERNEL_README.format(flavour="open", upstream=upstream))},
        ),
        _Package(
            "nvidia-kernel-dkms", version,
            f"NVIDIA proprietary kernel module sources (DKMS)\n {stand_in}.", arch,
            conflicts=["nvidia-kernel-open-dkms"], provides=["nvidia-kernel-dkms-any"],
            files={doc.format("nvidia-kernel-dkms"):
                   (0o644, _KERNEL_README.format(flavour="proprietary", upstream=upstream))},
        ),
        _Package(
            "nvidia-open", version,
            f"NVIDIA driver with open kernel modules (meta package)\n {stand_in}.", arch,
            depends=[f"nvidia-kernel-open-dkms {exact}", f"nvidia-driver-cuda {exact}",
                     f"nvidia-persistenced {exact}", f"nvidia-modprobe {exact}"],
            files={doc.format("nvidia-open"): (0o644, f"{stand_in}.\n")},
        ),
        _Package(
            "cuda-drivers", version,
            f"NVIDIA driver with proprietary kernel modules (meta package)\n {stand_in}.", arch,
            depends=[f"nvidia-kernel-dkms {exact}", f"nvidia-driver-cuda {exact}",
                     f"nvidia-persistenced {exact}", f"nvidia-modprobe {exact}"],
            files={doc.format("cuda-drivers"): (0o644, f"{stand_in}.\n")},
        ),
        _Package(
            f"libnvidia-nscq-{branch}", version,
            f"NVSwitch Configuration and Query library\n {stand_in}.", arch,
            files={doc.format(f"libnvidia-nscq-{branch}"): (0o644, f"{stand_in}.\n")},
        ),
        _Package(
            f"nvidia-fabricmanager-{branch}", version,
            f"Fabric Manager for NVSwitch based systems\n {stand_in}.", arch,
            depends=[f"libnvidia-nscq-{branch} {exact}"],
            files={
                "/usr/bin/nv-fabricmanager": (0o755, _FABRICMANAGER.format(upstream=upstream)),
                "/lib/systemd/system/nvidia-fabricmanager.service": (0o644, _FABRICMANAGER_UNIT),
            },
        ),
    ]


def _toolkit_packages(version: str, arch: str) -> list[_Package]:
    upstream = version.split("-", 1)[0]
    stand_in = ("umprov lab stand-in for the package of the same name in NVIDIA's "
                "libnvidia-container repository")
    return [
        _Package(
            "libnvidia-container1", version,
            f"NVIDIA container runtime library\n {stand_in}.", arch, section="libs",
            files={"/usr/share/doc/libnvidia-container1/README.umprov-lab":
                   (0o644, f"{stand_in}; it ships no library.\n")},
        ),
        _Package(
            "libnvidia-container-tools", version,
            f"NVIDIA container runtime library (command-line tools)\n {stand_in}.", arch,
            section="utils", depends=[f"libnvidia-container1 (>= {version})"],
            files={"/usr/bin/nvidia-container-cli":
                   (0o755, _CONTAINER_CLI.format(upstream=upstream, message=_NVML_MESSAGE))},
        ),
        _Package(
            "nvidia-container-toolkit-base", version,
            f"NVIDIA Container Toolkit Base\n {stand_in}.", arch, section="utils",
            files={
                "/usr/bin/nvidia-ctk": (0o755, _NVIDIA_CTK.format(upstream=upstream)),
                "/usr/bin/nvidia-container-runtime": (0o755, _CONTAINER_RUNTIME),
                "/etc/nvidia-container-runtime/config.toml": (0o644, _TOOLKIT_CONFIG),
            },
            conffiles=["/etc/nvidia-container-runtime/config.toml"],
        ),
        _Package(
            "nvidia-container-toolkit", version,
            f"NVIDIA Container toolkit\n {stand_in}.", arch, section="utils",
            depends=[f"nvidia-container-toolkit-base (= {version})",
                     f"libnvidia-container-tools (>= {version})",
                     "libnvidia-container-tools (<< 2.0.0)"],
            files={"/usr/bin/nvidia-container-runtime-hook":
                   (0o755, _CONTAINER_RUNTIME_HOOK.format(message=_NVML_MESSAGE))},
        ),
    ]


# --------------------------------------------------------------------------- building

def _control_text(pkg: _Package, installed_kib: int) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {pkg.arch}",
        "Maintainer: umprov lab <lab-repo@umprov.invalid>",
        f"Installed-Size: {installed_kib}",
    ]
    if pkg.depends:
        lines.append(f"Depends: {', '.join(pkg.depends)}")
    if pkg.conflicts:
        lines.append(f"Conflicts: {', '.join(pkg.conflicts)}")
    if pkg.provides:
        lines.append(f"Provides: {', '.join(pkg.provides)}")
    lines += [f"Section: {pkg.section}", "Priority: optional"]
    summary, _, body = pkg.description.partition("\n")
    lines.append(f"Description: {summary}")
    if body:
        lines.append(body.rstrip())
    return "\n".join(lines) + "\n"


def _build_deb(pkg: _Package, out_dir: Path, work: Path) -> Path:
    root = work / f"{pkg.name}_{pkg.version}"
    if root.exists():
        shutil.rmtree(root)
    (root / "DEBIAN").mkdir(parents=True)
    size = 0
    for rel, (mode, content) in pkg.files.items():
        target = root / rel.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        target.chmod(mode)
        size += len(content.encode())
    (root / "DEBIAN" / "control").write_text(
        _control_text(pkg, max(1, (size + 1023) // 1024)), encoding="utf-8")
    if pkg.conffiles:
        (root / "DEBIAN" / "conffiles").write_text("\n".join(pkg.conffiles) + "\n")
    for path in root.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    deb = out_dir / f"{pkg.name}_{pkg.version}_{pkg.arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
    return deb


def _digests(data: bytes) -> dict[str, str]:
    return {
        "MD5Sum": hashlib.md5(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA256": hashlib.sha256(data).hexdigest(),
        "SHA512": hashlib.sha512(data).hexdigest(),
    }


def _write_indexes(repo: Path, debs: list[tuple[_Package, Path]], label: str, arch: str) -> None:
    stanzas = []
    for _pkg, deb in sorted(debs, key=lambda item: (item[0].name, item[0].version)):
        control = _run(["dpkg-deb", "--field", str(deb)]).stdout.rstrip("\n")
        data = deb.read_bytes()
        sums = _digests(data)
        extra = [
            f"Filename: ./{deb.name}",
            f"Size: {len(data)}",
            f"MD5sum: {sums['MD5Sum']}",
            f"SHA1: {sums['SHA1']}",
            f"SHA256: {sums['SHA256']}",
            f"SHA512: {sums['SHA512']}",
        ]
        # apt accepts the fields in any order: the file fields follow the control fields.
        stanzas.append(control + "\n" + "\n".join(extra) + "\n")
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    packages_gz = gzip.compress(packages, mtime=0)
    (repo / "Packages.gz").write_bytes(packages_gz)

    index_files = {"Packages": packages, "Packages.gz": packages_gz}
    release = [
        "Origin: umprov-lab",
        f"Label: {label}",
        "Acquire-By-Hash: no",
        f"Architectures: {arch} all",
        f"Date: {formatdate(usegmt=True)}",
    ]
    for algo in ("MD5Sum", "SHA1", "SHA256", "SHA512"):
        release.append(f"{algo}:")
        for name, data in index_files.items():
            release.append(f" {_digests(data)[algo]} {len(data):>16} {name}")
    (repo / "Release").write_text("\n".join(release) + "\n", encoding="utf-8")


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return _run(["gpg", "--batch", "--no-tty", "--homedir", str(home), *args], **kwargs)


def _ensure_key(key_dir: Path) -> tuple[Path, str]:
    """Create (once) the lab's signing key in a private GNUPGHOME; return it and the fingerprint."""
    home = key_dir / "gnupg"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    proc = subprocess.run(  # noqa: S603
        ["gpg", "--batch", "--no-tty", "--homedir", str(home), "--with-colons",  # noqa: S607
         "--list-secret-keys", KEY_UID],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        _gpg(home, "--pinentry-mode", "loopback", "--passphrase", "",
             "--quick-generate-key", KEY_UID, "rsa3072", "sign", "never")
        proc = _gpg(home, "--with-colons", "--list-secret-keys", KEY_UID)
    fingerprint = next(
        line.split(":")[9] for line in proc.stdout.splitlines() if line.startswith("fpr:")
    )
    return home, fingerprint


def _sign(home: Path, fingerprint: str, repo: Path) -> None:
    release = repo / "Release"
    for name in ("InRelease", "Release.gpg"):
        (repo / name).unlink(missing_ok=True)
    common = ["--pinentry-mode", "loopback", "--passphrase", "", "--local-user", fingerprint,
              "--digest-algo", "SHA512"]
    _gpg(home, *common, "--clearsign", "--output", str(repo / "InRelease"), str(release))
    _gpg(home, *common, "--armor", "--detach-sign", "--output", str(repo / "Release.gpg"),
         str(release))


def build_stand_in_repo(
    dest: Path,
    *,
    key_dir: Path,
    arch: str | None = None,
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
    - ``packages``: ``{repository name: {package: [versions]}}``
    """
    for tool in ("dpkg-deb", "gpg"):
        if shutil.which(tool) is None:
            raise LabRepoError(f"{tool} is not installed on the control machine")
    dest = Path(dest).resolve()
    key_dir = Path(key_dir).resolve()
    key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if arch is None:
        arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    cuda_arch = _DEB_ARCH_TO_CUDA.get(arch, arch)

    home, fingerprint = _ensure_key(key_dir)
    try:
        asc = key_dir / f"{KEY_NAME}.asc"
        gpg_bin = key_dir / f"{KEY_NAME}.gpg"
        _gpg(home, "--yes", "--armor", "--output", str(asc), "--export", fingerprint)
        _gpg(home, "--yes", "--output", str(gpg_bin), "--export", fingerprint)

        dest.mkdir(parents=True, exist_ok=True)
        repos: dict[str, tuple[Path, list[_Package], str]] = {}
        driver_pkgs = [p for v in driver_versions for p in _driver_packages(v, driver_branch, arch)]
        if driver_branch != NEWER_DRIVER_BRANCH:
            driver_pkgs += [p for v in NEWER_DRIVER_VERSIONS
                            for p in _driver_packages(v, NEWER_DRIVER_BRANCH, arch)]
        cuda_repos: dict[str, Path] = {}
        for distro in cuda_distros:
            folder = dest / "compute" / "cuda" / "repos" / distro / cuda_arch
            cuda_repos[distro] = folder
            repos[f"cuda-{distro}"] = (
                folder, driver_pkgs, f"umprov lab stand-in for NVIDIA CUDA {distro}")
        toolkit = dest / "libnvidia-container" / "stable" / "deb" / arch
        repos["libnvidia-container"] = (
            toolkit, [p for v in toolkit_versions for p in _toolkit_packages(v, arch)],
            "umprov lab stand-in for NVIDIA libnvidia-container")

        listing: dict[str, dict[str, list[str]]] = {}
        with tempfile.TemporaryDirectory(prefix="umprov-lab-repo-") as tmp:
            work = Path(tmp)
            for name, (folder, pkgs, label) in repos.items():
                if folder.exists():
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
                built = [(pkg, _build_deb(pkg, folder, work)) for pkg in pkgs]
                _write_indexes(folder, built, label, arch)
                _sign(home, fingerprint, folder)
                shutil.copyfile(asc, folder / f"{KEY_NAME}.asc")
                listing[name] = {}
                for pkg in pkgs:
                    listing[name].setdefault(pkg.name, []).append(pkg.version)
        shutil.copyfile(asc, dest / f"{KEY_NAME}.asc")
        shutil.copyfile(gpg_bin, dest / f"{KEY_NAME}.gpg")
    finally:
        subprocess.run(  # noqa: S603
            ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],  # noqa: S607
            capture_output=True, check=False,
        )

    first = next(iter(cuda_repos.values()))
    return {
        "root": dest,
        "cuda_repos": cuda_repos,
        "cuda_repo": first,
        "toolkit_repo": toolkit,
        "relative_urls": {
            "cuda_repo": first.relative_to(dest).as_posix() + "/",
            "toolkit_repo": toolkit.relative_to(dest).as_posix() + "/",
            "public_key_asc": f"{KEY_NAME}.asc",
            "public_key_gpg": f"{KEY_NAME}.gpg",
        },
        "public_key_asc": asc,
        "public_key_gpg": gpg_bin,
        "public_key_text": asc.read_text(encoding="ascii"),
        "fingerprint": fingerprint,
        "gnupghome": home,
        "arch": arch,
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


def _main() -> None:  # pragma: no cover - a convenience for building the repo by hand
    import argparse
    import json

    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n")[0])
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
