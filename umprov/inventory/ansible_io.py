"""Ansible reads the inventory: its InventoryManager (every enabled plugin, ``plugin:`` files
through ``auto``, comma lists, several sources), its VariableManager (group_vars, host_vars,
precedence), its vault and its Templar. What umprov adds is the file at fault in every error:
Ansible's own messages often lose it (a YAML error or a vault-encrypted file in group_vars says
neither which file nor where), so the loader remembers the last file it failed to read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, InventoryError
from umprov.inventory.specs import type_name
from umprov.inventory.vault import Vault, quiet_ansible

_WARNING = re.compile(r"^\[WARNING\]: Failed to parse inventory with '(?P<plugin>[\w.]+)' "
                      r"plugin: (?P<msg>.+)$", re.MULTILINE)
_ORIGIN = re.compile(r"<<< caused by >>>\s*\n\s*\n[^\n]*\nOrigin: (?P<origin>[^\n<]+)")
# Ansible's yaml and toml plugins warn, and go on, when a group holds a key other than vars,
# children and hosts (a misspelt "hosts" leaves its hosts out).
_SKIPPED = re.compile(r"Skipping unexpected key [(\"](?P<key>[^)\"\n]*)[)\"] "
                      r"in group [(\"](?P<group>[^)\"\n]*)[)\"]")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(?:_AnsibleTagged)?(\w+)'>")
# Ansible's words for an encrypted file read without a vault password, or with wrong ones.
_NO_PASSWORD = ("A vault password must be specified", "no vault secrets found")
_WRONG_PASSWORD = "no vault secrets were found that could decrypt"  # noqa: S105 - words
VAULT_HINT = "--ask-vault-pass, --vault-password-file FILE or --vault-id LABEL@FILE"


class Parsed:
    """An inventory as Ansible holds it: its manager, variables and loader."""

    def __init__(self, sources: Sequence[str], vault: Vault) -> None:
        self.sources = list(sources)
        with quiet_ansible() as self.captured:
            self.loader = _loader(vault)
            from ansible.errors import AnsibleError
            from ansible.inventory.manager import InventoryManager
            from ansible.vars.manager import VariableManager

            try:
                self.manager = InventoryManager(loader=self.loader, sources=self.sources)
                self.variables = VariableManager(loader=self.loader, inventory=self.manager)
            except AnsibleError as exc:
                raise InventoryError(self._explain(exc)) from None

    def hosts(self) -> list[Any]:
        """Every host; none is an InventoryError naming the sources, and the keys Ansible
        skipped when it did (``all: {hsots: ...}``: Ansible only warns)."""
        hosts = list(self.manager.get_hosts())
        if not hosts:
            skipped = [f"{m.group('key')!r} in group {m.group('group')!r}"
                       for m in _SKIPPED.finditer(self.captured.getvalue())]
            why = (f" (Ansible skipped {', '.join(skipped)}: a group holds only vars, children "
                   "and hosts)") if skipped else ""
            raise InventoryError(f"{', '.join(self.sources)}: no hosts{why}")
        return hosts

    def matching(self, pattern: str) -> list[str]:
        """The names of the hosts ``pattern`` selects, as ``ansible-playbook --limit`` selects
        them (Ansible's own matching: names, groups, globs, ~regex, a:b and a,b, a:!b, a:&b,
        group[0], @FILE). A pattern Ansible refuses is a ConfigError naming it."""
        from ansible.errors import AnsibleError

        with quiet_ansible():
            try:
                self.manager.subset(pattern)
                return [str(h.name) for h in self.manager.get_hosts()]
            except AnsibleError as exc:
                raise ConfigError(f"host pattern {pattern!r}: {first_line(exc)}") from None
            finally:
                self.manager.subset(None)

    def host_vars(self, host: Any) -> dict[str, Any]:
        """Every variable of ``host`` as a play sees it (untemplated); a vars file that cannot
        be read is named."""
        from ansible.errors import AnsibleError

        self.loader.failed = None
        try:
            with quiet_ansible():
                return self.variables.get_vars(host=host, include_hostvars=True)
        except AnsibleError as exc:
            raise InventoryError(self._explain(exc, f"host '{host.name}'")) from None

    def templated(self, all_vars: dict[str, Any], value: Any) -> Any:
        """``value`` templated with the host's variables, as a play would see it. Raises
        Ansible's error (the caller names the variable)."""
        from ansible.template import Templar

        with quiet_ansible():
            return Templar(loader=self.loader, variables=all_vars).template(value)

    def _explain(self, exc: BaseException, what: str = "") -> str:
        failed = getattr(self.loader, "failed", None)
        source = re.search(r"Completely failed to parse inventory source (.+)$", str(exc))
        if source:  # the loader's failure explains it only when it was this very file
            path = source.group(1).strip()
            if failed is not None and Path(failed[0]).absolute() == Path(path).absolute():
                return file_error(*failed)
            return plugin_error(path, f"{exc}\n{self.captured.getvalue()}")
        if failed is not None:
            return file_error(*failed)
        where = ", ".join(self.sources)
        return f"{where}: {what + ': ' if what else ''}{_types(first_line(exc))}"


def _loader(vault: Vault) -> Any:
    """Ansible's DataLoader holding the vault passwords, with every plugin and collection
    Ansible's own commands can use; the loader remembers the last file it could not read."""
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecretsContext
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
    # Settings are read when used: refresh the ones that may have changed since import, and
    # make a source that no plugin parses an error (ansible-playbook only warns).
    constants.INVENTORY_ENABLED = constants.config.get_config_value("INVENTORY_ENABLED")
    constants.INVENTORY_UNPARSED_IS_FAILED = True
    constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True

    class NamingLoader(DataLoader):
        failed: tuple[str, BaseException] | None = None

        def load_from_file(self, file_name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().load_from_file(file_name, *args, **kwargs)
            except AnsibleError as exc:
                self.failed = (str(file_name), exc)
                raise

    loader = NamingLoader()
    secrets = vault.ansible_secrets(loader)
    loader.set_vault_secrets(secrets)
    # Values encrypted inline (!vault) are decrypted through this process-wide context.
    context = VaultSecretsContext.current(optional=True)
    if context is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:
        context.secrets[:] = secrets
    return loader


def file_error(path: str, exc: BaseException) -> str:
    """One line naming a file Ansible could not read, and where in it when it knows."""
    message = first_line(exc)
    origin = getattr(exc, "obj", None)
    line, col = getattr(origin, "line_num", None), getattr(origin, "col_num", None)
    where = path + (f":{line}" if line else "") + (f":{col}" if line and col else "")
    if any(words in message for words in _NO_PASSWORD):
        return f"{path}: vault-encrypted, and no vault password was given ({VAULT_HINT})"
    if _WRONG_PASSWORD in message:
        return f"{path}: vault-encrypted, and none of the vault passwords given decrypts it"
    if message.startswith("YAML parsing failed"):
        return f"{where}: YAML syntax error: {message.removeprefix('YAML parsing failed: ')}"
    return f"{where}: {_types(message)}"


# Which plugin's failure explains a source best, by what the source looks like.
def _expected_plugin(source: str) -> str:
    path = Path(source)
    if "," in source and not path.exists():
        return "host_list"
    if path.suffix in {".yml", ".yaml", ".json"}:
        try:
            head = path.read_text(errors="replace")[:4096]
        except OSError:
            return "yaml"
        return "auto" if re.search(r"^plugin\s*:", head, re.MULTILINE) else "yaml"
    if path.suffix == ".toml":
        return "toml"
    return "script" if path.is_file() and path.stat().st_mode & 0o111 else "ini"


def plugin_error(source: str, text: str) -> str:
    """The one failure, of the several Ansible's plugins reported, that says what is wrong."""
    failures = {m.group("plugin").split(".")[-1]: m.group("msg") for m in _WARNING.finditer(text)}
    origins = [m.group("origin").strip() for m in _ORIGIN.finditer(text)]
    message = failures.get(_expected_plugin(source)) or next(iter(failures.values()), "")
    if not message:
        return f"{source}: no inventory plugin could parse it"
    where = source
    for origin in origins:  # a line number, when a plugin gave one for this very file
        if origin.startswith(source + ":"):
            where = origin
    return f"{where}: {_types(message.strip())}"


def load_vars_file(path: Path, vault: Vault) -> dict[str, Any]:
    """A ``-e @FILE`` as ansible-playbook will read it (YAML or JSON, vault-encrypted or not):
    a mapping of variables. A fault is a bad value (exit 4) naming the file."""
    from ansible.errors import AnsibleError

    if not path.exists():
        raise ConfigError(f"-e @{path}: no such file")
    if not path.is_file():
        raise ConfigError(f"-e @{path}: not a file")
    with quiet_ansible():
        loader = _loader(vault)
        try:
            data = loader.load_from_file(str(path), trusted_as_template=True)
        except AnsibleError as exc:
            raise ConfigError(f"-e @{file_error(str(path), exc)}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"-e @{path}: expected a mapping of variables, not a {type_name(data)}")
    return dict(data or {})


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _types(message: str) -> str:
    """"<class 'ansible...._AnsibleTaggedList'>" in Ansible's messages becomes "list"."""
    message = _CLASS.sub(lambda m: m.group(1).lower(), message)
    return re.sub(r"\b_AnsibleTagged(\w+)", lambda m: m.group(1).lower(), message)
