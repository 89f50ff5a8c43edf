"""Output for programs and people, one home for every command's rendering.

stdout carries data (``--json``); stderr carries what people read (rich tables and progress,
drawn only on a TTY, plain text otherwise).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from umprov.hosts.render import Field
    from umprov.hosts.results import HostOutcome


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def stderr_console() -> Any:
    """A rich Console on stderr; colour and live display only on a TTY."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def say(message: str) -> None:
    """A line for people, on stderr."""
    click.echo(message, err=True)


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    styles: dict[str, str] | None = None,
) -> None:
    """A table for people on stderr: rich on a TTY, aligned plain text otherwise."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if stderr_is_tty():
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for col in columns:
            table.add_column(col, style=(styles or {}).get(col))
        for row in cells:
            table.add_row(*row)
        stderr_console().print(table)
        return
    widths = [max([len(col), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    click.echo("\n".join(lines), err=True)


def print_outcomes(title: str, outcomes: Sequence[HostOutcome], columns: Sequence[Field]) -> None:
    """The table of a command's host outcomes, one column per (header, getter)."""
    from umprov.hosts.render import rows

    print_table(title, [name for name, _ in columns], rows(outcomes, columns))


def say_problems(outcomes: Sequence[HostOutcome]) -> None:
    """'umprov: N of M host(s) failed, K of M unreachable' when some host's outcome is not a
    success: one word for each cause, the word its exit code means (and the table shows)."""
    counts = Counter(o.kind.value for o in outcomes if not o.ok)
    if counts:
        total = len(outcomes)
        say("umprov: " + ", ".join(
            f"{n} of {total} host(s) {_PROBLEM_WORDS.get(kind, kind)}"
            for kind, n in sorted(counts.items())
        ))


_PROBLEM_WORDS = {"warn": "warned"}  # every other kind is its own word (failed, unreachable)



def say_untrusted(outcomes: Sequence[HostOutcome]) -> None:
    """For each host whose SSH key is unknown or changed (exit 6), its one line: the same
    words in every command (umprov.hosts.ssh)."""
    from umprov.hosts.results import Kind

    for outcome in outcomes:
        if outcome.kind is Kind.UNTRUSTED:
            say(f"umprov: {outcome.host}: {outcome.detail}")
