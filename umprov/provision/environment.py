"""The world ansible-playbook runs in: the execution strategy, a private run folder, an
environment without the caller's secrets (ansible-runner records it), and artifacts scrubbed
of what it recorded anyway."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from umprov.errors import ConfigError
from umprov.paths import state_dir, write_atomic, write_private
from umprov.provision.args import remove_extra_vars_files

KEEP_RUNS = 10

# Execution strategies: Mitogen's linear strategy (one persistent Python per host, modules
# sent once) when the mitogen package is importable, else Ansible's own linear strategy with
# ansible.cfg's tuning (pipelining, ControlPersist, forks). "auto" picks the first that works.
STRATEGIES = ("auto", "mitogen", "linear")


def mitogen_strategy_dir() -> Path | None:
    """ansible_mitogen's strategy plugins folder, or None when mitogen is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("ansible_mitogen")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        strategy = Path(location) / "plugins" / "strategy"
        if (strategy / "mitogen_linear.py").is_file():
            return strategy
    return None


def resolve_strategy(requested: str = "auto") -> tuple[str, dict[str, str]]:
    """The strategy to run with and the environment ansible-playbook needs for it."""
    if requested not in STRATEGIES:
        raise ConfigError(f"unknown strategy {requested!r}; choose one of {', '.join(STRATEGIES)}")
    if requested == "linear":
        return "linear", {"ANSIBLE_STRATEGY": "linear"}
    plugins = mitogen_strategy_dir()
    if plugins is None:
        if requested == "mitogen":
            raise ConfigError(
                "--strategy mitogen: the mitogen package is not installed in umprov's "
                "environment (pip install mitogen), or use --strategy linear"
            )
        return "linear", {"ANSIBLE_STRATEGY": "linear"}
    return "mitogen", {
        "ANSIBLE_STRATEGY_PLUGINS": str(plugins),
        "ANSIBLE_STRATEGY": "mitogen_linear",
        # ansible-core flags every third-party strategy as deprecated; the run's output is ours.
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
    }


def private_dir() -> Path:
    runs = state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = sorted(p for p in runs.iterdir() if p.is_dir())
    for stale in old[: max(0, len(old) - KEEP_RUNS + 1)]:
        shutil.rmtree(stale, ignore_errors=True)
    path = runs / f"provision-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    path.mkdir(mode=0o700)
    return path


RC_CANCELED = 254  # ansible-runner's rc for a run it canceled


def settle_rc(artifact_dir: Path) -> None:
    """A playbook killed before ansible-runner saw the cancel leaves ``rc`` saying "None" (the
    child had no exit status, only a signal); record it as the canceled run it was."""
    rc = artifact_dir / "rc"
    if rc.exists() and not rc.read_text().strip().lstrip("-").isdigit():
        write_private(rc, str(RC_CANCELED))


# Variables ansible-playbook and ssh need; ansible-runner copies the whole environment into its
# artifacts, so everything else (tokens, cloud credentials) is left out of the child's.
_ENV_KEEP = {
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "SSH_AUTH_SOCK",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "UMPROV_PROJECT_DIR",
    "UMPROV_STATE_DIR",
}
_SECRET_WORDS = ("PASS", "TOKEN", "SECRET", "CREDENTIAL")
# Settings umprov has acted on already and passes on as arguments (provision_args): a
# LABEL@prompt in them would make ansible-playbook wait on a prompt no one sees.
_ALREADY_GIVEN = {"ANSIBLE_VAULT_IDENTITY_LIST"}


def child_environment() -> dict[str, str]:
    import sys

    env = {}
    for key, value in os.environ.items():
        secret = any(w in key.upper() for w in _SECRET_WORDS) and not key.endswith("_FILE")
        if key in _ALREADY_GIVEN:
            continue
        if key in _ENV_KEEP or (key.startswith("ANSIBLE_") and not secret):
            env[key] = value
    # ansible-playbook from umprov's own environment first: a venv need not be on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return env


class runner_environment:  # noqa: N801 - used as a context manager, reads like a function
    """Swap os.environ for the child's while ansible-runner copies it (it reads it once)."""

    def __enter__(self) -> None:
        self.saved = dict(os.environ)
        child = child_environment()
        os.environ.clear()
        os.environ.update(child)

    def __exit__(self, *_exc: object) -> None:
        os.environ.clear()
        os.environ.update(self.saved)


def scrub_artifacts(artifact_dir: Path) -> None:
    """Drop the environment that ansible-runner records in artifacts/<id>/command, and the
    run's extra-vars files (private/artifacts/<id> -> private/extravars*.json)."""
    remove_extra_vars_files(artifact_dir.parent.parent)
    command = artifact_dir / "command"
    try:
        data = json.loads(command.read_text())
    except (OSError, ValueError):
        return
    if "env" not in data:
        return
    data.pop("env", None)
    write_atomic(command, json.dumps(data), 0o600)
