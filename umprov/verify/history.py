"""Each host's verify reports over time, kept in the state directory, and their trends.

Every ``umprov verify`` run saves one file per host (``save``)::

    STATE/verify-history/<key>/<saved ns>-<pid>-<token>.json.gz, two JSON lines:
        {"schema": "umprov.verify.history", "key", "host", "gpus": [UUID...], "saved": epoch,
         "figures": [[target, check, unit, value]...]}      what trends read (a small part)
        the host document                                   what a page of the run shows
    STATE/verify-history/names/<quoted host name>      the key last seen under that name

The key is what stays when an inventory renames a host: "gpus-" and a digest of the sorted GPU
UUIDs the agent reported (facts.discover.devices, else facts.discover.gpus_nvml). A document
without UUIDs (no GPU, an unreachable host, a multi-node run) joins the history last saved under
its host name, else "host-" and a digest of the name. Files are written whole (a temporary
file, then a rename, mode 0600) under names no two writers share, so concurrent runs never see
half a file; pruning after each save tolerates files another run removed first.

Bounds (``Retention``, oldest dropped first): 180 days, 256 MiB in all, 500 runs per host;
UMPROV_HISTORY_MAX_DAYS, UMPROV_HISTORY_MAX_MB and UMPROV_HISTORY_MAX_RUNS change them.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
import os
import re
import secrets
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

from umprov.errors import ConfigError
from umprov.paths import private_dir, state_dir, write_atomic

SCHEMA = "umprov.verify.history"
SUFFIX = ".json.gz"
NAMES = "names"
LAST_TIME = 253402300800  # 10000-01-01: a later one cannot be written as a date


@dataclass(frozen=True)
class Retention:
    max_age_days: float = 180.0
    max_bytes: int = 256 << 20
    max_runs_per_host: int = 500

    @classmethod
    def from_env(cls) -> Retention:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            try:
                value = default if raw is None else float(raw)
            except ValueError:
                value = -1
            if value <= 0:
                raise ConfigError(f"{name}={raw!r}: give a positive number")
            return value

        return cls(max_age_days=number("UMPROV_HISTORY_MAX_DAYS", cls.max_age_days),
                   max_bytes=int(number("UMPROV_HISTORY_MAX_MB", cls.max_bytes / 2**20) * 2**20),
                   max_runs_per_host=int(number("UMPROV_HISTORY_MAX_RUNS",
                                                cls.max_runs_per_host)))


@dataclass(frozen=True)
class Regression:
    """When a figure has regressed against its host's own history; the one place for it."""

    drop: float = 0.08  # 8 % worse than the median ...
    window: int = 10  # ... of the last 10 earlier runs ...
    min_runs: int = 3  # ... once there are at least 3 of them
    # Figures that scatter more than that from run to run on a healthy host (6-9 GB/s fault
    # migration on the H200 reference machine, bench/README.md) need a larger drop.
    noisy: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({
        "managed.fault_migration": 0.25, "managed.prefetch_to_host": 0.25, "nccl.init": 0.5}))

    def drop_for(self, check: str) -> float:
        return self.noisy.get(check, self.drop)


REGRESSION = Regression()
# Which way is worse, by unit: lower bandwidth and rate, higher latency. Figures in other units
# (temperatures, counts, versions) get a trend but are never flagged.
HIGHER_IS_BETTER = frozenset({"GB/s", "TB/s", "TFLOP/s", "x"})
LOWER_IS_BETTER = frozenset({"s", "ms", "us"})


def root_dir() -> Path:
    return state_dir() / "verify-history"


def inbox_dir() -> Path:
    """Where reports made without umprov verify wait to be filed (playbooks/verify.yml's
    gpu_verify role writes each host's here, HOST-TIMESTAMP.json)."""
    return state_dir() / "verify-inbox"


def file_inbox(*, inbox: Path | None = None, root: Path | None = None) -> int:
    """File each report in the inbox into its host's history, saved at the file's time, then
    remove it; the number filed. A file that is not a report stops it (ConfigError naming the
    file), and neither it nor any later file is lost."""
    from umprov.verify.report import read_run

    inbox = inbox or inbox_dir()
    files = sorted(inbox.glob("*.json")) if inbox.is_dir() else []
    for path in files:
        save(read_run(path), root=root, now=path.stat().st_mtime)
        path.unlink()
    return len(files)


def gpu_uuids(doc: dict) -> list[str]:
    disc = (doc.get("facts") or {}).get("discover") or {}
    for source in (disc.get("devices"), disc.get("gpus_nvml")):
        found = sorted({str(d["uuid"]) for d in source or [] if isinstance(d, dict)
                        and d.get("uuid")})
        if found:
            return found
    return []


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _name_file(root: Path, host: str) -> Path:
    quoted = quote(host, safe="")
    return root / NAMES / (quoted if len(quoted) <= 200 else _digest(host))


def machine_key(doc: dict, root: Path) -> str:
    uuids = gpu_uuids(doc)
    if uuids:
        return "gpus-" + _digest(",".join(uuids))
    try:
        known = _name_file(root, str(doc.get("host"))).read_text().strip()
    except OSError:
        known = ""
    return known if re.fullmatch(r"(gpus|host)-[0-9a-f]{16}", known) else (
        "host-" + _digest(str(doc.get("host"))))


def save(docs: Iterable[dict], *, root: Path | None = None, now: float | None = None,
         retention: Retention | None = None) -> list[Path]:
    """Keep each host document of a run, then drop what the retention no longer allows."""
    root = private_dir(root or root_dir())
    now = time.time() if now is None else now
    written = []
    for doc in docs:
        key = machine_key(doc, root)
        name = f"{int(now * 1e9):019d}-{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"
        head = {"schema": SCHEMA, "key": key, "host": doc.get("host"), "gpus": gpu_uuids(doc),
                "saved": now, "figures": figures_of(doc)}
        text = json.dumps(head, default=str) + "\n" + json.dumps(doc, default=str) + "\n"
        data = gzip.compress(text.encode(), compresslevel=6, mtime=0)
        path = root / key / name
        _write(path, data)
        _write(_name_file(root, str(doc.get("host"))), key.encode())
        written.append(path)
    prune(root, retention or Retention.from_env(), now=now)
    return written


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    """A number a trend can hold: not a bool, NaN, infinite or an integer too large for a
    float (job.json's numbers are read with it too)."""
    try:
        return _numeric(value) and math.isfinite(value)
    except OverflowError:
        return False


def figures_of(doc: dict) -> list[list]:
    """[target, check, unit, value] of every record measured as a number (skips left out)."""
    return [[r.get("target"), r.get("check"), r.get("unit"), r["measured"]]
            for r in doc.get("records", []) if r.get("verdict") != "skip"
            and finite(r.get("measured"))]


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all, 0600 in a 0700 folder; no fsync: a lost last run costs a point of
    a trend, while 1,000 fsyncs would cost every large run seconds."""
    for attempt in (1, 2):
        try:
            private_dir(path.parent)
            write_atomic(path, data, mode=0o600)
            return
        # A concurrent prune removed the (empty) folder: once more. Path.mkdir says
        # FileExistsError when the folder it found is gone by the time it looks again.
        except (FileNotFoundError, FileExistsError):
            if attempt == 2:
                raise


def _saved_ns(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[0])
    except ValueError:
        return 0


def _entries(root: Path) -> list[tuple[int, Path, int]]:
    """(saved ns, path, size) of every stored run, oldest first."""
    found = []
    for key_dir in root.iterdir() if root.is_dir() else []:
        if not key_dir.is_dir() or key_dir.name == NAMES:
            continue
        for path in key_dir.iterdir():
            if not path.name.endswith(SUFFIX) or path.name.startswith("."):
                continue
            try:
                found.append((_saved_ns(path), path, path.stat().st_size))
            except FileNotFoundError:  # pruned by a concurrent run
                continue
    return sorted(found)


def prune(root: Path, retention: Retention, *, now: float | None = None) -> int:
    """Drop runs older than the age limit, then the oldest beyond a host's count and the total
    size; returns how many went. Safe beside other runs saving or pruning."""
    now = time.time() if now is None else now
    oldest_ns = int((now - retention.max_age_days * 86400) * 1e9)
    entries = _entries(root)
    per_key: dict[Path, int] = {}
    for _ns, path, _size in entries:
        per_key[path.parent] = per_key.get(path.parent, 0) + 1
    total = sum(size for _ns, _path, size in entries)
    dropped = 0
    for ns, path, size in entries:  # oldest first
        too_many = per_key[path.parent] > retention.max_runs_per_host
        if ns < oldest_ns or too_many or total > retention.max_bytes:
            path.unlink(missing_ok=True)
            per_key[path.parent] -= 1
            total -= size
            dropped += 1
    _tidy(root)
    return dropped


def forget(host: str, *, root: Path | None = None) -> list[Path]:
    """Drop the stored runs of a host that is gone for good (a lab's, on `lab down`), so that
    `umprov report` stops showing it; the files removed."""
    root = root or root_dir()
    if not root.is_dir():
        return []
    removed = []
    for entry in load(root=root, hosts=[host]):
        if entry.host == host:
            entry.path.unlink(missing_ok=True)
            removed.append(entry.path)
    _tidy(root)
    return removed


def _tidy(root: Path) -> None:
    """Leftovers of writers that died (temporary files over an hour old, by the clock: a
    writer's file is as new as the clock says, whatever run time it records), empty key
    folders, and names whose history is gone."""
    now = time.time()
    for key_dir in root.iterdir():
        if not key_dir.is_dir() or key_dir.name == NAMES:
            continue
        for path in key_dir.glob(".*.tmp"):
            try:
                if now - path.stat().st_mtime > 3600:
                    path.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
        with contextlib.suppress(OSError):
            key_dir.rmdir()  # only when empty
    for name in (root / NAMES).glob("*") if (root / NAMES).is_dir() else []:
        try:
            if not name.name.startswith(".") and not (root / name.read_text().strip()).is_dir():
                name.unlink(missing_ok=True)
        except OSError:
            continue


@dataclass
class Entry:
    key: str
    host: str
    saved: float
    figures: list[list]
    path: Path

    def doc(self) -> dict | None:
        """The host document of this run (read on demand: trends need only the figures)."""
        try:
            with gzip.open(self.path, "rt") as fh:
                fh.readline()
                doc = json.loads(fh.readline())
        except (OSError, EOFError, ValueError):  # pruned meanwhile, or damaged
            return None
        return doc if isinstance(doc, dict) else None


def load(*, root: Path | None = None, since: float | None = None,
         hosts: Sequence[str] | None = None, now: float | None = None) -> list[Entry]:
    """Stored runs, oldest first: those saved within ``since`` seconds, of the keys the given
    host names were last seen under (all keys when ``hosts`` is None)."""
    root = root or root_dir()
    now = time.time() if now is None else now
    keys = None if hosts is None else {machine_key({"host": h}, root) for h in hosts}
    after = 0 if since is None else int((now - since) * 1e9)
    out = []
    for ns, path, _size in _entries(root):
        if ns < after or (keys is not None and path.parent.name not in keys):
            continue
        try:
            with gzip.open(path, "rt") as fh:  # the first line only: the rest is the document
                head = json.loads(fh.readline())
            entry = _entry(head, path)
        except FileNotFoundError:
            continue  # pruned meanwhile
        except (OSError, EOFError, ValueError) as exc:
            # One damaged file must not hide a fleet's history: skipped, and said.
            from umprov.output import say

            say(f"umprov: skipped {path}: damaged ({' '.join(str(exc).split())})")
            continue
        if entry is not None:
            out.append(entry)
    return out


def _entry(head: Any, path: Path) -> Entry | None:
    """The entry a file's first line describes; None when the file is not a history entry
    (another schema); ValueError saying what is wrong with one that is damaged."""
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        return None
    key, saved, figures = head.get("key"), head.get("saved"), head.get("figures") or []
    if not isinstance(key, str) or not key:
        raise ValueError(f"key {key!r:.40} is not a name")
    if not finite(saved) or not 0 <= saved < LAST_TIME:
        raise ValueError(f"saved {saved!r:.40} is not a time")
    if not isinstance(figures, list) or not all(map(_figure_ok, figures)):
        raise ValueError("figures are not [target, check, unit, number] lists")
    # A NaN or infinite measurement is no point of a trend (and cannot be drawn).
    kept = [f for f in figures if finite(f[3])]
    return Entry(key, str(head.get("host")), float(saved), kept, path)


def _figure_ok(fig: Any) -> bool:
    """[target, check, unit, value] as figures_of writes it (unit may be None)."""
    return (isinstance(fig, list) and len(fig) == 4 and isinstance(fig[0], str)
            and isinstance(fig[1], str) and isinstance(fig[2], (str, type(None)))
            and _numeric(fig[3]))


def latest_docs(entries: Sequence[Entry]) -> list[dict]:
    """Each key's most recent host document (entries oldest first, as load gives them)."""
    last = {e.key: e for e in entries}
    return [doc for e in last.values() if (doc := e.doc()) is not None]


def parse_age(text: str) -> float:
    """'30d' -> seconds; units s, m, h, d, w."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    seconds = float(m.group(1)) * units[m.group(2)] if m else math.nan
    if not math.isfinite(seconds):  # 400 digits read as a float are infinite
        raise ValueError(f"{text!r:.40} is not an age such as 30d, 12h, 2w")
    return seconds


@dataclass
class FigureTrend:
    target: str
    check: str
    unit: str | None
    points: list[tuple[float, float]] = field(default_factory=list)
    median: float | None = None
    change: float | None = None  # latest against the median, a fraction
    regressed: bool = False

    @property
    def direction(self) -> str | None:
        return ("higher" if self.unit in HIGHER_IS_BETTER else
                "lower" if self.unit in LOWER_IS_BETTER else None)

    @property
    def latest(self) -> float:
        return self.points[-1][1]


@dataclass
class HostTrend:
    key: str
    names: list[str]  # the host's names, the latest last
    saved: list[float]
    figures: list[FigureTrend]

    @property
    def host(self) -> str:
        return self.names[-1]

    @property
    def regressions(self) -> list[FigureTrend]:
        return [f for f in self.figures if f.regressed]


def trends(entries: Sequence[Entry], rule: Regression = REGRESSION) -> list[HostTrend]:
    """Per host (key), each figure's values over time, judged against the host's own past."""
    by_key: dict[str, list[Entry]] = {}
    for entry in sorted(entries, key=lambda e: e.saved):
        by_key.setdefault(entry.key, []).append(entry)
    out = []
    for key, runs in by_key.items():
        names = list(dict.fromkeys(e.host for e in runs))
        names.append(names.pop(names.index(runs[-1].host)))
        figures: dict[tuple[str, str], FigureTrend] = {}
        for entry in runs:
            for target, check, unit, value in entry.figures:
                fig = figures.setdefault((target, check), FigureTrend(target, check, unit))
                fig.points.append((entry.saved, float(value)))
        for fig in figures.values():
            judge(fig, rule)
        out.append(HostTrend(key, names, [e.saved for e in runs], sorted(
            figures.values(), key=lambda f: (not f.regressed, f.target, f.check))))
    return sorted(out, key=lambda t: (not t.regressions, t.host))


def judge(fig: FigureTrend, rule: Regression = REGRESSION) -> None:
    """The latest value against the median of up to ``rule.window`` earlier ones."""
    earlier = [v for _t, v in fig.points[:-1]][-rule.window:]
    if not earlier:
        return
    fig.median = statistics.median(earlier)
    if fig.median == 0:
        return
    fig.change = (fig.latest - fig.median) / abs(fig.median)
    worse = {"higher": -fig.change, "lower": fig.change}.get(fig.direction or "")
    fig.regressed = (worse is not None and len(earlier) >= rule.min_runs
                     and worse >= rule.drop_for(fig.check) - 1e-12)


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def to_json(host_trends: Sequence[HostTrend], *, since: float | None = None) -> dict:
    return {
        "schema": "umprov.report.trends",
        "since_seconds": since,
        "regression_rule": {"drop": REGRESSION.drop, "window": REGRESSION.window,
                            "min_runs": REGRESSION.min_runs, "noisy": dict(REGRESSION.noisy)},
        "regressions": sum(len(t.regressions) for t in host_trends),
        "hosts": [{
            "key": t.key, "host": t.host, "names": t.names, "runs": len(t.saved),
            "first": iso(t.saved[0]), "last": iso(t.saved[-1]),
            "figures": [{
                "target": f.target, "check": f.check, "unit": f.unit,
                "direction": f.direction, "values": [[iso(s), v] for s, v in f.points],
                "latest": f.latest, "median": f.median,
                "change": None if f.change is None else round(f.change, 4),
                "regression": f.regressed,
            } for f in t.figures],
        } for t in host_trends],
    }
