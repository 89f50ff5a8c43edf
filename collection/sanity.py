"""ansible-test sanity on the umprov.gpu collection, as built (collection/build.py).

    python collection/sanity.py [ansible-test options, e.g. --test pylint]

Stages the collection in a temporary ansible_collections/ tree, makes it a git repository
(ansible-test lists a collection's files through git), and runs every sanity test for this
Python, each in the virtual environment ansible-test makes for it (no container). ansible-test
bootstraps pip in those from a script on ci-files.testing.ansible.com; where that host cannot be
reached, a stand-in from Python's own ensurepip is put in its cache (a HOME of the run's own, so
the user's cache is left alone). Exit code: ansible-test's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build import stage  # noqa: E402 (this folder's build.py)

STAND_IN = '''\
# Stand-in for ansible-test's pip bootstrap script: pip from ensurepip, then the requested
# packages from the configured index. ensurepip clears pip's settings in this process's
# environment; the install gets them back.
import ensurepip, os, subprocess, sys
saved = dict(os.environ)
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args], env=saved))
'''


def pip_version() -> str:
    """The pip that this ansible-test bootstraps in its virtual environments."""
    from types import SimpleNamespace

    from ansible_test._internal.python_requirements import get_venv_packages

    python = SimpleNamespace(version=f"{sys.version_info.major}.{sys.version_info.minor}")
    return get_venv_packages(python)["pip"]  # type: ignore[arg-type] (only .version is read)


def git_repository(folder: Path) -> None:
    for argv in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=umprov", "-c", "user.email=umprov@localhost", "commit", "-qm",
                  "collection as built"]):
        subprocess.run(["git", *argv], cwd=folder, check=True)  # noqa: S603, S607


def main() -> int:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    ansible_test = Path(sys.executable).with_name("ansible-test")
    with tempfile.TemporaryDirectory(prefix="umprov-sanity-") as tmp:
        target = stage(Path(tmp) / "build")
        git_repository(target)
        home = Path(tmp) / "home"
        cache = home / ".ansible" / "test" / "cache"
        cache.mkdir(parents=True)
        (cache / f"get_pip_{pip_version().replace('.', '_')}.py").write_text(STAND_IN)
        env = {**os.environ, "HOME": str(home)}
        proc = subprocess.run([str(ansible_test), "sanity", "--python", python, *sys.argv[1:]],  # noqa: S603
                              cwd=target, env=env, check=False)
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
