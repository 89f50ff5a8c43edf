"""What an inventory is to umprov: its hosts, where it came from, how it was asked for."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from umprov.errors import ConfigError, InventoryError
from umprov.inventory.vault import Vault

HIDDEN = "<hidden>"  # a value umprov does not print


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
    secret: frozenset[str] = frozenset()  # vars that were vault-encrypted: never printed

    @property
    def endpoint(self) -> str:
        """The address as known_hosts and ssh write it."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        """The host as JSON-able data; the container environment's values hidden (they may
        be secrets: `umprov inventory check --json` prints this)."""
        data = asdict(self)
        data["groups"] = list(self.groups)
        data["vars"] = dict(self.vars)
        del data["secret"]
        if isinstance(self.vars.get("umprov_env"), Mapping):
            data["vars"]["umprov_env"] = dict.fromkeys(self.vars["umprov_env"], HIDDEN)
        data["vars"].update(dict.fromkeys(self.secret - {"umprov_env"}, HIDDEN))
        return data


@dataclass(frozen=True)
class InventoryRequest:
    """An inventory as a command line asks for it, the way ansible-playbook takes one: sources
    (-i, repeatable: files, folders, names under inventory/, comma lists such as ``gpu1,gpu2,``;
    none: ansible.cfg's) and the vault passwords to read it with. ``prompt`` asks for a vault
    password (``--ask-vault-pass``, ``--vault-id LABEL@prompt``); the CLI gives one that reads
    the terminal."""

    sources: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()
    vault_password_files: tuple[str, ...] = ()
    ask_vault_pass: bool = False
    prompt: Callable[[str], str] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Inventory:
    """The hosts of one or more sources, and the vault passwords they were read with (which
    ansible-playbook needs again). ``matcher`` gives the names of the hosts an Ansible pattern
    selects, by Ansible's own matching (load_inventory's: the InventoryManager that read it)."""

    sources: tuple[str, ...]
    hosts: tuple[Host, ...]
    matcher: Callable[[str], Sequence[str]] = field(compare=False, repr=False)
    vault: Vault = field(default_factory=Vault)

    @property
    def source(self) -> str:
        """The sources, for messages."""
        return ", ".join(self.sources)

    def select(self, pattern: str | None) -> tuple[Host, ...]:
        """The hosts ``pattern`` selects as ``ansible-playbook --limit`` does (an Ansible
        pattern: names, groups, globs, ~regex, unions a:b or a,b, a:!b, a:&b, group[0], @FILE;
        ``all``), in inventory order; None: every host. An empty pattern selects nothing (it
        never means all: a ConfigError), and a pattern no host matches is an InventoryError."""
        if pattern is None:
            return self.hosts
        if not pattern.strip():
            raise ConfigError("an empty host pattern selects no host (all: every host)")
        names = set(self.matcher(pattern))
        picked = tuple(h for h in self.hosts if h.name in names)
        if not picked:
            raise InventoryError(f"{self.source}: no host matches '{pattern}'")
        return picked
