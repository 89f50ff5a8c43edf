"""Run the playbooks through ansible-runner: events in, progress and per-host results out.

Results are classified from the play stats, never from ansible-playbook's exit code, which is
ambiguous (2 means both "a host failed" and "bad option").

- ``args``: what ansible-playbook is given besides the playbook (sources, -e, passwords as files)
- ``environment``: the strategy, the private run folder, the child's environment, scrubbing
- ``runner``: ansible-runner started, its events read, the run stopped on an interrupt
- ``results``: events and play stats into per-host results and the run's result
"""

from __future__ import annotations

from umprov.provision.args import (
    ExtraVars,
    become_ask_pass_configured,
    parse_extra,
    parse_extra_vars,
)
from umprov.provision.environment import STRATEGIES, mitogen_strategy_dir, resolve_strategy
from umprov.provision.results import Event, EventSink, HostCounts, ProvisionResult, host_key_refused
from umprov.provision.runner import playbook_path, run_playbook

__all__ = [
    "STRATEGIES", "Event", "EventSink", "ExtraVars", "HostCounts", "ProvisionResult",
    "become_ask_pass_configured", "host_key_refused", "mitogen_strategy_dir",
    "parse_extra", "parse_extra_vars", "playbook_path", "resolve_strategy", "run_playbook",
]
