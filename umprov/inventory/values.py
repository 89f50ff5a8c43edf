"""The checks of one deployed container's values (its image, name, GPUs and bind address): one
set of rules, applied by `umprov inventory check` and every command that loads an inventory (the
host variables umprov_image, umprov_container_name, umprov_gpus, umprov_bind: exit 3, before any
host is touched) and by `umprov deploy` (--image, --name, --gpus, --bind: exit 4).

Each check takes the value and ``what`` to call it in its one-line ConfigError (an option such
as ``--bind``, or a host's variable), and returns the value as deploy uses it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from umprov.errors import ConfigError


def parse_gpus(value: str, what: str = "--gpus") -> str | list[str]:
    """'all', 'none', or a list of GPU indexes / UUIDs ('0,1', 'GPU-3f2a...')."""
    text = str(value).strip().lower()
    if text in ("all", "none"):
        return text
    items = [i.strip() for i in str(value).split(",") if i.strip()]
    if not items:
        raise ConfigError(f"{what} is empty: use all, none, or a list such as 0,1")
    for item in items:
        if not (
            (item.isascii() and item.isdigit() and len(item) <= 4)
            or re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z-]+", item, re.ASCII)
        ):
            raise ConfigError(
                f"{what}: '{item[:40]}' is not a GPU index or UUID (use all, none, or e.g. 0,1)"
            )
    if len(set(items)) != len(items):
        raise ConfigError(f"{what} lists a GPU twice: {str(value)[:80]}")
    return items


# Docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest].
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?"
)
_IMAGE_REF = re.compile(
    rf"(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def check_image(value: str, what: str = "--image") -> str:
    """An image reference Docker accepts (name[:tag][@digest]) or an image ID (sha256:...)."""
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{what} is empty: give an image such as umprov/pytorch-cuda:0.1.0")
    if len(text) > 512 or not (
        _IMAGE_REF.fullmatch(text) or re.fullmatch(r"sha256:[0-9a-f]{64}", text)
    ):
        raise ConfigError(
            f"{what}: {text[:80]!r} is not an image reference (e.g. umprov/pytorch-cuda:0.1.0)"
        )
    return text


def check_container_name(value: str, what: str) -> str:
    """A name Docker accepts for a container."""
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}", str(value), re.ASCII):
        raise ConfigError(f"{what}: {str(value)[:80]!r} is not valid as a container name "
                          "(letters, digits, and _ . - after the first)")
    return str(value)


def check_bind(value: str, what: str = "--bind") -> str:
    """An IP address to publish ports on (``[::1]`` as ``::1``)."""
    try:
        return str(ipaddress.ip_address(str(value).strip("[]")))
    except ValueError:
        raise ConfigError(f"{what} must be an IP address (e.g. 127.0.0.1), not "
                          f"{str(value)[:80]!r}") from None


# The host variable -> its check (deploy.options.settings_for reads the same variables).
VARIABLE_CHECKS: dict[str, Callable[[str, str], Any]] = {
    "umprov_image": check_image,
    "umprov_container_name": check_container_name,
    "umprov_gpus": parse_gpus,
    "umprov_bind": check_bind,
}


def value_problem(variable: str, value: Any, what: str) -> str | None:
    """What is wrong with a host's ``variable`` set to ``value`` (a line naming ``what``), or
    None when it is fine, unset (None or "", as deploy takes them: the default) or not one of
    the variables checked here."""
    check = VARIABLE_CHECKS.get(variable)
    if check is None or value is None or value == "":
        return None
    try:
        check(str(value), what)
    except ConfigError as exc:
        return str(exc)
    return None
