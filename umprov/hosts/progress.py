"""Progress: what a long operation tells people while it runs.

Library code reports through a callback and never prints; the CLI passes one that draws
(umprov.cli._progress.HostProgress), tests and library callers may pass nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Progress = Callable[[str, str], None]
"""Per host: (host name, one line saying what happens there now)."""


def quiet(*_args: object) -> None:
    """The progress callback that tells nobody (any arity: also for one-line callbacks)."""


def until_cancelled(progress: Progress, cancel: threading.Event) -> Progress:
    """``progress`` until the run is interrupted, then silence (the CLI is reporting the
    interrupt by then)."""

    def report(host: str, message: str) -> None:
        if not cancel.is_set():
            progress(host, message)

    return report


def size_text(size: int) -> str:
    """A byte count for people: "1274 MB", "51 kB"."""
    return f"{size / 1e6:.0f} MB" if size >= 10**6 or not size else f"{size / 1e3:.0f} kB"
