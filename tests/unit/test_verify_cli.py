"""`umprov verify` in-process (CliRunner), and the remote runner against a stand-in container."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from umprov.verify import remote, report

FAKES = Path(__file__).resolve().parent / "verify_fakes"


def test_verify_help_lists_the_options(umprov_cli):
    result = umprov_cli("verify", "--help")
    assert result.exit_code == 0
    for opt in ("--local", "--quick", "--json", "--junit", "--prometheus", "--profile-file",
                "--expected-gpus", "--timeout", "--image", "--duration", "--exclusive"):
        assert opt in result.stdout


def test_local_without_gpu_fails_honestly_and_writes_every_report(umprov_cli, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "cpu_torch"))
    junit, prom = tmp_path / "v.xml", tmp_path / "prom"
    result = umprov_cli("verify", "--local", "--json", "--junit", str(junit),
                        "--prometheus", str(prom), "--expected-gpus", "2")
    assert result.exit_code == 13, result.stderr
    run = json.loads(result.stdout)
    assert run["schema"] == "umprov.verify.run" and run["verdict"] == "fail"
    (doc,) = run["hosts"]
    assert report.validate(doc) == []
    details = " ".join(r["detail"] for r in doc["records"])
    assert "no NVIDIA GPU visible" in details and "CPU-only build" in details
    assert "no NVIDIA GPU visible" in result.stderr  # the table / the long-detail line
    root = ET.parse(junit).getroot()  # noqa: S314
    assert root.get("failures") == "2"
    assert "umprov_verify_host_verdict" in (prom / "umprov_verify.prom").read_text()


def test_local_with_a_python_without_torch_says_how_to_fix_it(umprov_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    import importlib.util

    if importlib.util.find_spec("torch"):
        pytest.skip("this Python has torch")
    result = umprov_cli("verify", "--local", "--json")
    assert result.exit_code == 13
    (doc,) = json.loads(result.stdout)["hosts"]
    assert "pass --python" in doc["records"][0]["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "inventory.yml"], "INVENTORY or --local, not both"),
        (["--local", "--image", "x"], "--image runs the agent in containers"),
        (["--python", "python3"], "--python applies to --local only"),
        (["--local", "--profile", "h300"], "profile 'h300' does not exist"),
        (["--local", "--duration", "10x"], "--duration: duration '10x': use seconds or"),
        (["hosts", "--multi-node", "--duration", "1m"], "--duration and --exclusive do not"),
        (["hosts", "--multi-node", "--exclusive"], "--duration and --exclusive do not"),
    ],
)
def test_bad_option_combinations_are_config_errors(umprov_cli, args, message):
    result = umprov_cli("verify", *args)
    assert result.exit_code == 4, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_bad_profile_file_is_one_line(umprov_cli, tmp_path):
    bad = tmp_path / "p.yml"
    bad.write_text("profiles:\n  h200-sxm:\n    expect: {hbm: 1}\n")
    result = umprov_cli("verify", "--local", "--profile-file", str(bad))
    assert result.exit_code == 4
    assert "unknown expect key 'hbm'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("profile", "args", "refused"), [
    ("nosuch", [], True),
    ("h100-sxm", [], False),
    ("mine", [], True),
    ("mine", ["--profile-file", "{file}"], False),  # the file adds it
    ("nosuch", ["--profile", "h100-sxm"], False),  # --profile wins over every host's
])
def test_a_host_profile_that_does_not_exist_stops_verify_before_any_host(
        umprov_cli, monkeypatch, tmp_path, profile, args, refused):
    import umprov.verify.remote as rem

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         f"    gpu2: {{ansible_host: 10.0.0.2, umprov_gpu_profile: {profile}}}\n")
    (tmp_path / "p.yml").write_text("profiles:\n  mine:\n    match: [Mine]\n")
    reached = []
    monkeypatch.setattr(rem, "verify_hosts", lambda hs, *_a, **_k: reached.extend(hs) or [])
    args = [a.replace("{file}", str(tmp_path / "p.yml")) for a in args]
    result = umprov_cli("verify", str(inventory), *args)
    if refused:
        assert result.exit_code == 4, result.stderr
        assert result.stderr.startswith(f"umprov: error: gpu2: umprov_gpu_profile: profile "
                                        f"'{profile}' does not exist (known: ")
        assert not reached
    else:
        assert [h.name for h in reached] == ["gpu1", "gpu2"], result.stderr


def test_timeout_must_be_positive(umprov_cli):
    assert umprov_cli("verify", "--local", "--timeout", "0").exit_code == 4


@pytest.mark.parametrize("value", ["nan", "-nan", "inf", "1e999"])
def test_a_timeout_that_never_fires_is_a_bad_value(umprov_cli, monkeypatch, value):
    """Click's FloatRange lets NaN past its bounds; a NaN or infinite deadline never fires."""
    import umprov.verify.local

    monkeypatch.setattr(umprov.verify.local, "run_local", lambda **kw: pytest.fail("ran"))
    result = umprov_cli("verify", "--local", "--timeout", value)
    assert result.exit_code == 4
    (line,) = result.stderr.splitlines()
    assert f"'--timeout': {value!r} is not a finite number" in line


def test_a_burn_in_too_long_for_a_number_is_a_config_error(umprov_cli):
    result = umprov_cli("verify", "--local", "--duration", "9" * 400 + "m")
    assert result.exit_code == 4
    (line,) = result.stderr.splitlines()
    assert line.startswith("umprov: error: --duration: duration '999") and "too long" in line


# ---------------------------------------------------------------------------------------------
# The remote runner, against a stand-in for a docker SDK container that runs commands here.


class LocalContainer:
    """Implements exec_run/put_archive/get_archive on this machine's file system."""

    name = "umprov"
    status = "running"

    def __init__(self, env: dict | None = None) -> None:
        self.env = env
        self.commands: list[list[str]] = []

    def exec_run(self, cmd, demux=False):
        self.commands.append(cmd)
        proc = subprocess.run(cmd, capture_output=True, env=self.env, timeout=120, check=False)
        return SimpleNamespace(exit_code=proc.returncode, output=proc.stdout + proc.stderr)

    def put_archive(self, path, data):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(path, filter="data")
        return True

    def get_archive(self, path):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(path, arcname=Path(path).name)
        return iter([buf.getvalue()]), {}


def test_run_agent_in_container_round_trip(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))  # the zipapp's cache
    env = {**os.environ, "PYTHONPATH": str(FAKES / "cpu_torch")}
    box = LocalContainer(env)
    doc = remote.run_agent_in_container(
        SimpleNamespace(), box, args=["--quick", "--expected-gpus", "4"], timeout=120,
        profile={"profile": "h200-sxm"}, host="gpu-7")
    assert report.validate(doc) == []
    assert doc["host"] == "gpu-7" and doc["mode"] == "quick" and doc["verdict"] == "fail"
    assert "CPU-only build" in doc["records"][0]["detail"]
    script = box.commands[1][2]
    assert "--profile-file" in script and "--expected-gpus 4" in script
    workdir = box.commands[0][-1]  # mkdir -p WORKDIR
    # On the way out: every process of the run killed (by its mark), its folder removed.
    assert box.commands[-1][:2] == ["sh", "-c"]
    assert "UMPROV_VERIFY_RUN=" in box.commands[-1][2]
    assert f"rm -rf {workdir}" in box.commands[-1][2]
    assert not Path(workdir).exists()


def test_run_agent_in_container_without_a_report(monkeypatch, tmp_path):
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    class NoPython(LocalContainer):
        def exec_run(self, cmd, demux=False):
            if cmd[0] == "sh":
                return SimpleNamespace(exit_code=98, output=b"no python in the container\n")
            return super().exec_run(cmd, demux)

    doc = remote.run_agent_in_container(SimpleNamespace(), NoPython(), timeout=30, host="h")
    assert doc["verdict"] == "fail" and "no python3" in doc["records"][0]["detail"]


def test_verify_hosts_reports_each_host_even_when_it_fails(monkeypatch):
    import umprov.hosts.engine
    from umprov.errors import UmprovError

    class Missing(Exception):
        pass

    def fake_client(host, trust_new=False):
        if host.name == "down":
            raise UmprovError("down: connection refused")
        containers = SimpleNamespace(get=lambda name: (_ for _ in ()).throw(Missing(name)))
        return SimpleNamespace(containers=containers, close=lambda: None)

    monkeypatch.setattr(umprov.hosts.engine, "docker_client", fake_client)
    hosts = [SimpleNamespace(name="down", vars={}),
             SimpleNamespace(name="bare", vars={"umprov_container_name": "mine"})]
    seen: list[tuple[str, str]] = []
    docs = remote.verify_hosts(hosts, remote.VerifyOptions(quick=True),
                               progress=lambda h, m: seen.append((h, m)))
    assert [d["host"] for d in docs] == ["down", "bare"]
    assert all(report.validate(d) == [] and d["verdict"] == "fail" for d in docs)
    assert "connection refused" in docs[0]["records"][0]["detail"]
    assert "no container 'mine'" in docs[1]["records"][0]["detail"]
    assert ("down", "connecting") in seen


def test_verify_image_container_ends_and_goes_by_itself(monkeypatch):
    """--image: the throwaway container outlives the agent's deadline by a bounded grace, then
    the engine removes it, so an interrupt answered late or a killed umprov leaves nothing for
    good; umprov still removes it at once when it can."""
    import umprov.hosts.engine
    from umprov.hosts.engine import THROWAWAY_GRACE_S

    started: list[dict] = []
    removed: list[str] = []

    class Box:
        name = "umprov-verify-x"

        def remove(self, force=False):
            removed.append(self.name)

    def run(image, **kw):
        started.append({"image": image, **kw})
        return Box()

    def fake_client(host, trust_new=False):
        return SimpleNamespace(containers=SimpleNamespace(run=run), close=lambda: None)

    def fake_agent(client, container, **kw):
        return report.failed_host_report("gpu1", "host.gpu_visible", "no GPU")

    monkeypatch.setattr(umprov.hosts.engine, "docker_client", fake_client)
    monkeypatch.setattr(remote, "run_agent_in_container", fake_agent)
    opts = remote.VerifyOptions(quick=True, timeout=40, image="umprov/pytorch-cuda:x")
    remote.verify_hosts([SimpleNamespace(name="gpu1", vars={})], opts, progress=lambda h, m: None)
    (kw,) = started
    assert kw["image"] == "umprov/pytorch-cuda:x" and kw["auto_remove"] is True
    assert kw["command"] == ["sleep", str(int(opts.overall_timeout() + THROWAWAY_GRACE_S))]
    assert removed == ["umprov-verify-x"]


def test_verify_image_without_a_gpu_runtime_leaves_no_refused_container(monkeypatch):
    """An engine may create the container and refuse it only at its start (no NVIDIA runtime):
    that one is removed before the agent runs in one without GPUs, under the same name."""
    import docker.errors

    import umprov.hosts.engine

    names: list[str] = []
    removed: list[str] = []

    class Box:
        def __init__(self, name):
            self.name = name

        def remove(self, force=False):
            removed.append(self.name)

    def run(image, **kw):
        if names and names[-1] == kw["name"] and kw["name"] not in removed:
            raise docker.errors.APIError(f"Conflict: the name {kw['name']} is in use")
        names.append(kw["name"])
        if "device_requests" in kw:
            raise docker.errors.APIError('could not select device driver "" with capabilities')
        return Box(kw["name"])

    containers = SimpleNamespace(run=run, get=lambda name: Box(name))
    monkeypatch.setattr(umprov.hosts.engine, "docker_client",
                        lambda host, trust_new=False: SimpleNamespace(containers=containers,
                                                                      close=lambda: None))
    monkeypatch.setattr(remote, "run_agent_in_container", lambda client, container, **kw:
                        report.failed_host_report("gpu1", "host.gpu_visible", "no GPU"))
    opts = remote.VerifyOptions(quick=True, image="umprov/pytorch-cuda:x")
    (doc,) = remote.verify_hosts([SimpleNamespace(name="gpu1", vars={})], opts,
                                 progress=lambda h, m: None)
    assert "the container could not get GPUs" in doc["records"][0]["detail"]
    assert removed == [names[0], names[0]]  # the refused one, then the one the agent ran in


def test_burn_in_and_exclusive_reach_the_agent_and_its_deadline():
    opts = remote.VerifyOptions(timeout=60, duration=600, exclusive=True)
    args = opts.agent_args({})
    assert args[args.index("--duration") + 1] == "600" and "--exclusive" in args
    assert opts.overall_timeout() == remote.VerifyOptions(timeout=60).overall_timeout() + 600
    assert "--duration" not in remote.VerifyOptions().agent_args({})


def test_local_passes_burn_in_and_exclusive_to_the_agent(umprov_cli, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "cpu_torch"))
    result = umprov_cli("verify", "--local", "--json", "--duration", "2m", "--exclusive")
    (doc,) = json.loads(result.stdout)["hosts"]
    assert doc["facts"]["options"]["duration_s"] == 120 and doc["facts"]["options"]["exclusive"]


def test_local_passes_burn_in_progress_on_as_it_comes(capsys):
    from umprov.verify.local import run_agent

    line = "umprov verify agent: burn-in 10/60 s: gpu0 61 C 690 W 1755 MHz"
    script = f"import sys; print({line!r}, file=sys.stderr); print('other', file=sys.stderr)"
    rc, tail = run_agent([sys.executable, "-c", script], 60)
    assert rc == 0 and "other" in tail
    err = capsys.readouterr().err
    assert line in err and "other" not in err


def test_agent_args_take_host_variables():
    opts = remote.VerifyOptions(quick=True, timeout=30)
    args = opts.agent_args({"umprov_expected_gpus": 8, "umprov_gpu_profile": "h100-sxm"})
    assert args == ["--timeout", "30", "--quick", "--expected-gpus", "8", "--profile",
                    "h100-sxm"]
    cli_wins = remote.VerifyOptions(expected_gpus=4).agent_args({"umprov_expected_gpus": 8})
    assert cli_wins[cli_wins.index("--expected-gpus") + 1] == "4"


def test_inventory_path_runs_every_host(umprov_cli, monkeypatch, tmp_path):
    import umprov.inventory
    import umprov.verify.remote as rem

    hosts = [SimpleNamespace(name=f"gpu-{i}", vars={}) for i in range(3)]
    monkeypatch.setattr(umprov.inventory, "load_inventory",
                        lambda source: SimpleNamespace(select=lambda limit: hosts))
    got = {}

    def fake_verify(hs, opts, progress, forks=None):
        got["opts"] = opts
        return [report.failed_host_report(h.name, "agent.connect", "unreachable") if h.name ==
                "gpu-1" else _passing(h.name) for h in hs]

    monkeypatch.setattr(rem, "verify_hosts", fake_verify)
    result = umprov_cli("verify", "hosts.yml", "--quick", "--json", "--expected-gpus", "8")
    assert result.exit_code == 13
    run = json.loads(result.stdout)
    assert [d["host"] for d in run["hosts"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert got["opts"].quick and got["opts"].expected_gpus == 8


def _passing(host: str) -> dict:
    doc = report.failed_host_report(host, "x", "")
    doc["records"][0].update(verdict="pass", hint=None, reason=None)
    doc.update(verdict="pass", exit_code=0, summary={"pass": 1, "warn": 0, "fail": 0, "skip": 0})
    return doc
