"""A flat apt repository (suite ``/``), signed: .deb files, Packages, Release, InRelease.

Needs ``dpkg-deb`` and ``gpg`` on the control machine (Debian: dpkg, gnupg). The Packages and
Release indexes are written here, so apt-utils is not needed. The signing key lives in a
private GNUPGHOME made once and kept, so a rebuilt repository keeps its key.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess  # noqa: S404 - the builder runs dpkg-deb and gpg on the control machine
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

from umprov.errors import EnvironmentProblem

MAINTAINER = "umprov lab <lab-repo@umprov.invalid>"


@dataclass
class Package:
    name: str
    version: str
    description: str  # the summary line, then the long description
    arch: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    section: str = "misc"
    # path inside the package -> (mode, content)
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    conffiles: list[str] = field(default_factory=list)


def _cannot(detail: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"cannot build the lab repository: {detail}")


def require_tools() -> None:
    for tool in ("dpkg-deb", "gpg"):
        if shutil.which(tool) is None:
            raise _cannot(f"{tool} is not installed on the control machine")


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)  # noqa: S603
    except FileNotFoundError:
        raise _cannot(f"{argv[0]} is not installed on the control machine") from None
    except subprocess.CalledProcessError as exc:
        raise _cannot(f"{' '.join(argv[:3])} failed: {exc.stderr.strip()}") from None


def _control_text(pkg: Package, installed_kib: int) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {pkg.arch}",
        f"Maintainer: {MAINTAINER}",
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


def build_deb(pkg: Package, out_dir: Path, work: Path) -> Path:
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
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
    return deb


def _digests(data: bytes) -> dict[str, str]:
    return {
        "MD5Sum": hashlib.md5(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA256": hashlib.sha256(data).hexdigest(),
        "SHA512": hashlib.sha512(data).hexdigest(),
    }


def write_indexes(repo: Path, debs: list[tuple[Package, Path]], label: str, arch: str) -> None:
    stanzas = []
    for _pkg, deb in sorted(debs, key=lambda item: (item[0].name, item[0].version)):
        control = run(["dpkg-deb", "--field", str(deb)]).stdout.rstrip("\n")
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


def gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run(["gpg", "--batch", "--no-tty", "--homedir", str(home), *args], **kwargs)


def ensure_signing_key(key_dir: Path, uid: str) -> tuple[Path, str]:
    """Create (once) a signing key in a private GNUPGHOME; return that home and the fingerprint."""
    home = key_dir / "gnupg"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    proc = subprocess.run(  # noqa: S603
        ["gpg", "--batch", "--no-tty", "--homedir", str(home), "--with-colons",  # noqa: S607
         "--list-secret-keys", uid],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        gpg(home, "--pinentry-mode", "loopback", "--passphrase", "",
            "--quick-generate-key", uid, "rsa3072", "sign", "never")
        proc = gpg(home, "--with-colons", "--list-secret-keys", uid)
    fingerprint = next(
        line.split(":")[9] for line in proc.stdout.splitlines() if line.startswith("fpr:")
    )
    return home, fingerprint


def sign(home: Path, fingerprint: str, repo: Path) -> None:
    release = repo / "Release"
    for name in ("InRelease", "Release.gpg"):
        (repo / name).unlink(missing_ok=True)
    common = ["--pinentry-mode", "loopback", "--passphrase", "", "--local-user", fingerprint,
              "--digest-algo", "SHA512"]
    gpg(home, *common, "--clearsign", "--output", str(repo / "InRelease"), str(release))
    gpg(home, *common, "--armor", "--detach-sign", "--output", str(repo / "Release.gpg"),
        str(release))


def stop_agent(home: Path) -> None:
    """gpg leaves an agent running for its home; the lab's is not needed after a build."""
    subprocess.run(  # noqa: S603
        ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],  # noqa: S607
        capture_output=True, check=False,
    )


def build_repo(folder: Path, packages: list[Package], *, label: str, arch: str, work: Path,
               home: Path, fingerprint: str) -> None:
    """A fresh, signed flat repository in ``folder`` holding ``packages``."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    built = [(pkg, build_deb(pkg, folder, work)) for pkg in packages]
    write_indexes(folder, built, label, arch)
    sign(home, fingerprint, folder)
