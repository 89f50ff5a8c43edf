"""Vault passwords, gathered as ansible-playbook gathers them.

The command line's ``--vault-id`` (LABEL@FILE, LABEL@prompt), ``--vault-password-file`` and
``--ask-vault-pass``, after the settings Ansible's own config manager reads (ansible.cfg's
``vault_identity_list``, ``vault_password_file``, ``ask_vault_pass`` and their
``ANSIBLE_VAULT_*`` variables), merged by Ansible's CLI helpers. A password file (or script) is
read by Ansible (``get_file_vault_secret``); a prompt is asked through the caller's ``prompt``
and kept in memory only. ``Vault.child_args`` hands the same passwords to ansible-playbook:
files by path, typed passwords through private temporary files, never on a command line.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, EnvironmentProblem
from umprov.paths import Secret

PROMPTS = ("prompt", "prompt_ask_vault_pass")


@dataclass(frozen=True)
class VaultPassword:
    """One vault identity: a password file or script (``file``), or a typed ``secret``."""

    label: str
    file: str | None = None
    secret: Secret | None = None


@dataclass(frozen=True)
class Vault:
    passwords: tuple[VaultPassword, ...] = ()

    def ansible_secrets(self, loader: Any) -> list[tuple[str, Any]]:
        """(label, VaultSecret) pairs for Ansible's ``loader``; a bad password file is a bad
        setting (exit 4) naming the file."""
        with quiet_ansible():
            from ansible.errors import AnsibleError
            from ansible.parsing.vault import VaultSecret, get_file_vault_secret

        found: list[tuple[str, Any]] = []
        for password in self.passwords:
            if password.secret is not None:
                found.append((password.label, VaultSecret(password.secret.reveal().encode())))
                continue
            try:
                with quiet_ansible():
                    secret = get_file_vault_secret(filename=password.file,
                                                   vault_id=password.label, loader=loader)
                    secret.load()
            except AnsibleError as exc:
                raise ConfigError(f"vault password file {password.file}: "
                                  f"{_first_line(exc)}") from None
            found.append((password.label, secret))
        return found

    def child_args(self, write: Callable[[str, Secret], Path]) -> list[str]:
        """``--vault-id`` arguments giving ansible-playbook the same passwords; typed ones
        through ``write`` (umprov.paths.secret_files), so no password is in its argv."""
        args: list[str] = []
        for index, password in enumerate(self.passwords):
            if password.secret is not None:
                path = str(write(f"vault-{index}", password.secret))
            else:
                path = str(password.file)
            args += ["--vault-id", f"{password.label}@{path}"]
        return args


def resolve_vault(
    vault_ids: tuple[str, ...] = (),
    password_files: tuple[str, ...] = (),
    ask: bool = False,
    prompt: Callable[[str], str] | None = None,
) -> Vault:
    """The vault passwords ansible-playbook would use with these options, here and now."""
    with quiet_ansible():
        from ansible import constants
    config = constants.config  # Ansible's config manager: ansible.cfg, then ANSIBLE_* now
    ids = [*(config.get_config_value("DEFAULT_VAULT_IDENTITY_LIST") or []), *vault_ids]
    files = list(password_files)
    configured_file = config.get_config_value("DEFAULT_VAULT_PASSWORD_FILE")
    if configured_file:
        files.append(str(configured_file))
    ask = ask or bool(config.get_config_value("DEFAULT_ASK_VAULT_PASS"))
    if not (ids or files or ask):
        return Vault()  # the common case, without importing Ansible's CLI (a tenth of a second)
    cli = _ansible_cli()
    # build_vault_ids labels files with C.DEFAULT_VAULT_IDENTITY: read now, not at import.
    default_label = str(config.get_config_value("DEFAULT_VAULT_IDENTITY"))
    constants.DEFAULT_VAULT_IDENTITY = default_label
    slugs = cli.build_vault_ids(ids, files, ask_vault_pass=ask, auto_prompt=False)
    passwords = []
    for slug in slugs:
        label, source = cli.split_vault_id(slug)
        label = label or default_label
        if source in PROMPTS:
            passwords.append(VaultPassword(label, secret=_asked(label, prompt)))
        else:
            path = Path(os.path.expanduser(source)).absolute()
            passwords.append(VaultPassword(label, file=str(path)))
    return Vault(tuple(passwords))


def _asked(label: str, prompt: Callable[[str], str] | None) -> Secret:
    if prompt is None:
        raise ConfigError(f"a vault password is to be asked for (vault id {label!r}) and there "
                          "is no terminal to ask on: use --vault-password-file FILE")
    text = prompt(label)
    if not text:
        raise ConfigError(f"empty vault password given for vault id {label!r}")
    return Secret(text)


@contextlib.contextmanager
def quiet_ansible() -> Iterator[io.StringIO]:
    """Ansible prints warnings (and on import, deprecations) itself: keep them for the error
    message instead of letting them reach the terminal."""
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
        yield captured


def _ansible_cli() -> Any:
    """Ansible's CLI helpers. Importing ansible.cli checks the locale and the standard streams
    and exits when it dislikes them: that is a prerequisite problem."""
    try:
        with quiet_ansible():
            from ansible.cli import CLI
    except SystemExit as exc:
        raise EnvironmentProblem(f"Ansible cannot start here: {exc}") from None
    return CLI


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
