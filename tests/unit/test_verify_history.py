"""The verify history: bounded, written whole under concurrent runs, keyed by the GPUs so a
renamed host keeps its past, and regressions judged against each host's own runs."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import stat
import time

import pytest

from tests import fleet_docs
from umprov.errors import ConfigError
from umprov.verify import history
from umprov.verify.history import FigureTrend, Regression, Retention
from umprov.verify.report import failed_host_report

DAY = 86400.0
NOW = 1_800_000_000.0
ROOMY = Retention(max_age_days=3650, max_bytes=1 << 30, max_runs_per_host=10_000)


@pytest.fixture
def root(tmp_path):
    return tmp_path / "history"


def stored(root) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name != "names")


def plant(root, runs: int, *, host: str = "h200-a", gpus: int = 2, last: dict | None = None,
          start: float = NOW - 30 * DAY) -> None:
    """``runs`` healthy runs a day apart, and a last one with ``last`` planted."""
    for k in range(runs):
        doc = fleet_docs.gpu_host(host, gpus=gpus, seed=k)
        history.save([doc], root=root, now=start + k * DAY, retention=ROOMY)
    if last is not None:
        doc = fleet_docs.gpu_host(host, gpus=gpus, seed=99, bad=last)
        history.save([doc], root=root, now=start + runs * DAY, retention=ROOMY)


def test_each_run_is_one_private_file_per_host(root):
    docs = [fleet_docs.healthy_pair(), fleet_docs.no_gpu_host()]
    paths = history.save(docs, root=root, now=NOW, retention=ROOMY)
    assert len(paths) == 2 and stored(root) == sorted(paths)
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        head, doc = gzip.decompress(path.read_bytes()).decode().splitlines()
        assert json.loads(head)["schema"] == "umprov.verify.history"
        assert json.loads(head)["saved"] == NOW and json.loads(doc) in docs
    assert not [p for p in root.rglob(".*")]  # no temporary file left
    entries = {e.host: e for e in history.load(root=root, now=NOW)}
    assert set(entries) == {"h200-a", "build-01"}
    assert entries["h200-a"].doc() == docs[0] and entries["build-01"].doc() == docs[1]
    assert ["gpu0", "gpu.hbm_copy", "GB/s"] in [f[:3] for f in entries["h200-a"].figures]
    assert entries["build-01"].figures == [["host", "host.gpu_visible", "GPUs", 0],
                                           ["host", "host.gpu_count", "GPUs", 0]]


def test_runs_beyond_the_count_go_oldest_first(root):
    keep = Retention(max_age_days=3650, max_bytes=1 << 30, max_runs_per_host=3)
    doc = fleet_docs.healthy_pair()
    for k in range(5):
        history.save([doc], root=root, now=NOW + k, retention=keep)
    saved = [e.saved for e in history.load(root=root, now=NOW + 10)]
    assert saved == [NOW + 2, NOW + 3, NOW + 4]


def test_runs_older_than_the_age_limit_go(root):
    keep = Retention(max_age_days=30, max_bytes=1 << 30, max_runs_per_host=100)
    doc = fleet_docs.healthy_pair()
    history.save([doc], root=root, now=NOW - 40 * DAY, retention=ROOMY)
    history.save([doc], root=root, now=NOW - 20 * DAY, retention=ROOMY)
    history.save([doc], root=root, now=NOW, retention=keep)
    assert [e.saved for e in history.load(root=root, now=NOW)] == [NOW - 20 * DAY, NOW]


def test_the_total_size_is_bounded_oldest_first(root, tmp_path):
    doc = fleet_docs.gpu_host("big", gpus=8)
    (sample,) = history.save([doc], root=tmp_path / "sample", now=NOW, retention=ROOMY)
    one = sample.stat().st_size
    keep = Retention(max_age_days=3650, max_bytes=int(one * 4.5), max_runs_per_host=100)
    for k in range(8):
        history.save([doc], root=root, now=NOW + k, retention=keep)
    sizes = sum(p.stat().st_size for p in stored(root))
    saved = [e.saved for e in history.load(root=root, now=NOW + 10)]
    assert sizes <= keep.max_bytes and saved == [NOW + 4, NOW + 5, NOW + 6, NOW + 7]


def test_the_limits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("UMPROV_HISTORY_MAX_DAYS", "7")
    monkeypatch.setenv("UMPROV_HISTORY_MAX_MB", "1.5")
    assert Retention.from_env() == Retention(7.0, int(1.5 * 2**20), 500)
    monkeypatch.setenv("UMPROV_HISTORY_MAX_RUNS", "many")
    with pytest.raises(ConfigError, match="UMPROV_HISTORY_MAX_RUNS='many'"):
        Retention.from_env()


def _writer(root: str, worker: int, runs: int, cap: int) -> None:
    keep = Retention(max_age_days=3650, max_bytes=1 << 30, max_runs_per_host=cap)
    for k in range(runs):
        docs = [fleet_docs.gpu_host(f"w{worker}", gpus=2, seed=k), fleet_docs.healthy_pair()]
        history.save(docs, root=history.Path(root), now=NOW + worker + k * 10, retention=keep)


@pytest.mark.parametrize("cap", [10_000, 6])
def test_concurrent_runs_lose_nothing_and_leave_no_half_file(root, cap):
    workers, runs = 4, 8
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(root), w, runs, cap)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers
    assert not [p for p in root.rglob(".*.tmp")]
    entries = history.load(root=root, now=NOW + 1000)
    assert len(entries) == len(stored(root))  # every file reads back whole
    per_key: dict[str, int] = {}
    for e in entries:
        per_key[e.key] = per_key.get(e.key, 0) + 1
    if cap > runs * workers:
        assert per_key == {**{history.machine_key(fleet_docs.gpu_host(f"w{w}", gpus=2), root):
                              runs for w in range(workers)},
                           history.machine_key(fleet_docs.healthy_pair(), root): runs * workers}
    else:  # each worker's own host: exactly the cap; the shared one: at most the cap
        shared = per_key.pop(history.machine_key(fleet_docs.healthy_pair(), root))
        assert set(per_key.values()) == {cap} and 1 <= shared <= cap, (per_key, shared)


def test_a_renamed_host_keeps_its_history(root):
    plant(root, 4, host="gpu-old")
    renamed = fleet_docs.gpu_host("gpu-old", gpus=2, seed=7)
    renamed["host"] = "gpu-new"  # same GPUs (UUIDs), new inventory name
    history.save([renamed], root=root, now=NOW, retention=ROOMY)
    (trend,) = history.trends(history.load(root=root, now=NOW))
    assert trend.host == "gpu-new" and trend.names == ["gpu-old", "gpu-new"]
    assert len(trend.saved) == 5
    assert len(history.load(root=root, hosts=["gpu-new"], now=NOW)) == 5


def test_a_host_without_gpus_is_kept_by_name_and_joins_its_gpu_history(root):
    history.save([fleet_docs.no_gpu_host("cpu-1")], root=root, now=NOW - 2, retention=ROOMY)
    history.save([fleet_docs.no_gpu_host("cpu-1")], root=root, now=NOW - 1, retention=ROOMY)
    plant(root, 2, host="gpu-1", start=NOW - 10)
    lost = failed_host_report("gpu-1", "agent.connect", "unreachable: no route")
    history.save([lost], root=root, now=NOW, retention=ROOMY)
    keys = {e.host: set() for e in history.load(root=root, now=NOW)}
    for e in history.load(root=root, now=NOW):
        keys[e.host].add(e.key)
    assert keys["cpu-1"] == {history.machine_key({"host": "cpu-1"}, root)}
    assert len(keys["gpu-1"]) == 1 and next(iter(keys["gpu-1"])).startswith("gpus-")


def test_since_keeps_only_the_recent_runs(root):
    plant(root, 10, start=NOW - 9 * DAY)
    recent = history.load(root=root, since=history.parse_age("60h"), now=NOW)
    assert [e.saved for e in recent] == [NOW - 2 * DAY, NOW - DAY, NOW]


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * DAY), ("12h", 43200.0),
                                               ("2w", 14 * DAY), ("90m", 5400.0), ("1.5d", 1.5 * DAY)])
def test_ages(text, seconds):
    assert history.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "-3d", "3y", "9" * 400 + "d"])
def test_bad_ages(text):
    with pytest.raises(ValueError, match="not an age"):
        history.parse_age(text)


def test_a_regression_is_flagged_though_the_figure_still_passes(root):
    plant(root, 6, gpus=2)
    doc = fleet_docs.gpu_host("h200-a", gpus=2, seed=50)
    hbm = next(r for r in doc["records"] if r["target"] == "gpu1" and r["check"] == "gpu.hbm_copy")
    hbm["measured"] = 3800.0  # about 11 % below its history, above the 3630 pass line
    history.save([doc], root=root, now=NOW, retention=ROOMY)
    (trend,) = history.trends(history.load(root=root, now=NOW))
    flagged = [(f.target, f.check) for f in trend.regressions]
    assert flagged == [("gpu1", "gpu.hbm_copy")] and hbm["verdict"] == "pass"
    fig = trend.regressions[0]
    assert fig.change == pytest.approx(3800.0 / fig.median - 1) and fig.change < -0.08
    data = history.to_json([trend])
    assert data["regressions"] == 1
    (row,) = [f for f in data["hosts"][0]["figures"] if f["regression"]]
    assert row["target"] == "gpu1" and len(row["values"]) == 7


def fig(unit: str, values: list[float], check: str = "x.y") -> FigureTrend:
    f = FigureTrend("gpu0", check, unit, [(float(i), v) for i, v in enumerate(values)])
    history.judge(f)
    return f


@pytest.mark.parametrize(("unit", "values", "flagged"), [
    ("GB/s", [100, 101, 99, 100, 91.9], True),  # 8.1 % lower bandwidth
    ("GB/s", [100, 101, 99, 100, 93.0], False),  # 7 %: within the noise
    ("GB/s", [100, 100, 100, 130.0], False),  # faster is never a regression
    ("TFLOP/s", [700, 700, 700, 600], True),
    ("s", [2.0, 2.0, 2.0, 2.2], True),  # latency: higher is worse
    ("ms", [10, 10, 10, 8], False),
    ("C", [40, 40, 40, 80], False),  # temperature: a trend, not a flag
    ("GB/s", [100, 100, 80], False),  # only two earlier runs
])
def test_regressions_know_which_way_is_worse(unit, values, flagged):
    assert fig(unit, values).regressed is flagged


def test_noisy_figures_need_a_larger_drop():
    assert not fig("GB/s", [8, 8, 8, 7.0], "managed.fault_migration").regressed  # 12.5 %
    assert fig("GB/s", [8, 8, 8, 5.5], "managed.fault_migration").regressed
    rule = Regression()
    assert rule.drop_for("gpu.hbm_copy") == rule.drop < rule.drop_for("managed.fault_migration")


def test_the_median_is_of_the_last_runs_only():
    values = [50.0] * 5 + [100.0] * 10 + [91.0]
    f = fig("GB/s", values)
    assert f.median == 100.0 and f.regressed  # the old, slow runs are out of the window


def test_load_skips_damaged_files_and_the_page_takes_the_latest_runs(root):
    plant(root, 3)
    history.save([fleet_docs.no_gpu_host()], root=root, now=NOW, retention=ROOMY)
    (stored(root)[0]).write_bytes(b"not gzip")
    entries = history.load(root=root, now=time.time())
    assert len(entries) == 3
    latest = history.latest_docs(entries)
    assert [d["host"] for d in latest] == ["h200-a", "build-01"]
    assert latest[0] == fleet_docs.gpu_host("h200-a", gpus=2, seed=2)


def test_reports_left_in_the_inbox_are_filed_at_their_time_then_removed(root, tmp_path):
    """playbooks/verify.yml's gpu_verify role leaves one host report per file in the inbox."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    report = inbox / "gpu07-20261204T120000.json"
    report.write_text(json.dumps(failed_host_report("gpu07", "gpu.count", "no NVIDIA GPU")))
    os_time = time.time() - 3600
    os.utime(report, (os_time, os_time))
    assert history.file_inbox(inbox=inbox, root=root) == 1
    assert not report.exists()
    (entry,) = history.load(root=root)
    assert entry.host == "gpu07" and abs(entry.saved - os_time) < 1


def test_a_file_in_the_inbox_that_is_no_report_is_named_and_kept(root, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    bad = inbox / "gpu07-x.json"
    bad.write_text('{"not": "a report"}')
    with pytest.raises(ConfigError, match="gpu07-x.json"):
        history.file_inbox(inbox=inbox, root=root)
    assert bad.exists() and history.load(root=root) == []


def plant_head(root, name: str, **head) -> object:
    """A history file whose first line is ``head`` (schema and key filled in unless given)."""
    head = {"schema": history.SCHEMA, "key": "host-00000000000000aa", "host": "x",
            "saved": NOW, "figures": [], **head}
    path = root / "host-00000000000000aa" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress((json.dumps(head) + "\n{}\n").encode()))
    return path


@pytest.mark.parametrize(("head", "words"), [
    ({"key": None}, "key None is not a name"),
    ({"saved": "yesterday"}, "saved 'yesterday' is not a time"),
    ({"saved": 10**400}, "is not a time"),
    ({"figures": [["gpu0", "gpu.hbm_copy", "GB/s", "fast"]]}, "figures are not"),
    ({"figures": [["gpu0", None, "GB/s", 1.0]]}, "figures are not"),
    ({"figures": "many"}, "figures are not"),
])
def test_a_damaged_entry_is_skipped_with_a_line_naming_it(root, capsys, head, words):
    """One damaged file must not hide the rest of a fleet's history."""
    plant(root, 3)
    bad = plant_head(root, f"{NOW * 1e9:019.0f}-1-bad{history.SUFFIX}", **head)
    entries = history.load(root=root, now=NOW)
    (trend,) = history.trends(entries)
    assert trend.host == "h200-a" and len(trend.saved) == 3
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"umprov: skipped {bad}: damaged (") and words in line


def test_a_head_without_its_key_is_damaged_too(root, capsys):
    path = root / "host-00000000000000aa" / f"{1:019d}-1-x{history.SUFFIX}"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b'{"schema": "umprov.verify.history", "saved": 1}\n{}\n'))
    assert history.load(root=root) == []
    assert f"skipped {path}: damaged (key None is not a name)" in capsys.readouterr().err


def test_a_measurement_that_is_no_number_is_no_point_of_a_trend(root):
    plant_head(root, f"{1:019d}-1-a{history.SUFFIX}", saved=1.0,
               figures=[["gpu0", "gpu.hbm_copy", "GB/s", float("nan")],
                        ["gpu0", "gpu.gemm", "TFLOP/s", 700.0]])
    (entry,) = history.load(root=root)
    assert entry.figures == [["gpu0", "gpu.gemm", "TFLOP/s", 700.0]]
    doc = fleet_docs.gpu_host("h200-a", gpus=1)
    doc["records"][0].update(measured=float("inf"), verdict="pass")
    assert all(f[3] != float("inf") for f in history.figures_of(doc))
