"""HostProgress: no progress line after the CLI's last line (the SIGTERM race of
test_interrupts: a push reporter thread printed after "umprov: terminated")."""

from __future__ import annotations

import threading

import pytest

from umprov.cli import _progress


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []
    monkeypatch.setattr(_progress, "stderr_is_tty", lambda: False)
    monkeypatch.setattr(_progress, "say", out.append)
    return out


def test_a_line_is_written_while_the_lock_is_held(monkeypatch, lines) -> None:
    progress = _progress.HostProgress(["a"])
    held: list[bool] = []
    monkeypatch.setattr(_progress, "say", lambda line: held.append(progress.lock.locked()))
    with progress:
        progress("a", "connecting")
    assert held == [True]


def test_a_reporter_that_outlives_the_block_prints_nothing(lines) -> None:
    progress = _progress.HostProgress(["a", "b"])
    with progress:
        progress("a", "connecting")
    late = threading.Thread(target=progress, args=("b", "pushing 12 MB"))
    late.start()
    late.join()
    lines.append("umprov: terminated (SIGTERM)")
    assert lines == ["a: connecting", "umprov: terminated (SIGTERM)"]


def test_a_report_racing_the_exit_lands_before_it_or_not_at_all(monkeypatch, lines) -> None:
    """The reporter is inside its write when the interrupt unwinds: __exit__ waits for it."""
    progress = _progress.HostProgress(["a"])
    writing, release = threading.Event(), threading.Event()

    def slow_say(line: str) -> None:
        writing.set()
        release.wait(5)
        lines.append(line)

    monkeypatch.setattr(_progress, "say", slow_say)
    progress.__enter__()
    reporter = threading.Thread(target=progress, args=("a", "sent 40 MB"))
    reporter.start()
    assert writing.wait(5)
    closer = threading.Thread(target=progress.__exit__, args=(None, None, None))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # held until the line is out
    release.set()
    closer.join(5)
    reporter.join(5)
    lines.append("umprov: terminated (SIGTERM)")
    assert lines == ["a: sent 40 MB", "umprov: terminated (SIGTERM)"]
