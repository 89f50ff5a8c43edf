"""Where umprov finds its project files and keeps its state."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from umprov.errors import EnvironmentProblem

PACKAGE_DIR = Path(__file__).resolve().parent
# Where a wheel carries the repository's ansible.cfg, playbooks/, roles/ and docker/ (setup.py).
CONTENT = "_content"

# A name umprov files something under (a host's token, ssh_config, connection record) and writes
# into ssh_config and known_hosts as part of an alias: a letter or digit, then letters, digits,
# ".", "_" or "-". So it cannot leave its folder ("../x", "a/b"), hide (".x"), or carry a space,
# a quote, a glob, a newline or a ":" (ProxyJump's port) into a config line.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", re.ASCII)


def project_dir() -> Path:
    """The folder whose inventory/ holds the inventories named by name (``hosts``,
    ``lab/demo``) and whose .lab/ keeps the lab's files.

    UMPROV_PROJECT_DIR wins; then the nearest directory from the working directory up that
    holds both ansible.cfg and playbooks/; then the checkout umprov was installed from (an
    editable install); else umprov's state folder, never the installed package's own.
    """
    env = os.environ.get("UMPROV_PROJECT_DIR")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "ansible.cfg").is_file() and (candidate / "playbooks").is_dir():
            return candidate
    if _holds_content(PACKAGE_DIR.parent):
        return PACKAGE_DIR.parent
    return state_dir()


def content_dir() -> Path:
    """The folder holding ansible.cfg, playbooks/, roles/ and docker/pytorch-cuda/: the one
    UMPROV_PROJECT_DIR names when it has a playbooks/site.yml (asked for by name); else the
    project's own when it has umprov's (a clone or a fork: an unrelated Ansible repository
    found from the working directory does not count); else those installed with umprov (a
    wheel's umprov/_content/, or the checkout of an editable install).

    EnvironmentProblem, naming where it looked, when none has them.
    """
    named = os.environ.get("UMPROV_PROJECT_DIR")
    if named and (Path(named) / "playbooks" / "site.yml").is_file():
        return Path(named).resolve()
    candidates = (project_dir(), PACKAGE_DIR / CONTENT, PACKAGE_DIR.parent)
    for candidate in candidates:
        if _holds_content(candidate):
            return candidate
    raise EnvironmentProblem(
        f"umprov's playbooks and roles are missing (looked in {PACKAGE_DIR / CONTENT} and "
        f"{PACKAGE_DIR.parent}): reinstall umprov from its wheel or sdist, or run it in a clone"
    )


def content_file(*parts: str) -> Path:
    """A file umprov reads at run time (content_dir()/PARTS); EnvironmentProblem naming it
    when the installation lacks it, so that nothing is skipped in silence."""
    path = content_dir().joinpath(*parts)
    if not path.exists():
        raise EnvironmentProblem(f"{path}: missing from umprov's installation; reinstall umprov")
    return path


def content_module(name: str, *parts: str) -> ModuleType:
    """A Python file of umprov's content (content_dir()/PARTS: a role's module, the image's
    managed-memory rules) loaded as module ``name``, so that umprov and the hosts run one
    copy of the same rules; EnvironmentProblem where it cannot be."""
    import importlib.util

    path = content_file(*parts)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EnvironmentProblem(f"{path}: cannot be loaded; reinstall umprov")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _holds_content(folder: Path) -> bool:
    """umprov's playbooks and roles (a fork's too), not just any Ansible project's."""
    return ((folder / "playbooks" / "site.yml").is_file()
            and (folder / "roles" / "gpu_preflight").is_dir())


_PRIVATE_MADE: set[Path] = set()  # state folders made private in this process


def state_dir() -> Path:
    """Private per-user state: container known_hosts, Jupyter tokens, logs, run artifacts."""
    env = os.environ.get("UMPROV_STATE_DIR")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = Path(xdg) / "umprov"
    if base not in _PRIVATE_MADE or not base.is_dir():  # one stat a call once it was made
        private_dir(base)
        _PRIVATE_MADE.add(base)
    return base


def safe_name(name: str, what: str = "name") -> str:
    """``name`` itself when it can be a file name in one of umprov's folders (and part of an
    SSH alias); ValueError naming it otherwise. Never mapped: two hosts never share a file."""
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r:.80} cannot name umprov's files: use letters, digits, '.', '_' or "
            "'-' (starting with a letter or digit, 200 at most; ansible_host holds the address)"
        )
    return name


def state_file(folder: str, name: str, suffix: str) -> Path:
    """state_dir()/FOLDER/NAME+SUFFIX for a host's ``name`` (safe_name), always inside FOLDER."""
    return state_dir() / folder / f"{safe_name(name, 'host name')}{suffix}"


def private_dir(path: Path) -> Path:
    """A directory only its owner can enter: created 0700, group and other bits taken away."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        path.chmod(mode & 0o700)
    return path


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise a read-modify-write of ``path`` across threads and processes (a flock on
    .NAME.lock beside it; flock alone does not exclude threads of one process that open the
    file twice)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(str(path), threading.Lock())
    with thread_lock, open(path.with_name(f".{path.name}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_private(path: Path, data: str | bytes) -> None:
    """Write a file atomically with mode 0600 (never a moment with wider permissions); a missing
    parent directory is created 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unwritable(path: Path) -> str | None:
    """Why write_atomic could not write ``path`` (its missing folders made), or None. Only
    probes: a nameless temporary file in the nearest folder that exists, so nothing is left."""
    if os.path.isdir(path):  # os.path: an unreadable folder is an answer, not an error
        return f"{path} is a directory"
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not os.path.isdir(folder):
        return f"{folder} is not a directory"
    try:
        # Permission bits do not tell (root, a read-only mount, /proc): try.
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"no file can be made in {folder} ({exc.strerror or exc})"
    return None


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write a file atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Secret:
    """A password held in memory: never printed (repr and str hide it), read with ``reveal``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@contextlib.contextmanager
def secret_files() -> Iterator[Callable[[str, Secret], Path]]:
    """Files that hand a secret to a child process without its command line: ``write(name,
    secret)`` makes a 0600 file in a private 0700 folder outside the state directory; the folder
    and everything in it are removed on the way out, whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="umprov-secret-"))  # mkdtemp: mode 0700

    def write(name: str, secret: Secret) -> Path:
        path = folder / name
        write_private(path, secret.reveal())
        return path

    try:
        yield write
    finally:
        shutil.rmtree(folder, ignore_errors=True)
