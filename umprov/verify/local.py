"""`umprov verify --local`: the agent run on this machine, as a subprocess of a Python that
has torch, its report read back and checked like a remote host's; a burn-in's progress lines
are passed on to stderr as they come."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any


def run_local(*, quick: bool, timeout: float, expected_gpus: int | None,
              overrides: dict[str, Any], python: str | None = None, duration: float = 0.0,
              exclusive: bool = False, passive: bool = False) -> dict:
    """Run the agent's zipapp here as a subprocess of ``python``; its checked report."""
    import socket

    from umprov.verify.bundle import agent_zipapp
    from umprov.verify.remote import VerifyOptions, agent_flags
    from umprov.verify.report import checked, failed_host_report

    interpreter = python or sys.executable
    host = socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="umprov-verify-") as tmp:
        out = Path(tmp) / "report.json"
        argv = [interpreter, str(agent_zipapp()), "--quiet", "--json", str(out),
                *agent_flags(quick, timeout, duration, exclusive, passive)]
        if expected_gpus is not None:
            argv += ["--expected-gpus", str(expected_gpus)]
        if overrides:
            prof = Path(tmp) / "profile.json"
            prof.write_text(json.dumps(overrides))
            argv += ["--profile-file", str(prof)]
        deadline = VerifyOptions(timeout=timeout, duration=duration).overall_timeout()
        try:
            rc, stderr = run_agent(argv, deadline)
        except FileNotFoundError:
            return failed_host_report(host, "agent.run", f"python not found: {interpreter}",
                                      hint="config")
        except subprocess.TimeoutExpired:
            return failed_host_report(host, "agent.run", f"the agent did not finish within "
                                      f"{deadline:.0f} s", hint="reset", reason="timeout")
        if not out.is_file():
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            return failed_host_report(host, "agent.run", f"the agent exited with code "
                                      f"{rc} and wrote no report: {tail[:300]}")
        doc = json.loads(out.read_text())
    doc = checked(doc, host)
    if python is None and any("cannot import torch" in r["detail"] for r in doc["records"]):
        for r in doc["records"]:
            if r["check"] == "host.gpu_visible":
                r["detail"] += " (pass --python with the interpreter that has torch)"
    return doc


def run_agent(argv: list[str], deadline: float) -> tuple[int, str]:
    """(exit code, the end of its stderr); burn-in progress lines go to our stderr at once.
    TimeoutExpired past ``deadline``, with the agent killed."""
    from umprov.output import say

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # noqa: S603
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            env=os.environ.copy())
    tail: collections.deque[str] = collections.deque(maxlen=50)

    def pump() -> None:
        for line in proc.stderr or ():
            tail.append(line)
            if " burn-in " in line:
                say(line.rstrip())

    reader = threading.Thread(target=pump, name="agent-stderr", daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=deadline)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return rc, "".join(tail)
