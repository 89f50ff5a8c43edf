"""Click options every command shares, and that plugin commands (umprov-lab) use too."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print the result as JSON on stdout."
    )(func)


def not_blank(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A Click callback: a host, name or pattern given as "" or spaces (``--limit "$UNSET"``)
    is a ConfigError naming the option, never every host or none."""
    if value is not None and not value.strip():
        from umprov.errors import ConfigError

        name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
        groups = " or a group ('all': every host)" if param.metavar == "PATTERN" else ""
        raise ConfigError(f"{name} is empty: name a host{groups}")
    return value


def limit_option(*aliases: str) -> Callable[[F], F]:
    """``--limit/-l PATTERN``, the same in every command that runs on hosts: an Ansible
    pattern, as ansible-playbook's --limit takes it (Inventory.select)."""
    return click.option(
        "--limit", "-l", *aliases, "limit", metavar="PATTERN", callback=not_blank,
        help="Only these hosts, as ansible-playbook --limit takes them: names, groups, globs, "
        "~regex, a:b, a:!b (but not), a:&b (and), group[0], @FILE; all: every host"
        + (f" ({', '.join(aliases)} is the same)." if aliases else "."))


def inventory_options(*, positional: bool = True) -> Callable[[F], F]:
    """The inventory, given the same way in every command, as ansible-playbook takes it:
    ``-i/--inventory`` (repeatable; with ``positional``, the first may also be the command's
    first argument) and the vault options. The command gets one ``inventory`` parameter, an
    umprov.inventory.InventoryRequest whose vault prompt reads the terminal."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, inventory_arg: str | None = None,
                    inventory_opts: tuple[str, ...] = (), vault_ids: tuple[str, ...] = (),
                    vault_password_files: tuple[str, ...] = (), ask_vault_pass: bool = False,
                    **kwargs: Any) -> Any:
            from umprov.inventory import InventoryRequest

            sources = ((inventory_arg,) if inventory_arg else ()) + tuple(inventory_opts)
            kwargs["inventory"] = InventoryRequest(
                sources=sources, vault_ids=tuple(vault_ids),
                vault_password_files=tuple(vault_password_files), ask_vault_pass=ask_vault_pass,
                prompt=ask_vault_password,
            )
            return func(*args, **kwargs)

        options = [
            click.option("-i", "--inventory", "inventory_opts", multiple=True,
                         metavar="INVENTORY", help="Inventory source, as ansible-playbook -i "
                         "takes it (repeatable): a file, a folder, a comma list such as "
                         "gpu1,gpu2, or a name under inventory/; default: ansible.cfg's."),
            click.option("--vault-id", "vault_ids", multiple=True, metavar="LABEL@SOURCE",
                         help="Vault identity: LABEL@FILE (a password file or script) or "
                         "LABEL@prompt (repeatable)."),
            click.option("--vault-password-file", "--vault-pass-file", "vault_password_files",
                         multiple=True, metavar="FILE",
                         help="File (or script) holding the vault password (repeatable)."),
            click.option("-J", "--ask-vault-pass", "--ask-vault-password", "ask_vault_pass",
                         is_flag=True, help="Ask for the vault password."),
        ]
        if positional:
            options.insert(0, click.argument("inventory_arg", required=False,
                                             metavar="[INVENTORY]"))
        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return decorated

    return decorate


def ask_vault_password(label: str) -> str:
    """A vault password read from the terminal, not echoed."""
    return _read_secret(f"Vault password ({label})", "--vault-password-file")


def ask_become_password() -> str:
    """The privilege escalation (sudo) password, read from the terminal, not echoed."""
    return _read_secret("BECOME password", "ansible_become_password in a vault")


def _read_secret(prompt: str, instead: str) -> str:
    """A password from the terminal, or the first line of a pipe (getpass's own fallback,
    without its warning); a closed standard input is a one-line error, not Ctrl-C."""
    import getpass
    import warnings

    from umprov.errors import ConfigError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", getpass.GetPassWarning)
        try:
            return str(click.prompt(prompt, hide_input=True, err=True, default="",
                                    show_default=False))
        except click.Abort:
            if _terminal():
                raise  # Ctrl-C or Ctrl-D at a prompt on the terminal (getpass reads /dev/tty)
            raise ConfigError(f"{prompt}: standard input is not a terminal and ended before "
                              f"a password; use {instead}") from None


def _terminal() -> bool:
    """Whether this process has a terminal to prompt on (getpass's first choice)."""
    import os

    if sys.stdin is not None and sys.stdin.isatty():
        return True
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


def forks_option(func: F) -> F:
    """``--forks N``: hosts handled at once, as ansible-playbook names it."""
    return click.option(
        "--forks", "-f", type=click.IntRange(1, 100_000), metavar="N",
        help="Hosts handled at once (default 32; bounded by the open-file limit, which umprov "
        "raises to its hard limit first).")(func)


def fan_out_width(forks: int | None, hosts: int) -> int:
    """The hosts a command handles at once, saying so on stderr when the open-file limit
    bounds what --forks asked for."""
    from umprov.hosts.fanout import workers
    from umprov.output import say

    n, why = workers(forks, hosts)
    if why:
        say(f"umprov: {why}")
    return n


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange without NaN and the infinities: NaN passes Click's bounds (every
    comparison with it is false), and a NaN or infinite deadline never fires."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return float(number)
