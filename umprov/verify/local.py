"""`umprov verify --local`: the agent run on this machine, as a subprocess of a Python that
has torch, its report read back and checked like a remote host's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _agent_args(quick: bool, timeout: float, expected_gpus: int | None) -> list[str]:
    args = ["--timeout", str(timeout)]
    if quick:
        args.append("--quick")
    if expected_gpus is not None:
        args += ["--expected-gpus", str(expected_gpus)]
    return args


def run_local(*, quick: bool, timeout: float, expected_gpus: int | None,
              overrides: dict[str, Any], python: str | None = None) -> dict:
    """Run the agent's zipapp here as a subprocess of ``python``; its checked report."""
    import socket

    from umprov.verify.bundle import agent_zipapp
    from umprov.verify.remote import VerifyOptions
    from umprov.verify.report import checked, failed_host_report

    interpreter = python or sys.executable
    host = socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="umprov-verify-") as tmp:
        out = Path(tmp) / "report.json"
        argv = [interpreter, str(agent_zipapp()), "--quiet", "--json", str(out),
                *_agent_args(quick, timeout, expected_gpus)]
        if overrides:
            prof = Path(tmp) / "profile.json"
            prof.write_text(json.dumps(overrides))
            argv += ["--profile-file", str(prof)]
        deadline = VerifyOptions(timeout=timeout).overall_timeout()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True,  # noqa: S603
                                  timeout=deadline, env=os.environ.copy())
        except FileNotFoundError:
            return failed_host_report(host, "agent.run", f"python not found: {interpreter}",
                                      hint="config")
        except subprocess.TimeoutExpired:
            return failed_host_report(host, "agent.run", f"the agent did not finish within "
                                      f"{deadline:.0f} s", hint="reset", reason="timeout")
        if not out.is_file():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            return failed_host_report(host, "agent.run", f"the agent exited with code "
                                      f"{proc.returncode} and wrote no report: {tail[:300]}")
        doc = json.loads(out.read_text())
    doc = checked(doc, host)
    if python is None and any("cannot import torch" in r["detail"] for r in doc["records"]):
        for r in doc["records"]:
            if r["check"] == "host.gpu_visible":
                r["detail"] += " (pass --python with the interpreter that has torch)"
    return doc
