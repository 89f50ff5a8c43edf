"""The environment a host's container is given (``umprov_env``, ``umprov deploy --env``): the
one set of rules, applied by `umprov inventory check` (the host variable: exit 3) and by
`umprov deploy` (an option: exit 4).

- names a shell takes (letters, digits, ``_``; not a digit first);
- no name the container's spec or the image's entrypoint owns (the login key, Jupyter's
  settings, the managed-memory switch: ``--managed-memory`` / ``umprov_managed_memory``);
- values of one line: the entrypoint hands them to SSH logins through sshd's ``SetEnv``,
  which cannot hold a line break;
- nothing the managed-memory pool cannot run with: PyTorch's ``cudaMallocAsync`` backend
  (a process has one allocator; the pool needs the native caching one), or
  ``max_split_size_mb`` (PyTorch would never split the pool's one large block);
- the pool's own settings (``UMPROV_MANAGED_*``) as the pool reads them, by the pool's own
  rules (docker/pytorch-cuda/managed/umprov_managed_conf.py): a size that is not one would
  leave the pool off, ``UMPROV_MANAGED_GRADS_DOWN=off`` would be read as on.

Values may be secrets (``HF_TOKEN``): no message shows one, except the allocator setting that
clashes with the pool and the pool's own settings, which are named so that they can be found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from types import ModuleType
from typing import Any

from umprov.paths import content_module

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Set by deploy's spec or read by the image's entrypoint: another value would break the login,
# leak into sshd or Jupyter, or bypass the switch that deploy reports.
OWNED = frozenset({
    "SSH_AUTHORIZED_KEYS", "SSH_AUTHORIZED_KEYS_FILE", "SSH_ALLOW_AGENT_FORWARDING", "SSH_PORT",
    "UMPROV_USER", "UMPROV_MANAGED_MEMORY",
})
OWNED_PREFIXES = ("JUPYTER_",)
# PyTorch's allocator settings (PYTORCH_ALLOC_CONF is the newer name of the same setting).
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_ASYNC_BACKEND = re.compile(r"(?:^|,)\s*backend\s*:\s*cudaMallocAsync\s*(?:,|$)")
_MAX_SPLIT = re.compile(r"(?:^|,)\s*max_split_size_mb\s*:")


def env_value(name: str, value: Any) -> str:
    """A value as the container gets it: text, a number written as text; anything else is a
    ValueError saying why (never showing the value)."""
    if isinstance(value, bool) or value is None:
        shown = "empty" if value is None else f"the boolean {str(value).lower()}"
        raise ValueError(f"{name} is {shown}: quote the value to give text (e.g. '\"true\"')")
    if not isinstance(value, str | int | float):
        raise ValueError(f"{name} must be text, not a {type(value).__name__}")
    return str(value)


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a variable of the container's environment, or None."""
    if not _NAME.fullmatch(name):
        return (f"{name[:60]!r} is not a variable name (letters, digits and _, not a digit "
                "first)")
    if name == "UMPROV_MANAGED_MEMORY":
        return f"{name} is deploy's own: use --managed-memory or umprov_managed_memory"
    if name in OWNED or name.startswith(OWNED_PREFIXES):
        return f"{name} is set by umprov's container spec and cannot be given"
    return None


def env_problem(env: Mapping[str, Any], managed: bool) -> str | None:
    """The first problem of a container environment (with the pool on or off), or None."""
    for name, value in env.items():
        problem = name_problem(str(name))
        if problem:
            return problem
        try:
            text = env_value(str(name), value)
        except ValueError as exc:
            return str(exc)
        if any(c in text for c in "\n\r\0"):
            return (f"the value of {name} holds a line break or NUL, which an SSH login into "
                    "the container cannot be given")
        if str(name).startswith("UMPROV_MANAGED_"):
            problem = _pool_settings().setting_problem(str(name), text)
            if problem:
                return problem
    return pool_clash(env) if managed else None


@cache
def _pool_settings() -> ModuleType:
    """The pool's own rules for its settings: the file the image carries, loaded as it is
    (the standard library only), so that umprov and the pool read a setting alike."""
    return content_module("umprov_managed_conf", "docker", "pytorch-cuda", "managed",
                          "umprov_managed_conf.py")


def pool_clash(env: Mapping[str, Any]) -> str | None:
    """The allocator setting the managed-memory pool cannot run with, named, or None."""
    for name in ALLOC_CONF:
        value = str(env.get(name) or "")
        if _ASYNC_BACKEND.search(value):
            return (f"{name}={value[:80]!r} with managed memory on: the pool needs PyTorch's "
                    "native caching allocator (drop backend:cudaMallocAsync, or switch managed "
                    "memory off)")
        if _MAX_SPLIT.search(value):
            return (f"{name}={value[:80]!r} with managed memory on: PyTorch would never split "
                    "the pool's one large block (drop max_split_size_mb, or switch managed "
                    "memory off)")
    return None


def checked_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The environment as the container gets it (names and values as text); check it with
    ``env_problem`` first."""
    return {str(name): env_value(str(name), value) for name, value in env.items()}
