"""Stand-in programs on a test's PATH, written one way: a script, a kernel journal, the Slurm
commands of unit/verify_fakes/fake_slurm.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FAKES = Path(__file__).resolve().parent / "unit" / "verify_fakes"


def program(path: Path, text: str) -> Path:
    """``text`` as an executable file (its first line names the interpreter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def shell(bin_dir: Path, name: str, script: str) -> Path:
    """A /bin/sh program ``name`` in ``bin_dir``."""
    return program(bin_dir / name, "#!/bin/sh\n" + script)


def journal(bin_dir: Path, entries: list[dict[str, Any]]) -> Path:
    """A journalctl that prints these entries, one JSON object a line, as ``-o json`` does."""
    out = bin_dir / "journal.out"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return shell(bin_dir, "journalctl", f"cat {out}\n")


def slurm(bin_dir: Path) -> None:
    """scontrol and squeue of the stand-in Slurm, and a kernel journal without an Xid."""
    fake = program(bin_dir / "fake_slurm",
                   f"#!{sys.executable}\n" + (FAKES / "fake_slurm.py").read_text())
    for name in ("scontrol", "squeue"):
        (bin_dir / name).symlink_to(fake)
    journal(bin_dir, [{"MESSAGE": "Linux"}])
