"""Inventories: found, parsed by Ansible itself, validated, and turned into Host records.

This is the one place that reads inventories; provision, deploy, verify and status all take
the Host records made here. Parsing goes through Ansible's own InventoryManager, so YAML, INI,
folders with group_vars/host_vars and every precedence rule behave exactly as in
``ansible-playbook -i``. Validation adds what Ansible does not check: addresses, ports,
duplicate endpoints, and the names and types of umprov's variables, read from the roles'
meta/argument_specs.yml (the one source of truth for role variables) and UMPROV_VARIABLES.
"""

from __future__ import annotations

import configparser
import contextlib
import difflib
import io
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from umprov.errors import InventoryError
from umprov.paths import project_dir

# umprov's own inventory variables (the roles' variables come from their argument_specs).
# name -> (argument_specs type, description)
UMPROV_VARIABLES: dict[str, tuple[str, str]] = {
    "umprov_gpus": ("str", "GPUs given to the container: all, none, or a list such as 0,1"),
    "umprov_expected_gpus": ("int", "number of GPUs verify expects on the host"),
    "umprov_gpu_profile": ("str", "verifier profile name, overriding detection by GPU model"),
    "umprov_known_hosts": ("path", "known_hosts file holding this host's SSH host key"),
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
    "umprov_container_limits": ("bool", "raise the container's memlock and stack ulimits for "
                                "NCCL (needs CAP_SYS_RESOURCE on the host; default true)"),
}

# Prefixes that mark a variable as umprov's: umprov_ plus each role's name.
UMPROV_PREFIX = "umprov_"

# Integers past this are refused: Python will not even print one of more than 4300 digits.
_MAX_INT = 2**64

_CAUSE = re.compile(r"<<< caused by >>>\s*\n\s*\n(?P<msg>[^\n]+)(?:\nOrigin: (?P<origin>[^\n]+))?")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(?:_AnsibleTagged)?(\w+)'>")
_TEMPLATE = "{{"


@dataclass(frozen=True)
class Host:
    """One inventory host, as umprov's commands use it."""

    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    groups: tuple[str, ...] = ()
    known_hosts: str | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        """The address as known_hosts and ssh write it."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["groups"] = list(self.groups)
        data["vars"] = dict(self.vars)
        return data


@dataclass(frozen=True)
class Inventory:
    source: Path
    hosts: tuple[Host, ...]

    def select(self, pattern: str | None) -> tuple[Host, ...]:
        """Hosts whose name or group matches a comma-separated list of names or globs."""
        if not pattern:
            return self.hosts
        from fnmatch import fnmatchcase

        wanted = [p.strip() for p in pattern.split(",") if p.strip()]
        picked = tuple(
            h
            for h in self.hosts
            if any(
                fnmatchcase(h.name, p) or any(fnmatchcase(g, p) for g in h.groups) for p in wanted
            )
        )
        if not picked:
            raise InventoryError(f"{self.source}: no host matches '{pattern}'")
        return picked


# ---------------------------------------------------------------------------------------------
# Finding the inventory


def _ansible_cfg_inventory() -> Path | None:
    """The inventory ansible-playbook would use with no -i (ANSIBLE_INVENTORY, then ansible.cfg)."""
    env = os.environ.get("ANSIBLE_INVENTORY")
    if env:
        return Path(env.split(",")[0]).expanduser()
    candidates = []
    if os.environ.get("ANSIBLE_CONFIG"):
        candidates.append(Path(os.environ["ANSIBLE_CONFIG"]).expanduser())
    candidates += [
        Path.cwd() / "ansible.cfg",
        project_dir() / "ansible.cfg",
        Path.home() / ".ansible.cfg",
        Path("/etc/ansible/ansible.cfg"),
    ]
    for cfg in candidates:
        if not cfg.is_file():
            continue
        parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
        try:
            parser.read(cfg)
        except configparser.Error as exc:
            raise InventoryError(f"{cfg}: cannot read ansible.cfg: {exc}") from None
        value = parser.get("defaults", "inventory", fallback=None)
        if value:
            path = Path(value.split(",")[0].strip()).expanduser()
            return path if path.is_absolute() else (cfg.parent / path)
        return None
    return None


def resolve_source(source: str | None) -> Path:
    """Turn an INVENTORY argument into a path, as the README describes."""
    if source is None or source == "":
        found = _ansible_cfg_inventory()
        if found is None:
            raise InventoryError(
                "no inventory given and ansible.cfg names none: pass one, e.g. inventory/hosts.yml"
            )
        if not found.exists():
            raise InventoryError(f"inventory not found: {found} (named by ansible.cfg)")
        return found
    direct = Path(source).expanduser()
    if direct.exists():
        return direct
    base = project_dir() / "inventory"
    tried = [direct]
    if not direct.is_absolute():
        for cand in (
            base / source,
            *(base / f"{source}{ext}" for ext in (".yml", ".yaml", ".ini")),
        ):
            tried.append(cand)
            if cand.exists():
                return cand
    raise InventoryError(
        f"inventory not found: {source} (looked for {', '.join(str(t) for t in tried)})"
    )


# ---------------------------------------------------------------------------------------------
# Variable specs


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
    roles_dir = roles_dir or project_dir() / "roles"
    for spec_file in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
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


def _is_ascii_number(text: str) -> bool:
    """Digits 0-9 only ('²' and other Unicode digits are not numbers to int())."""
    return text.isascii() and text.isdigit() and len(text) <= 20


def _too_big(value: Any) -> bool:
    """An integer (anywhere inside value) too large to be a real setting, or to print."""
    if isinstance(value, int) and not isinstance(value, bool):
        return not -_MAX_INT < value < _MAX_INT
    if isinstance(value, Mapping):
        return any(_too_big(k) or _too_big(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_too_big(v) for v in value)
    return False


def _type_ok(value: Any, typ: str) -> bool:
    if isinstance(value, str) and _TEMPLATE in value:
        return True  # resolved by Ansible at run time
    match typ:
        case "int":
            return (
                isinstance(value, int)
                and not isinstance(value, bool)
                or (isinstance(value, str) and _is_ascii_number(value.strip().lstrip("-")))
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
            return isinstance(value, bool) or str(value).lower() in {
                "yes",
                "no",
                "true",
                "false",
                "1",
                "0",
                "on",
                "off",
                "y",
                "n",
            }
        case "list":
            return isinstance(value, list | tuple | str)
        case "dict":
            return isinstance(value, dict)
        case "str" | "path":
            return isinstance(value, str | int | float) and not isinstance(value, bool)
    return True  # raw and anything else


# ---------------------------------------------------------------------------------------------
# Loading


def _origin(value: Any) -> str | None:
    """'file:line' where Ansible's data tags know it (ansible-core 2.19+), else None."""
    try:
        from ansible.module_utils._internal._datatag import AnsibleTagHelper
    except ImportError:  # older ansible-core: no origin tracking
        return None
    for tag in AnsibleTagHelper.tags(value):
        path, line = getattr(tag, "path", None), getattr(tag, "line_num", None)
        if path:
            return f"{path}:{line}" if line else str(path)
    return None


def _where(value: Any, fallback: Path) -> str:
    return _origin(value) or str(fallback)


def _plugins_for(path: Path) -> str:
    if path.is_dir():
        return "yaml,ini"
    if path.suffix in {".yml", ".yaml", ".json"}:
        return "yaml"
    return "ini"


def _parse_with_ansible(path: Path) -> tuple[Any, Any]:
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
        from ansible import constants

        # One plugin per file type, and failures raised rather than warned about, so the
        # error names the real cause. Read from constants at use, so set them there.
        constants.INVENTORY_ENABLED = _plugins_for(path).split(",")
        constants.INVENTORY_UNPARSED_IS_FAILED = True
        constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        loader = DataLoader()
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)])
            variables = VariableManager(loader=loader, inventory=manager)
        except AnsibleError as exc:
            _raise_yaml_syntax_error(path)
            text = f"{exc}\n{captured.getvalue()}"
            causes = list(_CAUSE.finditer(text))
            if causes:
                last = causes[-1]
                where = last.group("origin") or str(path)
                where = where if where.startswith(str(path).split(":")[0]) else f"{path}"
                raise InventoryError(f"{where}: {_types(last.group('msg').strip())}") from None
            raise InventoryError(f"{path}: {_types(str(exc).splitlines()[0])}") from None
    return manager, variables


def _types(message: str) -> str:
    """"<class 'ansible...._AnsibleTaggedList'>" in Ansible's messages becomes "list"."""
    return _CLASS.sub(lambda m: m.group(1).lower(), message)


def _raise_yaml_syntax_error(path: Path) -> None:
    """Name the file, line and column of a YAML syntax error, which Ansible's message omits."""
    import yaml

    files = [path] if path.is_file() else sorted(path.rglob("*"))
    for file in files:
        if file.suffix not in {".yml", ".yaml"} or not file.is_file():
            continue
        try:
            yaml.safe_load(file.read_text())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
            raise InventoryError(f"{where}: YAML syntax error: {exc.problem}") from None
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise InventoryError(f"{file}: cannot read: {exc}") from None
        except ValueError:  # valid YAML PyYAML cannot build (a huge integer): Ansible's word
            continue


def load_inventory(source: str | None, *, roles_dir: Path | None = None) -> Inventory:
    """Find, parse and validate an inventory; raise InventoryError with one line on a fault."""
    path = resolve_source(source)
    manager, variables = _parse_with_ansible(path)
    specs = variable_specs(roles_dir)
    prefixes = umprov_prefixes(specs)
    hosts: list[Host] = []
    problems: list[str] = []
    for ans_host in manager.get_hosts():
        all_vars = variables.get_vars(host=ans_host, include_hostvars=False)
        try:
            hosts.append(_to_host(ans_host, all_vars, path, specs, prefixes))
        except InventoryError as exc:
            problems.append(str(exc))
    if problems:
        raise InventoryError(
            problems[0] + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )
    _check_duplicates(hosts, path)
    return Inventory(source=path, hosts=tuple(hosts))


def _to_host(
    ans_host: Any,
    all_vars: Mapping[str, Any],
    path: Path,
    specs: Mapping[str, VarSpec],
    prefixes: Iterable[str],
) -> Host:
    name = str(ans_host.name)
    raw_address = all_vars.get("ansible_host", name)
    if isinstance(raw_address, bool | Mapping | list | tuple) or _too_big(raw_address):
        raise InventoryError(
            f"{_where(raw_address, path)}: host '{name}' has address {_short(raw_address)}, "
            "expected a host name or IP address"
        )
    address = "" if raw_address is None else str(raw_address).strip()
    if not address:
        raise InventoryError(f"{_where(raw_address, path)}: host '{name}' has an empty address")
    if any(c.isspace() or not c.isprintable() for c in address):
        raise InventoryError(
            f"{_where(raw_address, path)}: host '{name}' has address {address!r}, which holds "
            "spaces or control characters"
        )
    raw_port = all_vars.get("ansible_port", all_vars.get("ansible_ssh_port", 22))
    port = _port(raw_port, name, path)
    umprov_vars: dict[str, Any] = {}
    prefixes = tuple(prefixes)
    for key, value in all_vars.items():
        key = str(key)
        if not key.startswith(prefixes):
            continue
        spec = specs.get(key)
        if _too_big(value):
            raise InventoryError(
                f"{_where(value, path)}: variable '{key}' on host '{name}' holds a number too "
                f"large ({_short(value)})"
            )
        if spec is None:
            hint = difflib.get_close_matches(key, list(specs), n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise InventoryError(
                f"{_where(value, path)}: unknown umprov variable '{key}' on host '{name}'"
                f"{suggestion}"
            )
        if not _type_ok(value, spec.type):
            typ = spec.type + (" (finite)" if spec.type == "float" else "")
            raise InventoryError(
                f"{_where(value, path)}: variable '{key}' on host '{name}' must be of type "
                f"{typ}, not {type(value).__name__.removeprefix('_AnsibleTagged').lower()} "
                f"({_short(value)})"
            )
        if (
            spec.choices
            and not (isinstance(value, str) and _TEMPLATE in value)
            and (_plain(value) not in spec.choices)
        ):
            raise InventoryError(
                f"{_where(value, path)}: variable '{key}' on host '{name}' is {_short(value)}, "
                f"expected one of {', '.join(map(str, spec.choices))}"
            )
        umprov_vars[key] = _plain(value)
    user = all_vars.get("ansible_user", all_vars.get("ansible_ssh_user"))
    key_file = all_vars.get(
        "ansible_ssh_private_key_file", all_vars.get("ansible_private_key_file")
    )
    for what, value in (("user", user), ("key file", key_file)):
        if isinstance(value, bool | Mapping | list | tuple) or _too_big(value):
            raise InventoryError(
                f"{_where(value, path)}: host '{name}' has {what} {_short(value)}, "
                "expected a string"
            )
    known = umprov_vars.get("umprov_known_hosts")
    if key_file and not Path(str(key_file)).is_absolute():
        key_file = str((path if path.is_dir() else path.parent) / str(key_file))
    return Host(
        name=name,
        address=address,
        port=port,
        user=None if user is None else str(user),
        key_file=None if key_file is None else str(key_file),
        groups=tuple(sorted(str(g.name) for g in ans_host.get_groups() if g.name != "all")),
        known_hosts=None if known is None else str(known),
        vars=umprov_vars,
    )


def _port(raw: Any, name: str, path: Path) -> int:
    if isinstance(raw, bool):
        raise InventoryError(f"{_where(raw, path)}: host '{name}' has port {raw!r}, not a number")
    text = "0" if _too_big(raw) else str(raw).strip()
    if not _is_ascii_number(text) or not 1 <= int(text) <= 65535:
        raise InventoryError(
            f"{_where(raw, path)}: host '{name}' has port '{_short(raw)}', "
            "expected a number from 1 to 65535"
        )
    return int(text)


def _check_duplicates(hosts: Iterable[Host], path: Path) -> None:
    seen: dict[tuple[str, int], str] = {}
    for host in hosts:
        key = (host.address.lower(), host.port)
        if key in seen:
            raise InventoryError(
                f"{path}: hosts '{seen[key]}' and '{host.name}' both use {host.address}:{host.port}"
            )
        seen[key] = host.name


def _plain(value: Any) -> Any:
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
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _short(value: Any, limit: int = 40) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and _too_big(value):
        return f"an integer of {value.bit_length()} bits"
    try:
        text = str(value)
    except ValueError:  # a huge integer inside a list or mapping
        text = f"a {type(value).__name__.removeprefix('_AnsibleTagged').lower()}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
