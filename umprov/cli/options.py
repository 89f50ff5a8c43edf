"""Click options every command shares, and that plugin commands (umprov-lab) use too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


inventory_argument = click.argument("inventory", required=False, metavar="[INVENTORY]")


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print the result as JSON on stdout."
    )(func)

