"""`umprov verify --multi-node --events DIR`: a job.json of the wrong types, or naming a node
outside DIR, is one line naming the file and the field; nothing is read or kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umprov.errors import ExitCode

GOOD = {"job_id": "7", "backend": "gloo", "timeout": 30, "rendezvous": "n0:29400",
        "nodes": ["n0"], "started": 100.0, "ended": 131.0}


@pytest.mark.parametrize(("change", "words"), [
    ({"timeout": "soon"}, "timeout 'soon' is not a number"),
    ({"timeout": float("nan")}, "timeout nan is not a number"),
    ({"timeout": 10**400}, "is not a number"),
    ({"timeout": -1}, "timeout -1 is not a positive number of seconds"),
    ({"ended": "x"}, "ended 'x' is not a number"),
    ({"started": None}, "started None is not a number"),
    ({"nodes": [1]}, "nodes: node name 1 cannot name umprov's files"),
    ({"nodes": "n0"}, "nodes 'n0' is not a list of distinct node names"),
    ({"nodes": ["n0", "n0"]}, "is not a list of distinct node names"),
    ({"job_id": None}, "job_id None is not a Slurm job id"),
    ({"job_id": True}, "job_id True is not a Slurm job id"),
    ({"backend": 3}, "backend 3 is not nccl or gloo"),
    ({"rendezvous": 29400}, "rendezvous 29400 is not HOST:PORT"),
])
def test_a_badly_typed_job_is_one_line_naming_the_file_and_field(umprov_cli, tmp_path, change,
                                                                  words):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps({**GOOD, **change}))
    result = umprov_cli("verify", "--multi-node", "--events", str(folder), "--json")
    assert result.exit_code == ExitCode.CONFIG and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"umprov: error: {folder}/job.json: ") and words in line


@pytest.mark.parametrize("node", ["../outside", "/etc", ".hidden", "a/b"])
def test_a_node_name_never_leaves_the_folder_nor_reaches_the_history(umprov_cli, tmp_path,
                                                                      node):
    folder, outside = tmp_path / "job", tmp_path / "outside"
    outside.mkdir()
    (outside / "torchrun.log").write_text("read from outside the folder\n")
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps({**GOOD, "nodes": ["n0", node]}))
    result = umprov_cli("verify", "--multi-node", "--events", str(folder))
    assert result.exit_code == ExitCode.CONFIG
    assert f"nodes: node name {node!r} cannot name umprov's files" in result.stderr
    assert not (tmp_path / "state" / "verify-history").exists()


def test_a_good_job_still_runs(umprov_cli, tmp_path: Path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps({**GOOD, "job_id": 7}))
    result = umprov_cli("verify", "--multi-node", "--events", str(folder), "--json")
    assert result.exit_code == ExitCode.VERIFY_FAIL  # n0 left no output: did not start
    (doc,) = json.loads(result.stdout)["hosts"]
    assert doc["host"] == "n0" and doc["facts"]["slurm_job_id"] == "7"
