"""Report files a command writes beside its result (--html, --junit, --prometheus): checked
before any work, written once the result is out, so a bad path never costs a run its output."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from umprov.errors import ConfigError, UmprovError
from umprov.output import say
from umprov.paths import unwritable


class ReportFile(NamedTuple):
    option: str  # "--html"
    path: Path | None  # as given; None: not asked for
    what: str  # "HTML", for the "HTML report: PATH" line
    write: Callable[[Path], object]  # given the path


def check_writable(option: str, path: Path | None, file: Path | None = None) -> None:
    """ConfigError naming ``option`` and ``path`` when ``file`` (``path`` itself by default, a
    file in it for a folder option) cannot be written; nothing when not asked for."""
    if path is None:
        return
    why = unwritable(file or path)
    if why:
        raise ConfigError(f"{option} {path}: cannot be written: {why}")


def write_files(files: Iterable[ReportFile], *, verdict: int = 0) -> None:
    """Write each file asked for and say where; one that fails does not stop the others, and
    each failure is a line of the ConfigError raised at the end; after a run that failed
    (``verdict``, its exit code: the one a scheduler acts on) the lines are only said."""
    failed = []
    for option, path, what, write in files:
        if path is None:
            continue
        try:
            write(path)
        except (OSError, UmprovError) as exc:
            failed.append(f"{option} {path}: not written: {_why(exc)}")
            continue
        say(f"{what} report: {path}")
    if failed and not verdict:
        raise ConfigError(failed[0], more=failed[1:])
    for line in failed:
        say(f"umprov: error: {line}")


def _why(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)
