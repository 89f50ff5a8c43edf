"""A stand-in for Slurm's scontrol and squeue on one node, for the agent's --slurm-* modes.

Installed as both commands (a symlink of each name to this file); the node lives in the JSON
file UMPROV_FAKE_SLURM names: {"name", "state" (BASE+FLAGS), "reason", "jobs": [ids],
"jobs_end_after": polls of squeue before the jobs are gone (null: never)}. Every call is
appended to its "calls" list. It prints what Slurm 22.05 prints, in its one-line format.
"""

from __future__ import annotations

import json
import os
import sys

LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 "
        "CPULoad=0.10 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) "
        "NodeAddr={name} NodeHostName={name} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP "
        "PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  RealMemory=1 AllocMem=0 FreeMem=900 "
        "Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
        "MCS_label=N/A Partitions=debug  BootTime=2024-03-01T09:58:12 "
        "SlurmdStartTime=2024-03-01T10:01:40 LastBusyTime=2024-03-01T10:05:03 "
        "CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
        "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")


def main(argv: list[str]) -> int:
    path = os.environ["UMPROV_FAKE_SLURM"]
    with open(path) as fh:
        node = json.load(fh)
    command = os.path.basename(argv[0])
    node.setdefault("calls", []).append([command, *argv[1:]])
    try:
        return run(command, argv[1:], node)
    finally:
        with open(path, "w") as fh:
            json.dump(node, fh)


def run(command: str, args: list[str], node: dict) -> int:
    if command == "squeue":
        left = node.get("jobs_end_after")
        if left is not None:
            if left <= 0:
                node["jobs"] = []
            node["jobs_end_after"] = left - 1
        print("\n".join(node.get("jobs", [])))
        return 0
    if args[:3] == ["show", "node", "-o"]:
        if args[3] != node["name"]:
            print(f"Node {args[3]} not found", file=sys.stderr)
            return 1
        text = LINE.format(name=node["name"], state=node["state"])
        if node.get("reason"):
            text += f" Reason={node['reason']} [root@2024-03-04T17:46:10]"
        print(text)
        return 0
    if args[0] == "update":
        values = dict(a.split("=", 1) for a in args[1:])
        base, *flags = node["state"].split("+")
        if values["state"] == "drain":
            node["state"] = "+".join([base, *sorted(set(flags) | {"DRAIN"})])
            node["reason"] = values["reason"]
        elif values["state"] == "resume":
            node["state"] = "+".join([base, *[f for f in flags if f != "DRAIN"]])
            node["reason"] = ""
        return 0
    print(f"fake scontrol: unexpected {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
