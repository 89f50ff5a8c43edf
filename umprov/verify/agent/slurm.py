"""What umprov does to a scheduler node after a check: drain it, resume it, or leave it.

The one home of the rules, for the health check that Slurm runs (HealthCheckProgram, an epilog
or prolog) and for the rolling change's hold and gate (playbooks/rolling.yml), both through
``agent.pyz --slurm-health`` (nodehealth.py). Every reason umprov writes starts with
``umprov:``; a node drained with any other reason was drained by someone else and is never
resumed or relabelled by umprov. The reasons (at most MAX_REASON characters)::

    umprov: gpu3 hbm_copy 2100 GB/s < 2990        a failing check: target, check, measured, limit
    umprov: gpu3 hbm_copy 2100 GB/s < 2990 (+2)   ... and two more failing checks
    umprov: rolling driver change 2026-05-01T10:00Z   a rolling change holds the node
    umprov: rolling failed: <step>: <message>         ... and a step of it failed

A passing run resumes a node umprov drained only when it ran the check that drained it (a
passive pass does not clear a bandwidth failure); a node held by a rolling change is left to
that change's gate. Node states come from ``scontrol show node -o`` (parse_node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PREFIX = "umprov:"
HOLD = "umprov: rolling"
MAX_REASON = 100  # sinfo -R shows the first 50; the target and check come first
# States in which Slurm runs nothing on the node and umprov does not step in.
OUT_OF_SERVICE = {"DOWN", "FUTURE", "UNKNOWN", "ERROR"}
# Keys scontrol prints after Reason= (its value may hold spaces, even "word=" text).
AFTER_REASON = ("Comment", "Extra", "InstanceId", "InstanceType", "ReservationName")
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*)=")
_SET_BY = re.compile(r"\s*\[[^\s\[\]@]+@\d{4}-\d\d-\d\dT[\d:]+\]")  # " [root@2024-03-01T10:06:00]"


@dataclass(frozen=True)
class Node:
    """One node as scontrol shows it: base state, state flags, reason (who set it removed)."""

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""

    @property
    def drained(self) -> bool:  # DRAIN: drained (idle) or draining (jobs still running)
        return "DRAIN" in self.flags

    @property
    def busy(self) -> bool:
        return self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags

    @property
    def out_of_service(self) -> bool:
        return self.state in OUT_OF_SERVICE or bool({"NOT_RESPONDING", "FAIL"} & self.flags)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(PREFIX)

    @property
    def held(self) -> bool:
        return self.reason.startswith(HOLD)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": "+".join([self.state, *sorted(self.flags)]),
                "reason": self.reason}


def parse_fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol show ... -o`` line; values may hold spaces."""
    found = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    skip_to = 0
    for i, m in enumerate(found):
        if m.start() < skip_to:
            continue
        key = m.group(1)
        rest = found[i + 1:]
        if key == "Reason":  # free text: up to the next key scontrol prints after it
            rest = [n for n in rest if n.group(1) in AFTER_REASON]
        end = rest[0].start() if rest else len(line)
        out[key] = line[m.end():end].strip()
        skip_to = end
    return out


def parse_node(line: str) -> Node:
    """A Node from one ``scontrol show node -o NAME`` line; ValueError when it is not one."""
    fields = parse_fields(line.strip())
    if "NodeName" not in fields or "State" not in fields:
        raise ValueError(f"not a scontrol node line: {line.strip()[:120]!r}")
    base, *flags = fields["State"].upper().split("+")
    if base.endswith("*"):  # older scontrol: "DOWN*" for a node that does not respond
        flags.append("NOT_RESPONDING")
    reason = _SET_BY.sub("", fields.get("Reason", ""), count=1)
    return Node(fields["NodeName"], base.rstrip("*~#!%$@^"), frozenset(flags),
                " ".join(reason.split()))


# -- reasons
def short_check(check: str) -> str:
    """The check's name in a reason: the family prefix the target already says dropped."""
    for prefix in ("gpu.", "host."):
        if check.startswith(prefix):
            return check[len(prefix):]
    return check


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or abs(value) >= 100:
        return str(round(value))
    return f"{value:.3g}"


def describe(rec: dict) -> str:
    """``gpu3 hbm_copy 2100 GB/s < 2990``: target, check, and what was measured against what."""
    parts = [rec["target"], short_check(rec["check"])]
    measured, limit = rec.get("measured"), rec.get("limit")
    if isinstance(measured, (int, float)) and not isinstance(measured, bool):
        parts.append(_number(measured) + (f" {rec['unit']}" if rec.get("unit") else ""))
        if isinstance(limit, (int, float)):
            op = "<" if measured < limit else (">" if measured > limit else "=")
            parts.append(f"{op} {_number(limit)}")
    elif isinstance(measured, str) and measured:
        parts.append(measured)
    elif measured is None and rec.get("detail"):
        parts.append(rec["detail"].split(";")[0])
    return " ".join(parts)


def clean(text: str) -> str:
    """One line of printable ASCII without quotes: safe in sinfo, logs and shell scripts."""
    kept = "".join(c if c.isascii() and c.isprintable() and c not in "\"'`" else " "
                   for c in text)
    return " ".join(kept.split())


def fit(text: str, suffix: str = "") -> str:
    """``text`` + ``suffix`` within MAX_REASON characters; the start of ``text`` is kept."""
    text, suffix = clean(text), clean(suffix)
    room = MAX_REASON - len(suffix) - (1 if suffix else 0)
    if len(text) > room:
        text = text[: room - 3].rstrip() + "..."
    return f"{text} {suffix}" if suffix else text


def failing(doc: dict) -> list[dict]:
    return [r for r in doc.get("records", []) if r.get("verdict") == "fail"]


def reason_for(doc: dict) -> str | None:
    """The drain reason a host report gives: its first failing check; None when none fails."""
    fails = failing(doc)
    if not fails:
        return None
    return fit(f"{PREFIX} {describe(fails[0])}", f"(+{len(fails) - 1})" if len(fails) > 1 else "")


def hold_reason(what: str) -> str:
    return fit(f"{HOLD} {what}")


def drained_for(reason: str) -> tuple[str, str] | None:
    """(target, check) of a reason umprov wrote for a failing check; None for anything else."""
    if not reason.startswith(PREFIX) or reason.startswith(HOLD):
        return None
    words = reason[len(PREFIX):].split()
    return (words[0], words[1]) if len(words) >= 2 else None


def covers(doc: dict, reason: str) -> bool:
    """Whether this run ran, and passed, the check that ``reason`` drained the node for."""
    what = drained_for(reason)
    if what is None:
        return False
    target, check = what
    for r in doc.get("records", []):
        if r.get("verdict") not in ("pass", "warn"):
            continue
        if r["target"] == target and short_check(r["check"]) == check:
            return True
        if check.startswith("xid.") and r["check"] == "host.xid":  # no Xid at all this boot
            return True
    return False


# -- decisions
@dataclass(frozen=True)
class Action:
    """What to do to the node: ``drain`` (with ``reason``), ``resume`` or ``leave``; ``why``
    says it in words."""

    kind: str
    why: str
    reason: str | None = None


def leave(why: str) -> Action:
    return Action("leave", why)


def decide(node: Node, doc: dict, *, gate: bool = False) -> Action:
    """After a check: the health check's rule, or (``gate``) a rolling change's gate, which
    also releases its own hold. ``doc`` is the host report of the run."""
    new = reason_for(doc)
    if node.out_of_service:
        return leave(f"{node.state}: Slurm runs nothing there; left to the administrator")
    if node.drained and not node.ours:
        return leave(f"drained by someone else ({node.reason or 'no reason'}): left as it is")
    if node.held and not gate:
        return leave("held by a rolling change: its gate decides")
    if new:
        if node.drained and drained_for(node.reason) == drained_for(new):
            return leave(f"already drained for {' '.join(drained_for(new) or ())}")
        return Action("drain", f"{len(failing(doc))} check(s) failed", new)
    if not node.drained:
        return leave("in service, and the checks passed")
    if node.held:
        return Action("resume", "the rolling change's gate passed")
    if covers(doc, node.reason):
        return Action("resume", "the check it was drained for passed")
    return leave(f"drained by umprov for a check this run did not pass ({node.reason})")


def decide_hold(node: Node, what: str, *, only_if_held: bool = False) -> Action:
    """Before a rolling change: hold the node (drain with the rolling reason) unless someone
    else drained it or a failing check did (those reasons stay). ``only_if_held``: relabel an
    existing hold (a failed step), never drain a node in service."""
    if node.out_of_service:
        return leave(f"{node.state}: nothing runs there")
    if node.drained and not node.ours:
        return leave(f"drained by someone else ({node.reason or 'no reason'}): kept")
    if node.drained and not node.held:
        return leave(f"drained by umprov for a failing check: kept ({node.reason})")
    if only_if_held and not node.held:
        return leave("not held by a rolling change")
    return Action("drain", "held for a rolling change", hold_reason(what))
