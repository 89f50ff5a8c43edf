"""One host's outcome, the same for every command that works on hosts, and the exit code a
set of outcomes gives.

A command says what happened on a host in its own words (``state``: created, changed,
reachable, pass...), one line for people (``detail``) and its own figures (``data``, the
fields of its JSON). What the state means for the exit code is decided here, once: every state
not listed in ``_KINDS`` is a success.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from umprov.errors import ExitCode


class Kind(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAILED = "failed"
    UNTRUSTED = "untrusted"  # the host's SSH key is unknown or changed
    UNREACHABLE = "unreachable"


PENDING = "pending"  # not finished: a host still in this state at the end failed

_KINDS: dict[str, Kind] = {
    PENDING: Kind.FAILED,
    "failed": Kind.FAILED,
    "fail": Kind.FAILED,  # verify's verdicts
    "warn": Kind.WARN,
    "untrusted": Kind.UNTRUSTED,
    "unreachable": Kind.UNREACHABLE,
}


@dataclass
class HostOutcome:
    host: str
    state: str = PENDING
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> Kind:
        return _KINDS.get(self.state, Kind.OK)

    @property
    def ok(self) -> bool:
        return self.kind is Kind.OK


# The first kind present decides: one failed host outweighs any number of unreachable ones.
_PRECEDENCE = (Kind.FAILED, Kind.UNTRUSTED, Kind.UNREACHABLE, Kind.WARN)


def exit_code(
    outcomes: Iterable[HostOutcome], *, failed: ExitCode = ExitCode.HOSTS_FAILED
) -> ExitCode:
    """The exit code of a run: ``failed`` (10; verify: 13) when a host failed, else 6 when a
    host's key was not trusted, else 11 when a host was unreachable, else 12 with warnings."""
    kinds = {o.kind for o in outcomes}
    codes = {
        Kind.FAILED: failed,
        Kind.UNTRUSTED: ExitCode.TRUST,
        Kind.UNREACHABLE: ExitCode.HOSTS_UNREACHABLE,
        Kind.WARN: ExitCode.VERIFY_WARN,
    }
    for kind in _PRECEDENCE:
        if kind in kinds:
            return codes[kind]
    return ExitCode.OK
