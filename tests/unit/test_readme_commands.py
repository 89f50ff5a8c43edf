"""README's command table shows each option as it is typed: one that takes a value is shown
with it (`--html FILE`, not a bare `--html`) (issue 37, item 5 a)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from umprov.cli import cli as main

README = Path(__file__).resolve().parents[2] / "README.md"


def _rows() -> list[tuple[list[str], str]]:
    """(the command's words, the rest of its row) of each row of README's Commands table."""
    text = README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        match = re.match(r"\| `umprov ([a-z ]+)[^`]*` \|(.*)", line)
        if match:
            rows.append((match.group(1).split(), match.group(2)))
    return rows


def test_every_bare_option_in_the_command_table_is_a_flag() -> None:
    ctx = click.Context(main)
    rows = _rows()
    assert any(words == ["report"] for words, _ in rows)
    for words, rest in rows:
        command: click.Command | None = main
        for word in words:
            if isinstance(command, click.Group) and word in command.list_commands(ctx):
                command = command.get_command(ctx, word)
        assert command is not None
        by_name = {n: p for p in command.params for n in getattr(p, "opts", [])}
        for name in re.findall(r"`(--[a-z-]+)`", rest):
            param = by_name.get(name)
            if isinstance(param, click.Option):
                assert param.is_flag or param.count, f"umprov {' '.join(words)}: {name} needs a value"
