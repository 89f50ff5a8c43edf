"""The lab raises kernel limits that stall systemd in its hosts, or says how."""

from __future__ import annotations

from pathlib import Path

import pytest

from umprov.errors import EnvironmentProblem
from umprov_lab import engine


@pytest.fixture
def inotify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(engine, "INOTIFY_DIR", tmp_path)
    (tmp_path / "max_user_instances").write_text("128\n")
    (tmp_path / "max_user_watches").write_text("999999\n")
    return tmp_path


def test_low_limit_is_raised_and_high_one_kept(inotify: Path) -> None:
    changes = engine.ensure_inotify_limits()
    assert (inotify / "max_user_instances").read_text().strip() == "8192"
    assert (inotify / "max_user_watches").read_text().strip() == "999999"
    assert changes == ["raised fs.inotify.max_user_instances to 8192"]
    assert engine.ensure_inotify_limits() == []


def test_limit_that_cannot_be_raised_names_the_sysctl(
    inotify: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path, *args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    with pytest.raises(EnvironmentProblem, match=r"sysctl -w fs.inotify.max_user_instances=8192"):
        engine.ensure_inotify_limits()


def test_the_engine_the_lab_starts_is_no_child_of_the_caller(tmp_path: Path) -> None:
    # A caller's process-tree clean-up (umprov after Ctrl-C, a test's) must not reach dockerd.
    import os
    import sys
    import time
    import uuid

    from umprov import procs

    mark = uuid.uuid4().hex
    daemon = [sys.executable, "-c", "import time; time.sleep(30)", mark]
    engine.start_detached(daemon, tmp_path / "daemon.log")
    deadline = time.monotonic() + 10
    # setsid's forked child carries the mark too, for the moment before its setsid() and exec.
    while not (started := [p for p in procs.processes()
                           if mark in p.cmdline and p.cmdline.startswith(sys.executable)]):
        assert time.monotonic() < deadline, "the daemon did not start"
        time.sleep(0.05)
    try:
        assert not [p for p in procs.descendants() if mark in p.cmdline]
        assert all(p.pgid == p.pid for p in started)  # a session of its own
    finally:
        for proc in started:
            os.kill(proc.pid, 9)
