"""site.yml on lab hosts under three Ansible settings (bench/README.md, "Provision").

Settings, all in the same run against the same hosts:

    stock    Ansible's defaults where they matter: forks 5, no pipelining, no SSH ControlPersist
    tuned    umprov's ansible.cfg: pipelining, forks 20 (>= hosts), ControlPersist 60 s
    mitogen  tuned plus ansible_mitogen's mitogen_linear strategy

Measured: the no-op re-run of site.yml on 1, 4 and 8 hosts under each setting; the first
converge of 8 fresh hosts (tuned); the first converge of 1 fresh host under each setting.
``--all-first`` also measures 4- and 8-host first converges under every setting (long).

    python bench/provision_bench.py [--lab bench-prov] [--hosts 1,4,8] [--all-first] [--keep]
                                    [--repeat N] [--settings tuned,mitogen]

``--repeat`` runs each no-op N times and reports the median (and every run); the last no-op
is ``umprov provision`` itself on all hosts (ansible-runner, the default strategy).

Results go to bench/results/provision.json. Needs the lab (a Docker engine) and, for the
mitogen setting, the mitogen package in umprov's environment.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SETTINGS = ("stock", "tuned", "mitogen")


def umprov(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "umprov", *args, "--json"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        what = " ".join(args)
        raise SystemExit(f"umprov {what} failed ({done.returncode}): {done.stderr[-600:]}")
    return json.loads(done.stdout) if done.stdout.strip() else {}


def write_configs(directory: Path) -> dict[str, dict[str, str]]:
    """ansible.cfg per setting, and the environment ansible-playbook runs with for each."""
    tuned = configparser.ConfigParser(interpolation=None)
    tuned.read(REPO / "ansible.cfg")
    tuned["defaults"]["roles_path"] = str(REPO / "roles")
    stock = configparser.ConfigParser(interpolation=None)
    stock.read_dict(tuned)
    stock["defaults"]["forks"] = "5"
    stock["ssh_connection"]["pipelining"] = "False"
    stock["ssh_connection"]["ssh_args"] = "-o ControlMaster=no -o ServerAliveInterval=15"
    paths = {}
    for name, cfg in (("stock", stock), ("tuned", tuned)):
        paths[name] = directory / f"{name}.cfg"
        with paths[name].open("w") as fh:
            cfg.write(fh)
    from umprov.provision import mitogen_strategy_dir

    base = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(Path.home()),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
    }
    envs = {
        "stock": {**base, "ANSIBLE_CONFIG": str(paths["stock"])},
        "tuned": {**base, "ANSIBLE_CONFIG": str(paths["tuned"])},
    }
    plugins = mitogen_strategy_dir()
    if plugins is not None:
        envs["mitogen"] = {
            **envs["tuned"],
            "ANSIBLE_STRATEGY_PLUGINS": str(plugins),
            "ANSIBLE_STRATEGY": "mitogen_linear",
        }
    return envs


def play(inventory: str, hosts: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One site.yml run limited to `hosts`: wall seconds and the recap's changed/failed counts."""
    start = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", inventory, "--limit", ",".join(hosts),
         str(REPO / "playbooks" / "site.yml")],
        capture_output=True, text=True, env=env, check=False,
    )
    elapsed = time.perf_counter() - start
    changed = failed = 0
    for line in done.stdout.splitlines():
        if " : ok=" in line:
            fields = dict(f.split("=") for f in line.split(":", 1)[1].split())
            changed += int(fields["changed"])
            failed += int(fields["failed"]) + int(fields["unreachable"])
    if done.returncode != 0 or failed:
        tail = "\n".join(done.stdout.splitlines()[-25:])
        raise SystemExit(f"site.yml failed on {hosts} (rc {done.returncode}):\n{tail}")
    return {"seconds": round(elapsed, 1), "changed": changed}


def fresh(lab_name: str, indexes: list[int]) -> dict[str, Any]:
    """Recreate lab hosts from the image: the next `lab up` makes them anew."""
    for index in indexes:
        container = f"umprov-lab-{lab_name}-{index}"
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
        subprocess.run(
            ["docker", "volume", "rm", f"{container}-docker"], capture_output=True, check=False
        )
    return umprov("lab", "up", "--hosts", str(max(indexes)), "--name", lab_name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="bench-prov")
    parser.add_argument("--hosts", default="1,4,8")
    parser.add_argument(
        "--all-first", action="store_true", help="first converge per setting and size"
    )
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    parser.add_argument("--repeat", type=int, default=1,
                        help="no-op runs per setting and size; the median is reported")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated subset of stock,tuned,mitogen")
    args = parser.parse_args()
    counts = sorted(int(c) for c in args.hosts.split(","))
    top = counts[-1]
    lab = umprov("lab", "up", "--hosts", str(top), "--name", args.lab)
    inventory = lab["inventory"]
    names = [h["name"] for h in lab["hosts"]]
    results: dict[str, Any] = {"first_converge": {}, "noop": {}}
    with tempfile.TemporaryDirectory() as tmp:
        envs = write_configs(Path(tmp))
        wanted = args.settings.split(",")
        settings = [s for s in SETTINGS if s in envs and s in wanted]
        skipped = [s for s in SETTINGS if s not in envs and s in wanted]
        fresh(args.lab, list(range(1, top + 1)))
        run = play(inventory, names[:top], envs["tuned"])
        results["first_converge"][f"tuned/{top}"] = run
        print(f"first converge, tuned, {top} hosts: {run}", file=sys.stderr)
        for setting in settings:
            for count in counts:
                runs = [play(inventory, names[:count], envs[setting]) for _ in range(args.repeat)]
                run = {"seconds": statistics.median(r["seconds"] for r in runs),
                       "runs_s": [r["seconds"] for r in runs],
                       "changed": max(r["changed"] for r in runs)}
                results["noop"][f"{setting}/{count}"] = run
                print(f"no-op, {setting}, {count} hosts: {run}", file=sys.stderr)
        # What a user runs: umprov itself (ansible-runner, default strategy), all hosts.
        runs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            doc = umprov("provision", inventory)
            changed = sum(int(h.get("changed") or 0) for h in doc.get("hosts", []))
            runs.append({"seconds": round(time.perf_counter() - start, 1), "changed": changed})
        run = {"seconds": statistics.median(r["seconds"] for r in runs),
               "runs_s": [r["seconds"] for r in runs],
               "changed": max(r["changed"] for r in runs), "strategy": doc.get("strategy")}
        results["noop"][f"umprov/{top}"] = run
        print(f"no-op, umprov provision, {top} hosts: {run}", file=sys.stderr)
        first_sizes = counts if args.all_first else [counts[0]]
        for setting in settings:
            for count in first_sizes:
                if setting == "tuned" and count == top:
                    continue
                fresh(args.lab, list(range(1, count + 1)))
                run = play(inventory, names[:count], envs[setting])
                results["first_converge"][f"{setting}/{count}"] = run
                print(f"first converge, {setting}, {count} hosts: {run}", file=sys.stderr)
    if not args.keep:
        umprov("lab", "down", "--name", args.lab)
    save("provision", {"hosts": counts, "settings_skipped": skipped, **results})


if __name__ == "__main__":
    main()
