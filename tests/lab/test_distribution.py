"""umprov as users install it, against a lab, from a folder with no clone in it.

umprov's and umprov-lab's wheels, built here from their sdists, go into a fresh virtual environment; the
umprov.gpu collection, built here, into a temporary collections path. From a temporary folder
(no ansible.cfg, no playbooks/, its own state folder) the installed umprov provisions, deploys,
verifies and reports on a lab host; then plain ansible-playbook runs the collection's site
(nothing left to change after umprov's run), deploy (umprov's deploy library: the same spec,
nothing changed) and verify (the host fails in Ansible's recap, the no-GPU check named) playbooks, and the next `umprov report` files that run into the history. Last, an AWX project
runs the verify playbook as AWX does (project sync's install, then ansible-runner).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.lab.conftest import LAB_IMAGE_TAG, clear_lab, cli, lab_name, seed_engines

pytestmark = [pytest.mark.lab, pytest.mark.cost(420)]

NAME = lab_name("pytest-dist")


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both wheels in a fresh virtual environment, the collection in a collections path."""
    tmp = tmp_path_factory.mktemp("dist")
    dist = tmp / "dist"
    for project in (REPO, REPO / "lab"):  # the sdist, then the wheel from it, as PyPI's would
        built = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(project)])
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    venv = tmp / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    pip = _run([str(venv / "bin" / "pip"), "install", "-q", *map(str, dist.glob("*.whl"))])
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    built = _run([sys.executable, str(REPO / "collection" / "build.py"), "--output-path",
                  str(dist), "--build-dir", str(tmp / "build")])
    assert built.returncode == 0, built.stderr
    collections = tmp / "collections"
    galaxy = _run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", "-p",
                   str(collections), built.stdout.strip().splitlines()[-1]])
    assert galaxy.returncode == 0, galaxy.stdout + galaxy.stderr
    return {"bin": venv / "bin", "collections": collections, "work": tmp / "work",
            "state": tmp / "state", "tarball": Path(built.stdout.strip().splitlines()[-1])}


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, installed: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """One lab host from the Docker-converged snapshot, its engine holding the lab image."""
    snapshot = request.getfixturevalue("docker_host_image")
    clear_lab(NAME)
    seed_engines(request.getfixturevalue("engine_seed"), NAME, [1], snapshot)
    up = cli("lab", "up", "--hosts", "1", "--name", NAME, "--json", "--from-image", snapshot)
    assert up.exit_code == 0, up.stderr
    try:
        yield json.loads(up.stdout)
    finally:
        cli("lab", "down", "--name", NAME)


@pytest.fixture(scope="module")
def user(installed: dict[str, Path]) -> Any:
    """A command run as the user of the installed tools: in a folder with no clone, with the
    venv first on PATH, umprov's state in a folder of its own, the collection installed."""
    work = installed["work"]
    work.mkdir(exist_ok=True)
    env = user_env(installed, ANSIBLE_COLLECTIONS_PATH=str(installed["collections"]))

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return _run(list(argv), cwd=work, env=env)

    return run


def user_env(installed: dict[str, Path], **more: str) -> dict[str, str]:
    """This process's environment less umprov's, Ansible's and Python's settings, the venv
    first on PATH, umprov's state in a folder of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UMPROV_", "ANSIBLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({"PATH": f"{installed['bin']}:{env.get('PATH', '/usr/bin:/bin')}",
                "UMPROV_STATE_DIR": str(installed["state"]), **more})
    return env


def test_the_installed_umprov_reads_its_own_files_and_writes_none_into_them(installed, user):
    version = user("umprov", "--version")
    assert version.returncode == 0, version.stderr
    content = re.search(r"^playbooks and roles (.+)$", version.stdout, re.M)
    assert content and "site-packages/umprov/_content" in content.group(1), version.stdout
    where = user("python", "-c", "from umprov.image import source_dir; "
                 "from umprov.paths import project_dir; print(source_dir()); print(project_dir())")
    image_files, project = where.stdout.split()
    assert (Path(image_files) / "Dockerfile").is_file()
    assert project == str(installed["state"])  # no project here: the lab's files go to state


def test_the_installed_umprov_builds_the_image_from_its_own_files(installed, user):
    """`umprov lab image` (umprov's image build on the lab's base) from the wheel: the
    Dockerfile and scripts from the package, the context in the state folder, nothing written
    into site-packages."""
    tag = f"{LAB_IMAGE_TAG}-dist"
    try:
        built = user("umprov", "lab", "image", "--torch-wheel", "none", "--tag", tag, "--json")
        assert built.returncode == 0, built.stderr[-2000:]
        assert json.loads(built.stdout)["context"].startswith(str(installed["state"]))
        site = installed["bin"].parent / "lib"
        assert not list(site.rglob("pytorch-cuda/context")), "a build context in site-packages"
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)


def test_a_bad_value_and_a_typo_are_refused_as_in_a_clone(installed, user):
    bad = installed["work"] / "bad.yml"
    bad.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 192.0.2.1\n"
                   "      docker_engine_source: bogus\n")
    checked = user("umprov", "inventory", "check", str(bad))
    assert checked.returncode == 3 and "bad.yml:5" in checked.stderr, checked.stderr


def test_the_flow_and_the_collections_playbooks_against_a_lab(lab, user, installed):
    inventory = lab["inventory"]
    pub = str(Path(lab["key_file"]).with_suffix(".pub"))
    steps = [("inventory", "check", inventory), ("provision", inventory),
             ("deploy", inventory, "--image", LAB_IMAGE_TAG, "--push", "--authorized-key", pub),
             ("status", inventory)]
    for step in steps:
        done = user("umprov", *step)
        assert done.returncode == 0, (step, done.stdout[-2000:] + done.stderr[-2000:])
    verify = user("umprov", "verify", inventory, "--json")
    assert verify.returncode == 13, verify.stderr[-2000:]  # the lab has no GPU: never a pass
    report = user("umprov", "report", inventory)
    assert report.returncode in (0, 12), report.stderr

    site = user("ansible-playbook", "-i", inventory, "umprov.gpu.site")
    assert site.returncode == 0, site.stdout[-3000:]
    assert re.search(r"changed=0\s", site.stdout) and "failed=0" in site.stdout, site.stdout[-3000:]

    # umprov's deploy library from a playbook: the container umprov deployed is the same spec.
    deployed = user("ansible-playbook", "-i", inventory, "umprov.gpu.deploy",
                    "-e", f"pytorch_container_image={LAB_IMAGE_TAG}",
                    "-e", f"pytorch_container_authorized_key={pub}")
    assert deployed.returncode == 0, deployed.stdout[-3000:]
    assert re.search(r"changed=0\s", deployed.stdout), deployed.stdout[-3000:]

    played = user("ansible-playbook", "-i", inventory, "umprov.gpu.verify")
    assert played.returncode == 2, played.stdout[-3000:]
    assert re.search(r"failed=1\s", played.stdout), played.stdout[-3000:]
    assert "GPU verification fail" in played.stdout and "gpu." in played.stdout, played.stdout
    # The agent the collection ships, not one built on the controller (AWX has no umprov).
    assert re.search(r"Build the verifier agent[^\n]*\n+skipping", played.stdout), played.stdout

    filed = user("umprov", "report", inventory, "--json")
    assert "filed 1 report(s)" in filed.stderr, filed.stderr
    assert not list((installed["state"] / "verify-inbox").glob("*.json"))


def test_an_awx_project_verifies_as_an_awx_job_does(lab, installed, tmp_path):
    """collection/README.md's AWX set-up: a project whose collections/requirements.yml names the
    tarball from the project's root, installed as a project sync installs it, then the job as AWX
    runs it: ansible-runner, a private data dir, the one-line playbook, the collection found in
    the project only. The host fails (no GPU), the check named in the events; its report comes
    back in the job's artifacts (the execution environment's files are thrown away)."""
    data_dir = tmp_path / "awx"
    project = data_dir / "project"
    (project / "collections").mkdir(parents=True)
    shutil.copy2(installed["tarball"], project / "collections")
    (project / "collections" / "requirements.yml").write_text(
        f"collections:\n  - name: collections/{installed['tarball'].name}\n    type: file\n")
    (project / "verify.yml").write_text(
        "---\n- ansible.builtin.import_playbook: umprov.gpu.verify\n")
    env = user_env(installed, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "none"),
                   UMPROV_STATE_DIR=str(tmp_path / "ee-state"))
    synced = _run([str(installed["bin"] / "ansible-galaxy"), "collection", "install", "-r",
                   "collections/requirements.yml", "-p", "collections"], cwd=project, env=env)
    assert synced.returncode == 0, synced.stdout + synced.stderr

    job = _run([str(installed["bin"] / "ansible-runner"), "run", str(data_dir), "-p",
                "verify.yml", "--inventory", lab["inventory"], "--ident", "job", "-j"],
               cwd=tmp_path, env=env)
    artifacts = data_dir / "artifacts" / "job"
    assert job.returncode == 2, job.stdout[-3000:] + job.stderr[-2000:]
    assert (artifacts / "status").read_text() == "failed"
    events = [json.loads(p.read_text()) for p in (artifacts / "job_events").glob("*.json")]
    failed = [e["event_data"]["res"]["msg"] for e in events if e["event"] == "runner_on_failed"]
    assert len(failed) == 1 and re.match(r"GPU verification fail: \w+\.\w+ on ", failed[0]), failed
    (stats,) = [e["event_data"] for e in events if e["event"] == "playbook_on_stats"]
    (report,) = stats["artifact_data"]["gpu_verify_reports"].values()
    assert report["schema"] == "umprov.verify.host" and report["verdict"] == "fail"
