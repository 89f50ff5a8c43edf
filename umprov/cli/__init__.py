"""The umprov command line: a lazily loaded Click group and the one error boundary.

Each command lives in its own module, imported only when that command (or its help) is
needed; heavy libraries (ansible, ansible_runner, docker, paramiko, rich) are imported inside
command functions, so ``umprov --help`` stays fast. Other distributions add commands through
the entry point group ``umprov.commands`` (the lab registers ``lab`` there), loaded
only when that command runs or its own help is asked for.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import click

from umprov import __version__
from umprov.cli import plugins
from umprov.cli.plugins import Plugin
from umprov.errors import EnvironmentProblem, ExitCode, Terminated, UmprovError

# name -> "module:attribute"; the order here is the order in --help.
COMMANDS: dict[str, str] = {
    "provision": "umprov.cli.provision:provision",
    "deploy": "umprov.cli.deploy:deploy",
    "verify": "umprov.cli.verify:verify",
    "report": "umprov.cli.report:report",
    "status": "umprov.cli.status:status",
    "trust": "umprov.cli.trust:trust",
    "image": "umprov.cli.image:image",
    "inventory": "umprov.cli.inventory:inventory",
}


def plugin_commands() -> dict[str, Plugin]:
    """Commands other distributions add (entry point group ``umprov.commands``), by name; a
    built-in command's name is never taken over, and the first of a name wins."""
    found: dict[str, Plugin] = {}
    for plugin in plugins.installed():
        if plugin.name not in COMMANDS:
            found.setdefault(plugin.name, plugin)
    return found


def _load_plugin(plugin: Plugin) -> click.Command:
    try:
        command = plugin.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is a prerequisite problem
        raise EnvironmentProblem(
            f"the command {plugin.name!r} from {plugin.source} cannot be loaded: {exc}"
        ) from None
    if not isinstance(command, click.Command):
        raise EnvironmentProblem(
            f"the command {plugin.name!r} from {plugin.source} is not a Click command")
    return command


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self._lazy, *sorted(plugin_commands()), *sorted(super().list_commands(ctx))]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attr = self._lazy[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in (plugins := plugin_commands()):
            command = _load_plugin(plugins[cmd_name])
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's, with the lazy and plugin commands among the suggestions for a typo (Click
        suggests from the commands it has loaded, none of them here)."""
        name = args[0] if args else ""
        if (args and not ctx.resilient_parsing and not name.startswith("-")
                and self.get_command(ctx, name) is None):
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
            ctx.fail(f"No such command {name!r}." + (f" Did you mean {close[0]!r}?" if close
                                                      else ""))
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's list of commands, except that a plugin is named, not loaded."""
        plugins = plugin_commands()
        commands: list[tuple[str, click.Command | None]] = []
        for name in self.list_commands(ctx):
            command = None if name in plugins else self.get_command(ctx, name)
            if name in plugins or (command is not None and not command.hidden):
                commands.append((name, command))
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        rows = [
            (name, command.get_short_help_str(limit) if command else _plugin_help(plugins[name]))
            for name, command in commands
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _plugin_help(plugin: Plugin) -> str:
    return f"Commands from {plugin.source} (umprov {plugin.name} --help)."


def _stack_versions() -> list[tuple[str, str]]:
    from importlib import metadata

    rows = [("umprov", __version__)]
    for dist in ("ansible-core", "ansible-runner", "docker", "paramiko", "click", "rich"):
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            rows.append((dist, "not installed"))
    rows.append(("python", sys.version.split()[0]))
    return rows


def _content_row() -> tuple[str, str]:
    """Where the playbooks and roles come from: a project, a clone, or the installed wheel."""
    from umprov.errors import UmprovError
    from umprov.paths import content_dir

    try:
        return ("playbooks and roles", str(content_dir()))
    except UmprovError as exc:
        return ("playbooks and roles", f"missing: {exc}")


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    for name, version in [*_stack_versions(), _content_row()]:
        click.echo(f"{name} {version}")
    ctx.exit(ExitCode.OK)


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the versions of umprov and the stack underneath, then exit.",
)
def cli() -> None:
    """Provision GPU hosts, deploy a PyTorch-CUDA container, prove every GPU healthy.

    \b
    umprov lab up                      simulated GPU hosts in local containers
    umprov provision hosts             drivers, Docker, NVIDIA Container Toolkit
    umprov deploy hosts                the PyTorch-CUDA container with SSH and Jupyter
    umprov verify hosts                managed-memory, NCCL and health checks per GPU

    INVENTORY arguments take what ansible-playbook -i takes, or a name under inventory/.
    """


# options whose KEY=VALUE may carry a secret: provision's extra vars, the container's --env
SECRET_VALUED = ("--extra-vars", "--env")


def redacted_argv(argv: list[str]) -> list[str]:
    """argv for a crash log: every -e/--extra-vars/--env value blanked (KEY=VALUE may carry a
    password; an @FILE is only a path and stays)."""

    def blank(value: str) -> str:  # KEY=VALUE pairs keep their keys; inline JSON goes whole
        if value.startswith("@") or ("=" not in value and value[:1] not in "{["):
            return value  # a file's path, or --env KEY (its value is this shell's)
        if value.lstrip()[:1] in "{[":
            return "<redacted>"
        return " ".join(f"{word.partition('=')[0]}=<redacted>" for word in value.split())

    out: list[str] = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        if out and out[-1] in ("-e", *SECRET_VALUED):
            arg = blank(arg)
        elif sep and name in SECRET_VALUED:
            arg = f"{name}={blank(value)}"
        elif arg.startswith("-e") and not arg.startswith("--") and len(arg) > 2:
            arg = "-e" + blank(arg[2:])
        out.append(arg)
    return out


def _log_internal_error(exc: BaseException) -> Path | None:
    try:
        from umprov.paths import state_dir, write_private

        log_dir = state_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = log_dir / f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        versions = "\n".join(f"{n} {v}" for n, v in _stack_versions())
        body = f"argv: {redacted_argv(sys.argv)!r}\n{versions}\n\n" + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
        write_private(path, body)
        return path
    except OSError:
        return None


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


def run(args: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; the one error boundary."""
    try:
        result = cli.main(args=args, prog_name="umprov", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("umprov: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help, as Click does
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:  # bad command line: one line, like every other error
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        click.echo(f"umprov: error: {' '.join(exc.format_message().split())}{hint}", err=True)
        if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
            return ExitCode.CONFIG  # a value Click's types refuse is a bad value, as ours are
        return exc.exit_code
    except UmprovError as exc:
        for line in exc.lines():
            click.echo(f"umprov: error: {line}", err=True)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("umprov: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except Terminated as exc:
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone already
            click.echo(f"umprov: terminated ({exc.signame})", err=True)
        return exc.exit_code
    except BrokenPipeError:
        return ExitCode.OK
    except Exception as exc:  # the boundary: anything unexpected is a bug, reported once
        log = _log_internal_error(exc)
        where = f"; details in {log}" if log else ""
        click.echo(
            f"umprov: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}{where}",
            err=True,
        )
        return ExitCode.INTERNAL
    return int(result or 0)


def main() -> None:
    if threading_is_main():
        signal.signal(signal.SIGTERM, _on_sigterm)
        # A closed terminal or dropped SSH session: stop as on SIGTERM, with the clean-up
        # (Python's default would end umprov at once and leave ansible-playbook running).
        if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
            signal.signal(signal.SIGHUP, _on_sigterm)
    leave(run())


# How long an interrupted run waits for other threads before it leaves without them.
EXIT_GRACE_S = 5.0


def leave(code: int) -> None:
    """Exit with ``code``. After a signal (code 128 and above) the run's clean-up is done, and
    the interpreter's exit would wait for every thread that is not a daemon, without bound:
    ansible-runner's, still reading a killed playbook's last output and writing its artifacts,
    took over a minute on a starved machine. Those get EXIT_GRACE_S, then are left."""
    if code >= 128:
        import threading

        from umprov.procs import wait_thread

        others = [t for t in threading.enumerate()
                  if t is not threading.current_thread() and not t.daemon]
        deadline = time.monotonic() + EXIT_GRACE_S
        for thread in others:
            wait_thread(thread, max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in others):
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
