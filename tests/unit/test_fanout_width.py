"""The fan-out at fleet size: threads bounded by --forks, not by the inventory; the open-file
limit bounds --forks, saying so; every fanned-out command takes --forks."""

from __future__ import annotations

import resource
import threading
import time

import pytest

from umprov.hosts import fanout


def test_ten_thousand_items_cost_only_the_workers_threads():
    pool = fanout.Parallel(8)
    peak = 0
    lock = threading.Lock()

    def task(i: int) -> int:
        nonlocal peak
        with lock:
            peak = max(peak, threading.active_count())
        return i * 2

    before = threading.active_count()
    assert pool.map(task, list(range(10_000))) == [i * 2 for i in range(10_000)]
    assert peak - before <= 8


def test_at_most_workers_tasks_run_at_once_and_errors_come_back():
    pool = fanout.Parallel(3)
    running = 0
    most = 0
    lock = threading.Lock()

    def task(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        if i == 7:
            raise ValueError("host 7")
        return i

    with pytest.raises(ValueError, match="host 7"):
        pool.map(task, list(range(20)))
    assert most == 3


def test_a_cancelled_run_starts_no_further_item():
    pool = fanout.Parallel(2)
    seen: list[int] = []

    def task(i: int) -> None:
        seen.append(i)
        if i == 1:
            pool.cancel.set()
            raise fanout.Cancelled

    with pytest.raises(fanout.Cancelled):
        pool.map(task, list(range(100)))
    assert len(seen) <= 3


def test_the_open_file_limit_bounds_forks_and_says_so(monkeypatch):
    monkeypatch.setattr(fanout, "open_file_limit", lambda: 1024)
    fit = (1024 - fanout.FILES_KEPT) // fanout.FILES_PER_HOST  # 120
    assert fanout.workers(None, 1000) == (fanout.DEFAULT_FORKS, None)
    assert fanout.workers(500, 3) == (3, None)  # never more than one a host
    n, why = fanout.workers(500, 1000)
    assert n == fit and "open-file limit allows 120" in why and "ulimit -n" in why


def test_the_soft_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            assert fanout.open_file_limit() == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("command", ["deploy", "status", "verify", "trust", "provision"])
def test_every_fanned_out_command_takes_forks(umprov_cli, command):
    result = umprov_cli(command, "--help")
    assert "--forks" in result.stdout


def test_status_passes_forks_on(umprov_cli, monkeypatch, tmp_path):
    from umprov import status

    seen = {}

    def probe(hosts, name, *, trust_new=False, forks=None):
        seen["forks"] = forks
        return []

    monkeypatch.setattr(status, "probe", probe)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a: {ansible_host: 192.0.2.1}\n    b: {ansible_host: 192.0.2.2}\n")
    umprov_cli("status", str(inv), "--forks", "5")
    assert seen["forks"] == 2  # at most one per host
