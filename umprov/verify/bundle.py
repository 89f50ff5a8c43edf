"""The agent as one file: a zipapp built from umprov/verify/agent/, cached by its content.

``python3 agent.pyz ARGS`` runs the agent's command line with any Python 3.8+ (no shebang, no
umprov needed); torchrun takes the archive as its script. Inside, the package is the top-level
``umprov_agent`` (its imports are relative), started by a ``__main__.py`` that keeps the exit
code. The archive is cached in umprov's state dir under a hash of the package's files, and
written whole or not at all, so concurrent runs share it and an edit makes a new one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipapp
from collections.abc import Mapping
from pathlib import Path
from typing import Any

AGENT_DIR = Path(__file__).with_name("agent")
AGENT_NAME = "agent.pyz"  # its name where it is copied (containers, the multi-node workdir)
PACKAGE = "umprov_agent"
# A shell line that sets $PY to the container's Python, or exits NO_PYTHON without one.
NO_PYTHON = 98
FIND_PYTHON = ("PY=$(command -v python3 || command -v python) || "
               f"{{ echo 'no python in the container'; exit {NO_PYTHON}; }}")
MAIN = f"import sys\n\nfrom {PACKAGE}.cli import main\n\nsys.exit(main())\n"


def agent_files(source: Path = AGENT_DIR) -> dict[str, bytes]:
    """The package's files that travel, by relative path: its modules and data, no caches."""
    paths = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".py", ".json")
                   and "__pycache__" not in p.parts)
    return {p.relative_to(source).as_posix(): p.read_bytes() for p in paths}


def content_key(files: dict[str, bytes]) -> str:
    """A hash of every file's relative path and bytes, and of the archive's own __main__."""
    digest = hashlib.sha256(MAIN.encode())
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def agent_zipapp(source: Path = AGENT_DIR, cache: Path | None = None) -> Path:
    """The zipapp of the agent package, built on first use for this content."""
    if cache is None:
        from umprov.paths import state_dir

        cache = state_dir() / "agent"
    files = agent_files(source)
    target = cache / f"agent-{content_key(files)}.pyz"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="umprov-agent-") as tmp:
        stage = Path(tmp)
        for name, data in files.items():
            dest = stage / PACKAGE / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        (stage / "__main__.py").write_text(MAIN)
        fd, partial = tempfile.mkstemp(dir=cache, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            zipapp.create_archive(stage, partial, interpreter=None, compressed=True)
            os.chmod(partial, 0o644)
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return target


def copy_agent(container: Any, workdir: str, extra: Mapping[str, bytes] | None = None
               ) -> str | None:
    """Put the agent (as AGENT_NAME) and ``extra`` files into ``workdir`` of a running
    container (a docker SDK Container); None, or why it could not."""
    from umprov.hosts.engine import exec_in, tar_files

    rc, out = exec_in(container, ["mkdir", "-p", workdir], 60)
    if rc != 0:
        return f"cannot create {workdir}: {out.strip()[:200]}"
    files = {AGENT_NAME: agent_zipapp().read_bytes(), **(extra or {})}
    if not container.put_archive(workdir, tar_files(files)):
        return f"the engine refused the agent's files in {workdir}"
    return None
