"""Host outcomes for people and for programs: table rows and JSON records.

Each command lists its fields once, as (name, getter) pairs: the columns of its table, the
keys of its JSON records in their order. A getter that gives ABSENT leaves its key out of the
record (and its cell empty), for fields a host has only sometimes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from umprov.hosts.results import HostOutcome

Getter = Callable[[HostOutcome], Any]
Field = tuple[str, Getter]


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def host(o: HostOutcome) -> str:
    return o.host


def state(o: HostOutcome) -> str:
    return o.state


def detail(o: HostOutcome) -> str:
    return o.detail


def ok(o: HostOutcome) -> bool:
    return o.ok


def managed_memory(o: HostOutcome) -> str:
    """deploy's and status's cell for the managed-memory pool: on, off, or on in an image
    that does not carry the pool (its label says 0, or nothing)."""
    on = o.data.get("managed_memory")
    if on is None:
        return ""
    if not on:
        return "off"
    return "on" if o.data.get("managed_memory_pool") else "on (image has no pool)"


def datum(key: str, ndigits: int | None = None) -> Getter:
    """``data[key]`` (ABSENT when the host has none), floats rounded to ``ndigits``."""

    def get(o: HostOutcome) -> Any:
        value = o.data.get(key, ABSENT)
        if ndigits is not None and isinstance(value, float):
            return round(value, ndigits)
        return value

    return get


def data_fields(*keys: str) -> list[Field]:
    return [(key, datum(key)) for key in keys]


def records(outcomes: Iterable[HostOutcome], fields: Sequence[Field]) -> list[dict[str, Any]]:
    """One JSON object per host, keys in the order of ``fields``."""
    out = []
    for o in outcomes:
        values = ((name, get(o)) for name, get in fields)
        out.append({name: value for name, value in values if value is not ABSENT})
    return out


def rows(outcomes: Iterable[HostOutcome], columns: Sequence[Field]) -> list[list[Any]]:
    """One table row per host (None for an empty cell)."""
    return [[_cell(get(o)) for _, get in columns] for o in outcomes]


def _cell(value: Any) -> Any:
    return None if value is ABSENT else value
