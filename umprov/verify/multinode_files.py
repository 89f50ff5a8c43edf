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
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError
from umprov.verify.multinode_judge import HostRun, host_reports, parse_events


def judge_job_dir(folder: Path) -> list[dict]:
    """One host document per node of the job in ``folder``."""
    job = _job(folder)
    runs = [_node_run(folder / node, node, str(job["job_id"])) for node in job["nodes"]]
    return host_reports(runs, backend=str(job["backend"]), endpoint=job.get("rendezvous"),
                        rdzv_id=str(job["job_id"]), timeout=float(job["timeout"]),
                        wall_s=float(job.get("ended", 0)) - float(job.get("started", 0)),
                        launcher="sbatch")


def _job(folder: Path) -> dict[str, Any]:
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
    return job


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
