"""A multi-node job that Slurm ran without umprov (docs/examples/multinode.sbatch), judged from
the folder it left: `umprov verify --multi-node --events DIR`.

The folder: ``job.json`` (job id, backend, timeout, rendezvous, node names, start and end,
written once srun has ended), ``opts.json``, and per node ``NODE/`` with ``nproc``,
``launched``, ``torchrun.log``, ``torchrun.rc`` and the ranks' event files ``rank.N``. The hosts
of the report are the Slurm node names; the records are those of `umprov verify --multi-node`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError
from umprov.paths import safe_name
from umprov.verify.history import finite
from umprov.verify.multinode_judge import HostRun, host_reports, parse_events


@dataclass(frozen=True)
class Job:
    """job.json, checked."""

    job_id: str
    backend: str
    timeout: float
    nodes: list[str]
    rendezvous: str | None
    wall_s: float


def judge_job_dir(folder: Path) -> list[dict]:
    """One host document per node of the job in ``folder``."""
    job = _job(folder)
    runs = [_node_run(folder / node, node, job.job_id) for node in job.nodes]
    return host_reports(runs, backend=job.backend, endpoint=job.rendezvous,
                        rdzv_id=job.job_id, timeout=job.timeout, wall_s=job.wall_s,
                        launcher="sbatch")


def _job(folder: Path) -> Job:
    path = folder / "job.json"
    try:
        job = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (the sbatch script writes it once its srun has "
                          "ended)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {' '.join(str(exc).split())}") from None
    need = ("job_id", "backend", "timeout", "nodes")
    if not isinstance(job, dict) or any(k not in job for k in need) or not job["nodes"]:
        raise ConfigError(f"{path}: needs {', '.join(need)} (written by "
                          "docs/examples/multinode.sbatch)")
    try:
        return _checked(job)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _checked(job: dict[str, Any]) -> Job:
    """ValueError naming the first field of the wrong type or value."""
    def bad(field: str, what: str) -> ValueError:
        return ValueError(f"{field} {job.get(field)!r:.60} is not {what}")

    def number(field: str, default: float | None = None) -> float:
        value = job.get(field, default)
        if not finite(value):
            raise bad(field, "a number")
        return float(value)

    job_id, nodes, timeout = job["job_id"], job["nodes"], number("timeout")
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)) or not str(job_id):
        raise bad("job_id", "a Slurm job id")
    if job["backend"] not in ("nccl", "gloo"):
        raise bad("backend", "nccl or gloo")
    if timeout <= 0:
        raise bad("timeout", "a positive number of seconds")
    if not isinstance(nodes, list) or len(set(map(str, nodes))) != len(nodes):
        raise bad("nodes", "a list of distinct node names")
    for node in nodes:  # each names a folder of DIR and a host of the history: never "../x"
        safe_name(node, "nodes: node name")
    if not isinstance(job.get("rendezvous"), (str, type(None))):
        raise bad("rendezvous", "HOST:PORT")
    return Job(str(job_id), job["backend"], timeout, list(nodes), job.get("rendezvous"),
               number("ended", 0) - number("started", 0))


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""


def _number(path: Path) -> float | None:
    with contextlib.suppress(ValueError):
        return float(_read(path).strip())
    return None


def _node_run(folder: Path, node: str, job_id: str) -> HostRun:
    run = HostRun(node, facts={"slurm_job_id": job_id, "slurm_node": node})
    if not folder.is_dir():
        run.stage, run.error = "slurm", f"no output from node {node}: its task did not start"
        return run
    run.nproc = int(_number(folder / "nproc") or 0)
    run.launched_at = _number(folder / "launched")
    rc = _number(folder / "torchrun.rc")
    run.rc = int(rc) if rc is not None and int(rc) not in (124, 137) else None
    with contextlib.suppress(OSError):
        run.finished_at = (folder / "torchrun.rc").stat().st_mtime
    run.output, run.stage = _read(folder / "torchrun.log"), "finished"
    for path in folder.glob("rank.*"):
        if path.suffix[1:].isdigit():
            run.ranks[int(path.suffix[1:])] = parse_events(_read(path))
    return run
