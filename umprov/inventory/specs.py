"""umprov's inventory variables and their types: UMPROV_VARIABLES plus every role's
meta/argument_specs.yml (the one definition of role variables, which Ansible's role validation
reads too), and the small helpers that judge and print a value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from umprov.errors import EnvironmentProblem, InventoryError
from umprov.paths import content_file

# umprov's own inventory variables (the roles' variables come from their argument_specs).
# name -> (argument_specs type, description)
UMPROV_VARIABLES: dict[str, tuple[str, str]] = {
    "umprov_gpus": ("str", "GPUs given to the container: all, none, or a list such as 0,1"),
    "umprov_expected_gpus": ("int", "number of GPUs verify expects on the host"),
    "umprov_gpu_profile": ("str", "verifier profile name, overriding detection by GPU model"),
    "umprov_known_hosts": ("path", "known_hosts file holding this host's SSH host key"),
    "umprov_authorized_key": (
        "path",
        "public key allowed to log in to the container (deploy --authorized-key wins; default "
        "~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub); a lab's inventory names its own",
    ),
    "umprov_container_name": ("str", "name of the deployed container"),
    "umprov_image": ("str", "PyTorch-CUDA image to deploy on this host"),
    "umprov_ssh_port": ("int", "host port published for SSH into the container"),
    "umprov_jupyter_port": ("int", "host port published for Jupyter"),
    "umprov_bind": ("str", "address the container's ports are published on"),
    "umprov_nccl_socket_ifname": ("str", "NCCL_SOCKET_IFNAME for multi-node verification"),
    "umprov_nccl_ib_hca": ("str", "NCCL_IB_HCA for multi-node verification"),
    "umprov_nccl_debug": ("str", "NCCL_DEBUG level recorded in verify reports"),
    "umprov_rendezvous_port": ("int", "torchrun rendezvous port on the first host"),
    "umprov_internode_busbw_gbps": ("float", "expected inter-node all_reduce bus bandwidth"),
    "umprov_managed_memory": (
        "bool",
        "PyTorch in the container allocates CUDA managed memory (docs/managed-memory.md); "
        "default false",
    ),
    "umprov_env": (
        "dict",
        "more environment for the container, NAME: value (docs/deploy-variables.md); its "
        "values may be secrets (vault them): umprov never prints one",
    ),
    "umprov_container_limits": (
        "bool",
        "raise the memlock and stack limits NCCL wants in umprov's containers (default true; "
        "needs CAP_SYS_RESOURCE, which the lab's hosts lack)",
    ),
    # playbooks/rolling.yml (docs/slurm.md); the first three only with -e (Ansible's serial)
    "umprov_rolling_canary": ("int", "hosts in the rollout's first (canary) batch; default 1"),
    "umprov_rolling_batch": ("str", "hosts in each later batch: a count, a percent, a list; 25%"),
    "umprov_rolling_max_fail_percentage": ("int", "failed hosts of a batch that stop it; 0"),
    "umprov_rolling_roles": ("list", "the roles a rolling change runs on each host"),
    "umprov_rolling_verify": ("str", "the gate after the change: passive, quick or full"),
    "umprov_rolling_drain_timeout": ("int", "seconds to wait for a held node's jobs; 3600"),
    "umprov_rolling_skip_current": ("bool", "leave hosts already at the target alone; true"),
    "umprov_rolling_reason": ("str", "what the hold reason names; default 'driver change'"),
}

# Prefixes that mark a variable as umprov's: umprov_ plus each role's name.
UMPROV_PREFIX = "umprov_"

# Integers past this are refused: Python will not even print one of more than 4300 digits.
_MAX_INT = 2**64


@dataclass(frozen=True)
class VarSpec:
    name: str
    type: str
    owner: str  # role name, or "umprov"
    choices: tuple[Any, ...] = ()


@cache
def variable_specs(roles_dir: Path | None = None) -> dict[str, VarSpec]:
    """Every known umprov variable: UMPROV_VARIABLES plus each role's argument_specs."""
    import yaml

    specs = {name: VarSpec(name, typ, "umprov") for name, (typ, _desc) in UMPROV_VARIABLES.items()}
    folder = roles_dir or content_file("roles")
    spec_files = sorted(folder.glob("*/meta/argument_specs.yml"))
    if roles_dir is None and not spec_files:
        raise EnvironmentProblem(f"{folder}: no role argument specs; reinstall umprov")
    for spec_file in spec_files:
        role = spec_file.parent.parent.name
        try:
            data = yaml.safe_load(spec_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise InventoryError(f"{spec_file}: cannot read argument specs: {exc}") from None
        for entry in (data.get("argument_specs") or {}).values():
            for name, opt in ((entry or {}).get("options") or {}).items():
                opt = opt or {}
                specs[name] = VarSpec(
                    name, str(opt.get("type", "str")), role, tuple(opt.get("choices") or ())
                )
    return specs


def umprov_prefixes(specs: Mapping[str, VarSpec]) -> tuple[str, ...]:
    roles = {s.owner for s in specs.values() if s.owner != "umprov"}
    return (UMPROV_PREFIX, *sorted(f"{r}_" for r in roles))


def is_ascii_number(text: str) -> bool:
    """Digits 0-9 only ('²' and other Unicode digits are not numbers to int())."""
    return text.isascii() and text.isdigit() and len(text) <= 20


def too_big(value: Any) -> bool:
    """An integer (anywhere inside value) too large to be a real setting, or to print."""
    if isinstance(value, int) and not isinstance(value, bool):
        return not -_MAX_INT < value < _MAX_INT
    if isinstance(value, Mapping):
        return any(too_big(k) or too_big(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(too_big(v) for v in value)
    return False


# How Ansible writes booleans in inventories (an INI value stays a string).
_TRUE = frozenset({"yes", "true", "1", "on", "y"})
_FALSE = frozenset({"no", "false", "0", "off", "n"})


DEFAULT_CONTAINER = "umprov"


def deployed_container(host_vars: Mapping[str, Any] | None) -> str:
    """The name of the container deploy made on a host (umprov_container_name)."""
    return str((host_vars or {}).get("umprov_container_name") or DEFAULT_CONTAINER)


def flag(value: Any, default: bool) -> bool:
    """A boolean inventory variable: True, "yes", "on"... or ``default`` when unset."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() not in _FALSE


def type_ok(value: Any, typ: str) -> bool:
    """Whether ``value`` (templated already) has the argument_specs type ``typ``."""
    match typ:
        case "int":
            return (
                isinstance(value, int)
                and not isinstance(value, bool)
                or (isinstance(value, str) and is_ascii_number(value.strip().lstrip("-")))
            )
        case "float":
            if isinstance(value, bool | int):
                return not isinstance(value, bool)
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                return False
            return math.isfinite(number)
        case "bool":
            return isinstance(value, bool) or str(value).lower() in _TRUE | _FALSE
        case "list":
            return isinstance(value, list | tuple | str)
        case "dict":
            return isinstance(value, dict)
        case "str" | "path":
            return isinstance(value, str | int | float) and not isinstance(value, bool)
    return True  # raw and anything else


def plain(value: Any) -> Any:
    """Strip Ansible's tagged types back to plain Python values (for JSON and comparisons)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def type_name(value: Any) -> str:
    return type(value).__name__.removeprefix("_AnsibleTagged").lower()


def short(value: Any, limit: int = 40) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and too_big(value):
        return f"an integer of {value.bit_length()} bits"
    try:
        text = str(value)
    except ValueError:  # a huge integer inside a list or mapping
        text = f"a {type_name(value)}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
