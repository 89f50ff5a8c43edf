"""Live progress on stderr: a rich table per host on a TTY, plain lines otherwise.

ProvisionProgress consumes ansible-runner events; HostProgress takes one status line per host
(deploy, verify)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import click

from umprov.output import say, stderr_console, stderr_is_tty


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

            from umprov.output import stderr_console

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


class HostProgress:
    """Per-host progress on stderr: a live rich table on a TTY, throttled lines otherwise.

    Lines are written under the lock, and leaving the ``with`` block closes the sink under it:
    a worker thread that reports while an interrupt unwinds can never print after the CLI's
    last line ("umprov: terminated (SIGTERM)")."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts
        self.state = dict.fromkeys(hosts, "waiting")
        self.lock = threading.Lock()
        self.closed = False
        self.last_line: dict[str, float] = {}
        self.live: Any = None

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("host")
        table.add_column("progress")
        for host in self.hosts:
            table.add_row(host, self.state[host])
        return table

    def __enter__(self) -> HostProgress:
        if stderr_is_tty():
            from rich.live import Live

            self.live = Live(self._table(), console=stderr_console(), refresh_per_second=4,
                             transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.closed = True
            if self.live is not None:
                self.live.__exit__(*exc)

    def __call__(self, host: str, message: str) -> None:
        with self.lock:
            if self.closed:
                return
            self.state[host] = message
            if self.live is not None:
                self.live.update(self._table())
                return
            # Plain output: push progress at most every 10 s per host, everything else at once.
            now = time.monotonic()
            if "MB (" in message and now - self.last_line.get(host, 0.0) < 10:
                return
            self.last_line[host] = now
            say(f"{host}: {message}")
