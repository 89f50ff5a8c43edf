"""What ansible-playbook is given besides the playbook: the inventory sources, extra variables,
vault and become passwords, and the OpenSSH options that keep umprov's host-key trust.

No secret reaches a command line (which every local user can read, and ansible-runner records
in artifacts/<id>/command) or umprov's state directory: ``-e`` pairs, typed vault passwords and
the become password go through 0600 files in a private temporary folder
(umprov.paths.secret_files), removed however the run ends, and reach ansible-playbook as
``-e @FILE``, ``--vault-id LABEL@FILE`` and ``--become-password-file FILE``.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import keyword
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError
from umprov.hosts.ssh import ansible_ssh_args
from umprov.inventory import Inventory
from umprov.paths import Secret, write_private

EXTRA_VARS_FILE = "extravars.json"
ExtraVars = dict[str, Any] | Path  # -e KEY=VALUE pairs (in order), or -e @FILE


def parse_extra_vars(pairs: Sequence[str]) -> dict[str, Any]:
    """-e KEY=VALUE pairs; values parsed as YAML scalars (true, 3, [a, b]) like Ansible does."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not (key.isascii() and key.isidentifier()) or keyword.iskeyword(key):
            raise ConfigError(f"-e {pair!r:.80}: expected KEY=VALUE with KEY a variable name")
        try:
            out[key] = yaml.safe_load(value) if value.strip() else ""
        except (yaml.YAMLError, ValueError, RecursionError):  # not YAML, or a number too long
            out[key] = value
    return out


def parse_extra(items: Sequence[str]) -> list[ExtraVars]:
    """Every -e in order, as ansible-playbook merges them (a later one wins): runs of
    KEY=VALUE pairs as one mapping, ``@FILE`` as its path (read by load_inventory)."""
    plan: list[ExtraVars] = []
    for item in items:
        if item.startswith("@"):
            if not item[1:].strip():
                raise ConfigError("-e @: name a YAML or JSON file after the @")
            plan.append(Path(os.path.expanduser(item[1:])).absolute())
        elif plan and isinstance(plan[-1], dict):
            plan[-1].update(parse_extra_vars([item]))
        else:
            plan.append(parse_extra_vars([item]))
    return plan


def become_ask_pass_configured() -> bool:
    """ansible.cfg's become_ask_pass (ANSIBLE_BECOME_ASK_PASS), which -K also sets."""
    from umprov.inventory.vault import quiet_ansible

    with quiet_ansible():
        from ansible import constants

        return bool(constants.config.get_config_value("DEFAULT_BECOME_ASK_PASS"))


def extra_vars_file(private: Path, extra_vars: dict[str, Any] | None, index: int = 0) -> str | None:
    """-e pairs as a 0600 JSON file in ``private`` (a caller's own use; playbook_args puts
    them in the secret folder)."""
    if not extra_vars:
        return None
    name = EXTRA_VARS_FILE if index == 0 else f"extravars-{index}.json"
    path = private / name
    write_private(path, json.dumps(extra_vars))
    return str(path)


def remove_extra_vars_files(private: Path) -> None:
    for path in private.glob("extravars*.json"):
        path.unlink(missing_ok=True)


def playbook_args(
    inventory: Inventory,
    write_secret: Callable[[str, Secret], Path],
    *,
    extra: Sequence[ExtraVars] = (),
    become_password: Secret | None = None,
) -> list[str]:
    """ansible-playbook's arguments for the inventory, its vault, -e and the become password;
    the secrets through ``write_secret`` (umprov.paths.secret_files)."""
    args: list[str] = []
    for source in inventory.sources:
        args += ["-i", source]
    args += inventory.vault.child_args(write_secret)
    for index, item in enumerate(extra):
        if isinstance(item, Path):
            args += ["-e", f"@{item}"]
        elif item:  # pairs may hold a password: beside the others, not in the state dir
            path = write_secret(f"extravars-{index}.json", Secret(json.dumps(item)))
            args += ["-e", f"@{path}"]
    if become_password is not None:
        args += ["--become-password-file", str(write_secret("become", become_password))]
    return args


def child_settings(
    root: Path, inventory: Inventory, strategy_env: dict[str, str]
) -> dict[str, str]:
    """ansible-playbook's settings: umprov's ansible.cfg and roles, host keys checked by OpenSSH
    against umprov's known_hosts files, and no prompt it could wait on forever."""
    return {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(root / "roles"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner sets this to False unless told otherwise: host keys stay verified.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_ARGS": ansible_ssh_args(inventory.hosts, ssh_args(root)),
        # Passwords come as files (playbook_args); a prompt in ansible-runner's pty would hang.
        "ANSIBLE_BECOME_ASK_PASS": "False",
        "ANSIBLE_ASK_VAULT_PASS": "False",
        **strategy_env,
    }


# OpenSSH options ansible-playbook uses when ansible.cfg sets none (its ssh connection's default).
_DEFAULT_SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=60s"


def ssh_args(root: Path) -> str:
    """The ssh_args ansible-playbook would use (ANSIBLE_SSH_ARGS, else umprov's ansible.cfg),
    which umprov's ANSIBLE_SSH_ARGS replaces and so must carry on."""
    if os.environ.get("ANSIBLE_SSH_ARGS"):
        return os.environ["ANSIBLE_SSH_ARGS"]
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    with contextlib.suppress(configparser.Error, OSError):
        parser.read(root / "ansible.cfg")
    return parser.get("ssh_connection", "ssh_args", fallback=_DEFAULT_SSH_ARGS)
