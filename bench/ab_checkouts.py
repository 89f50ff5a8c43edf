"""Two checkouts of umprov side by side in one run: CLI start-up and the 8-host no-op re-run.

A change that reshapes the code (issue 15) must not make the product slower. This measures
the checkout it lives in ("new") against another checkout ("old", for example a clone of the
commit before the change, with its own `make venv`), interleaved round by round so that a busy
machine shifts both alike:

- `umprov --help`: median of 7 wall times after a warm-up, per round;
- `umprov provision INVENTORY --json` on the same converged lab hosts: the whole no-op re-run
  through each checkout's own roles, playbooks and ansible-runner wrapper.

    git clone -q . /tmp/umprov-old && git -C /tmp/umprov-old checkout -q 418d645
    make -C /tmp/umprov-old venv
    .venv/bin/python bench/ab_checkouts.py --old /tmp/umprov-old --hosts 8 --repeat 3
    .venv/bin/python bench/ab_checkouts.py --old /tmp/umprov-old --help-only --repeat 5

The lab is brought up and converged by the new checkout (`--lab`, default `bench-ab`). An older
checkout may not know the inventory variables the new lab writes: `--old-inventory-sed` rewrites
them in a copy of the inventory given to the old checkout (default: the lab's container-limits
variable back to the `umprov_lab` flag older versions read). Results: bench/results/ab.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, wall  # noqa: E402

NEW = Path(__file__).resolve().parent.parent
OLD_SED = "umprov_container_limits: false=umprov_lab: true"


def umprov(checkout: Path, *args: str) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    done = subprocess.run(
        [str(checkout / ".venv" / "bin" / "umprov"), *args, "--json"],
        cwd=checkout, capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: umprov {' '.join(args)} exit {done.returncode}: "
                         f"{done.stderr[-800:]}")
    return seconds, (json.loads(done.stdout) if done.stdout.strip() else {})


def changed(doc: dict[str, Any]) -> int:
    return sum(int(h.get("changed") or 0) for h in doc.get("hosts", []))


def spread(values: list[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "max_s": round(max(values), 3), "runs_s": [round(v, 3) for v in values]}


def old_inventory(inventory: Path, sed: str, directory: Path) -> Path:
    text = inventory.read_text()
    for rule in filter(None, sed.split(";")):
        before, after = rule.split("=", 1)
        text = text.replace(before, after)
    copy = directory / inventory.name
    copy.write_text(text)
    return copy


def help_median(checkout: Path) -> float:
    return wall([str(checkout / ".venv" / "bin" / "umprov"), "--help"])["median_s"]


def help_only(checkouts: dict[str, Path], repeat: int) -> None:
    runs: dict[str, list[float]] = {"old": [], "new": []}
    for round_ in range(repeat):
        for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            runs[side].append(help_median(checkouts[side]))
    result: dict[str, Any] = {"old": str(checkouts["old"]), "repeat": repeat,
                              "help": {side: spread(r) for side, r in runs.items()}}
    result["help_ratio_new_to_old"] = round(
        result["help"]["new"]["median_s"] / result["help"]["old"]["median_s"], 3)
    save("ab_help", result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (with .venv)")
    parser.add_argument("--lab", default="bench-ab")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-inventory-sed", default=OLD_SED,
                        help="'FROM=TO;...' text replacements for the old checkout's inventory")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    parser.add_argument("--help-only", action="store_true",
                        help="only `umprov --help`, no lab (seconds instead of minutes)")
    args = parser.parse_args()
    checkouts = {"old": args.old.resolve(), "new": NEW}
    if args.help_only:
        return help_only(checkouts, args.repeat)
    help_runs: dict[str, list[float]] = {"old": [], "new": []}
    noop_runs: dict[str, list[float]] = {"old": [], "new": []}
    _, lab = umprov(NEW, "lab", "up", "--hosts", str(args.hosts), "--name", args.lab)
    inventory = Path(lab["inventory"])
    first, doc = umprov(NEW, "provision", str(inventory))
    print(f"first converge (new): {first:.1f} s, changed {changed(doc)}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        inventories = {"new": inventory,
                       "old": old_inventory(inventory, args.old_inventory_sed, Path(tmp))}
        for round_ in range(args.repeat):
            for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                help_runs[side].append(help_median(checkouts[side]))
                seconds, doc = umprov(checkouts[side], "provision", str(inventories[side]))
                noop_runs[side].append(seconds)
                print(f"round {round_ + 1} {side}: --help {help_runs[side][-1]:.3f} s, "
                      f"no-op {seconds:.1f} s, changed {changed(doc)}", file=sys.stderr)
                if changed(doc):
                    raise SystemExit(f"{side}: the no-op re-run changed {changed(doc)} things")
    if not args.keep:
        umprov(NEW, "lab", "down", "--name", args.lab)
    result = {
        "old": str(checkouts["old"]), "hosts": args.hosts, "repeat": args.repeat,
        "help": {side: spread(runs) for side, runs in help_runs.items()},
        "noop": {side: spread(runs) for side, runs in noop_runs.items()},
    }
    for what in ("help", "noop"):
        result[f"{what}_ratio_new_to_old"] = round(
            result[what]["new"]["median_s"] / result[what]["old"]["median_s"], 3)
    save("ab", result)


if __name__ == "__main__":
    main()
