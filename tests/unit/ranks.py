"""The agent's NCCL rank children over gloo on the CPU, started as the agent's parent starts
them (needs a Python with torch: this one, or UMPROV_TEST_TORCH_PYTHON)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from umprov.verify.agent.profiles import BUILTIN_PROFILES


def torch_python() -> str | None:
    return os.environ.get("UMPROV_TEST_TORCH_PYTHON") or (
        sys.executable if importlib.util.find_spec("torch") else None)


def start_ranks(agent: Path, tmp_path: Path, world: int, **opts: object) -> list:
    """``world`` ranks behind an open gate (``tmp_path/nccl.gate``), events in
    ``tmp_path/r<rank>.jsonl``; skips the test where no Python has torch."""
    python = torch_python()
    if python is None:
        pytest.skip("no Python with torch (set UMPROV_TEST_TORCH_PYTHON to run this)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gate = tmp_path / "nccl.gate"
    gate.touch()
    path = tmp_path / "opts.json"
    path.write_text(json.dumps({"quick": False, "timeout": 60, "profiles": BUILTIN_PROFILES,
                                "forced": None, "world": world, "port": port,
                                "nccl_backend": "gloo", "gate": str(gate), **opts}))
    return [subprocess.Popen([python, str(agent), "--child", "nccl", "--child-opts", str(path),
                              "--rank", str(r), "--child-out", str(tmp_path / f"r{r}.jsonl")])
            for r in range(world)]
