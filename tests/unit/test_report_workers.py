"""A large report's host pages written by forked workers: every page as serial writing would
leave it, a worker's failure raised as its own error, and no fork beside another thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from umprov.verify.html import workers


def pages(count: int, bad: str | None = None) -> dict:
    def render(name: str) -> str:
        if name == bad:
            raise ValueError(f"cannot render {name}")
        return f"<p>{name} by {os.getpid()}</p>"

    return {f"{i:05d}.html": (lambda n=f"{i:05d}.html": render(n)) for i in range(count)}


@pytest.fixture
def forked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "worker_count", lambda _n: 3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_workers_write_every_page_in_processes_of_their_own(tmp_path: Path, forked) -> None:
    workers.write_pages(tmp_path, pages(10))
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert sorted(written) == sorted(pages(10))
    writers = {text.split(" by ")[1] for text in written.values()}
    assert len(writers) == 3 and f"{os.getpid()}</p>" not in writers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_page_that_fails_in_a_worker_raises_its_own_error_here(tmp_path: Path,
                                                                 forked) -> None:
    with pytest.raises(ValueError, match="cannot render 00004.html"):
        workers.write_pages(tmp_path, pages(10, bad="00004.html"))


def test_no_fork_beside_another_thread_or_for_a_few_pages() -> None:
    assert workers.worker_count(workers.PAGES_PER_WORKER - 1) == 1
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert workers.worker_count(100 * workers.PAGES_PER_WORKER) == 1
    finally:
        stop.set()
        other.join()


def test_a_failed_render_leaves_the_old_pages_and_no_half_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from umprov.verify import html

    folder = tmp_path / "report.hosts"
    html._replace_pages(folder, pages(3))
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ValueError):
        html._replace_pages(folder, pages(5, bad="00001.html"))
    assert sorted(p.name for p in folder.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["report.hosts"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_an_interrupt_stops_every_worker_before_it_is_raised(
    tmp_path: Path, forked, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    started: list[int] = []
    real_waitpid = os.waitpid

    def slow(name: str) -> str:
        time.sleep(30)  # a worker still writing when the run is interrupted
        return name

    def interrupted(pid: int, options: int) -> tuple[int, int]:
        started.append(pid)
        monkeypatch.setattr(os, "waitpid", real_waitpid)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "waitpid", interrupted)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        workers.write_pages(tmp_path, {f"{i}.html": (lambda n=f"{i}.html": slow(n))
                                       for i in range(6)})
    assert time.monotonic() - began < 20
    assert started
    for pid in started:  # reaped: nothing left behind
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
