"""`umprov --help` wall time against `ansible-playbook --version`, measured in the same run.

Target: ratio under 0.5 (lazy command loading keeps ansible, docker, paramiko, rich out).
`umprov inventory --help` loads one command and asks for no plugin: the difference to
`umprov --help` is the price of listing every command, plugins (entry points) included.
"""

from __future__ import annotations

import sys
from pathlib import Path

from _common import save, wall

BIN = Path(sys.executable).parent


def main() -> None:
    umprov = wall([str(BIN / "umprov"), "--help"])
    baseline = wall([str(BIN / "ansible-playbook"), "--version"])
    version = wall([str(BIN / "umprov"), "--version"])
    one_command = wall([str(BIN / "umprov"), "inventory", "--help"])
    save(
        "cli_startup",
        {
            "umprov_help": umprov,
            "umprov_version": version,
            "umprov_one_command_help": one_command,
            "baseline_ansible_playbook_version": baseline,
            "ratio_help_to_baseline": round(umprov["median_s"] / baseline["median_s"], 3),
            "target_ratio": 0.5,
        },
    )


if __name__ == "__main__":
    main()
