"""A role's variables as Ansible templates them, for tests of the roles' derived values."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


@cache
def _plugin_loader() -> None:
    """Lookups (env, fileglob) load through Ansible's collection loader: set it up once."""
    import warnings

    from ansible.plugins.loader import init_plugin_loader

    with warnings.catch_warnings():  # another test may have set it up first: that one stands
        warnings.simplefilter("ignore")
        init_plugin_loader()


def render(text: str, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    _plugin_loader()
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(text))


def role_vars(role: str, **overrides: Any) -> dict[str, Any]:
    """The role's defaults/main.yml, vars/main.yml and the overrides, as the role sees them."""
    from ansible.template import trust_as_template

    found: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        for key, value in yaml.safe_load((ROLES / role / part / "main.yml").read_text()).items():
            found[key] = trust_as_template(value) if isinstance(value, str) else value
    return {**found, "ansible_managed": "Ansible managed", "inventory_hostname": "gpu07",
            "role_path": str(ROLES / role), **overrides}
