"""Value rules beyond a variable's type: ranges and shapes (a count not negative, a port from 1
to 65535, a driver branch as NVIDIA's packages name it, a size Docker can read).

The rules live in one data file shipped with the preflight role,
roles/gpu_preflight/files/value_rules.yml, which the preflight play checks every host against
before anything changes; umprov reads the same file for `umprov inventory check` and for its
own options (--shm-size), so the two can never disagree. The suggestion for a misspelt variable
is the preflight module's own function, which the play runs, read from the same role.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from umprov.errors import ConfigError, InventoryError
from umprov.paths import content_file, content_module

RULES_FILE = Path("gpu_preflight") / "files" / "value_rules.yml"
PREFLIGHT_MODULE = Path("gpu_preflight") / "library" / "gpu_preflight_facts.py"


@dataclass(frozen=True)
class Format:
    expected: str
    pattern: str | None = None
    min: float | None = None
    max: float | None = None

    def allows(self, value: Any) -> bool:
        text = str(value).strip()
        if self.pattern is not None and not re.fullmatch(self.pattern, text):
            return False
        if self.min is None and self.max is None:
            return True
        try:
            number = float(text)
        except (ValueError, OverflowError):
            return False
        return math.isfinite(number) and not (
            (self.min is not None and number < self.min)
            or (self.max is not None and number > self.max)
        )


@dataclass(frozen=True)
class ValueRules:
    formats: dict[str, Format]
    variables: dict[str, str]  # variable -> format name

    def problem(self, variable: str, value: Any) -> str | None:
        """What is wrong with ``value`` for ``variable`` ("expected ..."), or None."""
        fmt = self.formats.get(self.variables.get(variable, ""))
        return None if fmt is None or fmt.allows(value) else f"expected {fmt.expected}"


@cache
def value_rules(roles_dir: Path | None = None) -> ValueRules:
    """The rules file of ``roles_dir`` (none when a given folder lacks it); by default umprov's
    own, which an installation must carry (EnvironmentProblem otherwise, never no rules)."""
    import yaml

    if roles_dir is None:
        path = content_file("roles", str(RULES_FILE))
    else:
        path = roles_dir / RULES_FILE
        if not path.is_file():
            return ValueRules({}, {})
    try:
        data = yaml.safe_load(path.read_text()) or {}
        formats = {name: Format(**spec) for name, spec in (data.get("formats") or {}).items()}
        variables = {str(k): str(v) for k, v in (data.get("variables") or {}).items()}
    except (OSError, yaml.YAMLError, TypeError, AttributeError) as exc:
        raise InventoryError(f"{path}: cannot read the value rules: {exc}") from None
    unknown = sorted(set(variables.values()) - set(formats))
    if unknown:
        raise InventoryError(f"{path}: variables name unknown formats: {', '.join(unknown)}")
    return ValueRules(formats, variables)


def check_format(format_name: str, value: Any, what: str) -> str:
    """An option's value checked against one of the file's formats (ConfigError naming
    ``what``); the value, stripped."""
    fmt = value_rules().formats.get(format_name)
    if fmt is not None and not fmt.allows(value):
        raise ConfigError(f"{what}: {str(value)[:40]!r} is not {fmt.expected}")
    return str(value).strip()


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'X'?)" for the known name closest to a misspelt one, else "": the
    preflight module's function (one home: the play's message and umprov's are the same)."""
    return str(_preflight_module().did_you_mean(name, list(known)))


@cache
def _preflight_module() -> ModuleType:
    return content_module("umprov_gpu_preflight_facts", "roles", str(PREFLIGHT_MODULE))
