"""Live progress for provisioning: a rich table per host on a TTY, plain lines otherwise."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from umprov.cli._common import stderr_is_tty


class ProvisionProgress:
    """Consumes umprov.provision.Event objects; draws on stderr."""

    def __init__(self, hosts: Iterable[Any]) -> None:
        self.state: dict[str, dict[str, Any]] = {
            h.name: {"task": "waiting", "ok": 0, "changed": 0, "status": ""} for h in hosts
        }
        self.live: Any = None
        self.current_task = ""

    def __enter__(self) -> ProvisionProgress:
        if stderr_is_tty():
            from rich.live import Live

            from umprov.cli._common import stderr_console

            self.live = Live(self._table(), console=stderr_console(), refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(*exc)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"provisioning: {self.current_task}", title_justify="left")
        for col in ("host", "ok", "changed", "status", "last task"):
            table.add_column(col)
        for host, st in sorted(self.state.items()):
            table.add_row(host, str(st["ok"]), str(st["changed"]), st["status"], st["task"])
        return table

    def update(self, event: Any) -> None:
        if event.kind in {"task_start", "play"}:
            self.current_task = event.task
            if self.live is None and event.kind == "play":
                click.echo(f"PLAY {event.task}", err=True)
            elif self.live is None:
                click.echo(f"  task: {event.task}", err=True)
        elif event.host:
            st = self.state.setdefault(
                event.host, {"task": "", "ok": 0, "changed": 0, "status": ""}
            )
            st["task"] = event.task
            if event.kind in {"ok", "changed"}:
                st["ok"] += 1
            if event.kind == "changed":
                st["changed"] += 1
            if event.kind in {"failed", "unreachable"}:
                st["status"] = event.kind
                if self.live is None:
                    click.echo(
                        f"  {event.host}: {event.kind}: {event.task}: {event.message}", err=True
                    )
        if self.live is not None:
            self.live.update(self._table())
