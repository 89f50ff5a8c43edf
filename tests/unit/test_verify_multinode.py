"""Pure parts of `umprov verify --multi-node`: commands, environment, reports, naming."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.unit.fakes import EngineHost, fake_fleet
from umprov.errors import ConfigError
from umprov.hosts import is_loopback
from umprov.verify import report
from umprov.verify.bundle import agent_zipapp
from umprov.verify.multinode_judge import (
    HostRun,
    host_reports,
    judge_busbw,
    parse_events,
    timings,
)
from umprov.verify.multinode_plan import (
    DEFAULT_RDZV_PORT,
    MultiNodeOptions,
    container_kwargs,
    node_env,
    nproc_for,
    parse_endpoint,
    rendezvous_port,
    shell_script,
    torchrun_command,
)


def test_parse_endpoint() -> None:
    assert parse_endpoint("10.0.0.1") == ("10.0.0.1", DEFAULT_RDZV_PORT)
    assert parse_endpoint("node1:29500") == ("node1", 29500)
    assert parse_endpoint("[fd00::1]:1234") == ("fd00::1", 1234)
    assert parse_endpoint("h", 777) == ("h", 777)
    for bad in ("h:0", "h:x", ":5", "h:70000"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)


def test_loopback_and_port() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("gpu-node-1")
    assert rendezvous_port({}) == DEFAULT_RDZV_PORT
    assert rendezvous_port({"umprov_rendezvous_port": 29555}) == 29555


def test_node_env_from_inventory_vars() -> None:
    env = node_env({"umprov_nccl_socket_ifname": "bond0", "umprov_nccl_ib_hca": "mlx5_0,mlx5_1",
                    "umprov_nccl_debug": "INFO"}, route_ifname="eth0")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "bond0"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    plain = node_env({}, route_ifname="eth0")
    assert plain["GLOO_SOCKET_IFNAME"] == "eth0" and "NCCL_SOCKET_IFNAME" not in plain


def test_torchrun_command() -> None:
    cmd = torchrun_command(python="python3", agent="/w/agent.pyz", nnodes=3, nproc=8,
                           endpoint="10.0.0.1:29400", rdzv_id="umprov-ab", join_timeout=60,
                           local_addr="10.0.0.2", is_host=False, opts_path="/w/o.json",
                           out_prefix="/w/rank")
    assert cmd[:3] == ["python3", "-m", "torch.distributed.run"]

    def opt(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert opt("--nnodes") == "3" and opt("--nproc-per-node") == "8"
    assert opt("--rdzv-backend") == "c10d" and opt("--rdzv-endpoint") == "10.0.0.1:29400"
    assert opt("--rdzv-id") == "umprov-ab" and opt("--max-restarts") == "0"
    conf = dict(kv.split("=") for kv in opt("--rdzv-conf").split(","))
    assert conf["join_timeout"] == "60" and conf["is_host"] == "false"
    assert opt("--local-addr") == "10.0.0.2"
    assert cmd[cmd.index("/w/agent.pyz"):] == ["/w/agent.pyz", "--child", "multinode",
                                               "--child-opts", "/w/o.json", "--child-out",
                                               "/w/rank"]
    script = shell_script(cmd, {"NCCL_DEBUG": "WARN", "X": "a b"}, workdir="/w", deadline=240)
    assert "timeout -k 10 240" in script and "X='a b'" in script
    assert shlex.join(cmd) in script


def test_nproc_and_worker_opts() -> None:
    assert nproc_for("nccl", 8, None) == 8 and nproc_for("gloo", 8, None) == 1
    assert nproc_for("gloo", 0, 2) == 2
    assert MultiNodeOptions(backend="gloo").worker_opts()["busbw_bytes"] == 16 << 20
    assert MultiNodeOptions().worker_opts()["busbw_bytes"] == 1 << 30


def test_container_kwargs_host_network_and_gpus() -> None:
    hc = {"Runtime": "nvidia", "DeviceRequests": [
        {"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
         "Options": {}}]}
    kw = container_kwargs("sha256:abc", "umprov-mn-1", "umprov-1", hc, raise_limits=True,
                          run_s=MultiNodeOptions().run_bound())
    assert kw["network_mode"] == "host" and kw["runtime"] == "nvidia"
    assert kw["labels"]["org.umprov.multinode"] == "umprov-1"
    assert kw["device_requests"][0]["Count"] == -1
    assert {u["Name"] for u in kw["ulimits"]} == {"memlock", "stack"}
    lab = container_kwargs("img", "n", "r", {}, raise_limits=False, run_s=60)
    assert "ulimits" not in lab and "device_requests" not in lab and "runtime" not in lab


def test_a_leftover_container_ends_and_goes_by_itself() -> None:
    """Should umprov never get to remove it (killed, its connection lost), the engine stops the
    container once the run's bound and a grace have passed, and removes it."""
    from umprov.hosts.engine import THROWAWAY_GRACE_S

    opts = MultiNodeOptions(timeout=100)
    kw = container_kwargs("img", "n", "r", {}, raise_limits=False, run_s=opts.run_bound())
    assert kw["auto_remove"] is True and kw["detach"] is True
    assert kw["command"][0] == "sleep"
    lifetime = float(kw["command"][1])
    assert lifetime == opts.run_bound() + THROWAWAY_GRACE_S
    assert opts.run_bound() >= opts.run_deadline() + 3 * opts.timeout


def test_judge_busbw() -> None:
    assert judge_busbw(40.0, None, "nccl")[0] == "skip"
    assert judge_busbw(40.0, 40.0, "gloo")[0] == "skip"
    assert judge_busbw(40.0, 40.0, "nccl")[:2] == ("pass", 34.0)
    assert judge_busbw(30.0, 40.0, "nccl")[0] == "warn"
    assert judge_busbw(10.0, 40.0, "nccl")[0] == "fail"
    assert judge_busbw(None, 40.0, "nccl")[0] == "fail"


def _events(rank: int, world: int, wrong: int = 0, busbw: float = 2.5) -> list[dict]:
    return [
        {"ev": "started", "rank": rank, "at": 100.5},
        {"ev": "joined", "init_s": 0.4, "torch": "2.13.0", "at": 102.0},
        {"ev": "check", "check": "multinode.all_reduce", "wrong": wrong, "elements": 8,
         "world": world},
        {"ev": "check", "check": "multinode.all_gather", "wrong": 0, "elements": 2,
         "world": world},
        {"ev": "busbw", "bytes": 1 << 30, "reps": 10, "seconds": 0.5, "algbw": 2.0,
         "busbw": busbw},
        {"ev": "collectives", "seconds": 6.0, "at": 108.0},
        {"ev": "done"},
    ]


def _ran(name: str, ranks: dict[int, list[dict]], rc: int | None = 0) -> HostRun:
    return HostRun(name, {}, stage="finished", nproc=len(ranks), rc=rc, ranks=ranks,
                   prepare_s=3.0, launched_at=100.0, finished_at=110.0)


def _checks(doc: dict) -> dict[str, dict]:
    return {r["check"]: r for r in doc["records"]}


def test_reports_for_a_good_run_are_valid() -> None:
    runs = [_ran("a", {0: _events(0, 4), 1: _events(1, 4)}),
            _ran("b", {2: _events(2, 4), 3: _events(3, 4)})]
    docs = host_reports(runs, backend="nccl", endpoint="10.0.0.1:29400", rdzv_id="r",
                        timeout=60, wall_s=12.0, expected_busbw=2.0)
    for doc in docs:
        assert report.validate(doc) == [], report.validate(doc)
        assert doc["verdict"] == "pass" and doc["mode"] == "multi-node"
        assert doc["facts"]["world_size"] == 4 and doc["facts"]["rendezvous"] == "10.0.0.1:29400"
        assert _checks(doc)["multinode.busbw"]["expected"] == 2.0
    assert "ranks 2-3 of 4" in _checks(docs[1])["multinode.join"]["detail"]
    assert docs[0]["facts"]["timings"] == {"container_s": 3.0, "startup_s": 0.5,
                                           "rendezvous_s": 1.5, "collectives_s": 6.0,
                                           "torchrun_s": 10.0}
    assert report.exit_code(report.run_verdict(docs)) == 0


def test_wrong_values_fail() -> None:
    runs = [_ran("a", {0: _events(0, 2, wrong=3)}), _ran("b", {1: _events(1, 2, wrong=3)})]
    docs = host_reports(runs, backend="gloo", endpoint="x:1", rdzv_id="r", timeout=60, wall_s=1)
    rec = _checks(docs[0])["multinode.all_reduce"]
    assert rec["verdict"] == "fail" and rec["measured"] == 3 and rec["hint"] == "isolate"
    assert _checks(docs[0])["multinode.busbw"]["verdict"] == "skip"  # gloo: not judged


def test_host_that_never_joined_is_named() -> None:
    runs = [HostRun("a", stage="prepared", nproc=1), HostRun("b", stage="prepared", nproc=1),
            HostRun("c", stage="connect", error="Docker unreachable: connection refused",
                    hint="config")]
    docs = host_reports(runs, backend="gloo", endpoint=None, rdzv_id="r", timeout=60, wall_s=4)
    by_host = {d["host"]: d for d in docs}
    bad = _checks(by_host["c"])["multinode.join"]
    assert bad["verdict"] == "fail" and bad["detail"].startswith("did not join: Docker")
    assert by_host["c"]["verdict"] == "fail"
    for name in ("a", "b"):
        rec = _checks(by_host[name])["multinode.join"]
        assert rec["verdict"] == "skip" and "c did not join" in rec["detail"]
    for doc in docs:
        assert report.validate(doc) == []
    assert report.exit_code(report.run_verdict(docs)) == 13


def test_rendezvous_timeout_names_the_host() -> None:
    waited = "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    refused = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
               "connection to the C10d store has failed.")
    runs = [_ran("a", {}, rc=1), _ran("b", {}, rc=1), _ran("c", {}, rc=1)]
    runs[0].output = runs[1].output = waited
    runs[2].output = refused
    docs = host_reports(runs, backend="nccl", endpoint="x:1", rdzv_id="r", timeout=60, wall_s=61)
    a, c = _checks(docs[0])["multinode.join"], _checks(docs[2])["multinode.join"]
    assert a["verdict"] == "skip" and "c did not join" in a["detail"]
    assert c["verdict"] == "fail" and "cannot reach the rendezvous" in c["detail"]
    # every host waited: nobody can be named, each fails on the timeout
    runs[2].output = waited
    docs = host_reports(runs, backend="nccl", endpoint="x:1", rdzv_id="r", timeout=60, wall_s=61)
    rec = _checks(docs[0])["multinode.join"]
    assert rec["verdict"] == "fail" and rec["reason"] == "timeout"
    assert rec["detail"].startswith("did not join within 60 s")


def test_killed_torchrun_fails_after_partial_results() -> None:
    evs = _events(0, 2)[:3]  # joined, all_reduce done, then hung
    docs = host_reports([_ran("a", {0: evs}, rc=None), _ran("b", {1: evs}, rc=None)],
                        backend="nccl", endpoint="x:1", rdzv_id="r", timeout=30, wall_s=100)
    checks = _checks(docs[0])
    assert checks["multinode.all_reduce"]["verdict"] == "pass"
    assert checks["multinode.all_gather"]["reason"] == "timeout"
    assert checks["multinode.exit"]["verdict"] == "fail"


def test_parse_events_skips_torn_lines() -> None:
    text = '{"ev": "started"}\n{"ev": "joi\nnot json\n[1]\n{"ev": "done"}\n'
    assert [e["ev"] for e in parse_events(text)] == ["started", "done"]
    assert timings(HostRun("x"))["startup_s"] is None


def test_cli_rejects_options_outside_multinode() -> None:
    from tests.conftest import _Boundary

    res = CliRunner().invoke(_Boundary("umprov"), ["verify", "--local", "--backend", "gloo"])
    assert res.exit_code == 4 and "apply to --multi-node" in res.stderr
    res = CliRunner().invoke(_Boundary("umprov"), ["verify", "--multi-node", "--local"])
    assert res.exit_code == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_gloo_two_nodes_on_loopback(tmp_path: Path) -> None:
    """The real worker under the real torchrun, gloo on CPU: two one-rank nodes; torchrun runs
    the agent's zipapp as its script."""
    pytest.importorskip("torch")
    agent = agent_zipapp(cache=tmp_path / "cache")
    opts = MultiNodeOptions(backend="gloo", timeout=60)
    (tmp_path / "o.json").write_text(json.dumps({**opts.worker_opts(), "elements": 4096,
                                                 "busbw_bytes": 1 << 16}))
    endpoint = f"127.0.0.1:{_free_port()}"
    runs, procs = [], []
    for node in range(2):
        cmd = torchrun_command(python=sys.executable, agent=str(agent), nnodes=2, nproc=1,
                               endpoint=endpoint, rdzv_id="unit", join_timeout=60,
                               local_addr="127.0.0.1", is_host=node == 0,
                               opts_path=str(tmp_path / "o.json"),
                               out_prefix=str(tmp_path / f"n{node}"))
        env = {**os.environ, **node_env({}, "lo")}
        runs.append(HostRun(f"n{node}", stage="launched", nproc=1, launched_at=time.time()))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.STDOUT, text=True))
    for run, proc in zip(runs, procs, strict=True):
        run.output, _ = proc.communicate(timeout=120)
        run.rc, run.stage = proc.returncode, "finished"
    for node, run in enumerate(runs):
        for f in tmp_path.glob(f"n{node}.*"):
            run.ranks[int(f.suffix[1:])] = parse_events(f.read_text())
    docs = host_reports(runs, backend="gloo", endpoint=endpoint, rdzv_id="unit", timeout=60,
                        wall_s=1)
    for doc in docs:
        assert doc["verdict"] == "pass", (doc["records"], runs[0].output[-1500:])
        assert _checks(doc)["multinode.all_gather"]["measured"] == 0


# ---------------------------------------------------------------------------------------------
# Orchestration with a fake docker SDK (tests/unit/fakes.py): clean-up on every path


def test_ctrl_c_removes_every_container(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    from umprov.verify import multinode

    log = fake_fleet(monkeypatch, tmp_path, down=set())

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(multinode, "_launch_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        multinode.verify_multinode([EngineHost("a"), EngineHost("b"), EngineHost("c")],
                                   MultiNodeOptions(backend="gloo", timeout=5))
    assert {x.split()[1].split(":")[0] for x in log if x.startswith("removed")} == {"a", "b", "c"}
    assert sum(x.startswith("started") for x in log) == 3
    assert sum(x.startswith("removed") for x in log) == 3


def test_ctrl_c_while_a_container_starts_leaves_none(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """Ctrl-C while one host's engine is still creating its container (the CI failure of
    session 8): clean-up waits for that start and removes the container it produced."""
    import threading

    from tests.unit import fakes
    from umprov.verify import multinode

    log = fake_fleet(monkeypatch, tmp_path, down=set())
    gate, entered = threading.Event(), threading.Event()
    run = fakes._Containers.run

    def slow_run(self: fakes._Containers, **kw: object) -> fakes.FakeContainer:
        if self.host == "c":
            entered.set()
            gate.wait(10)
        return run(self, **kw)

    monkeypatch.setattr(fakes._Containers, "run", slow_run)
    settle = multinode.settle

    def interrupted_prepare(fn, items, timeout, name="task"):  # noqa: ANN001, ANN202
        if fn.__name__ != "<lambda>":  # clean-up: the real one
            return settle(fn, items, timeout, name)
        threading.Thread(target=settle, args=(fn, items, timeout), daemon=True).start()
        assert entered.wait(10)
        threading.Timer(0.5, gate.set).start()  # the engine answers after the interrupt
        raise KeyboardInterrupt

    monkeypatch.setattr(multinode, "settle", interrupted_prepare)
    with pytest.raises(KeyboardInterrupt):
        multinode.verify_multinode([EngineHost("a"), EngineHost("b"), EngineHost("c")],
                                   MultiNodeOptions(backend="gloo", timeout=5))
    started = {x.split()[1] for x in log if x.startswith("started")}
    removed = {x.split()[1].split(":")[0] for x in log if x.startswith("removed")}
    assert "c" in started and removed == started


def test_unreachable_host_fails_fast_and_cleans_up(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    from umprov.verify import multinode

    log = fake_fleet(monkeypatch, tmp_path, down={"c"})
    launched: list[str] = []
    monkeypatch.setattr(multinode, "_launch_all", lambda *a, **k: launched.append("x"))
    docs = multinode.verify_multinode([EngineHost("a"), EngineHost("b"), EngineHost("c")],
                                      MultiNodeOptions(backend="gloo", timeout=5))
    assert launched == []  # the job is not started without every host
    by_host = {d["host"]: d for d in docs}
    assert _checks(by_host["c"])["multinode.join"]["detail"].startswith(
        "did not join: unreachable")
    assert "c did not join" in _checks(by_host["a"])["multinode.join"]["detail"]
    assert sum(x.startswith("removed") for x in log) == 2


def test_rendezvous_address_from_the_first_host() -> None:
    from umprov.verify import multinode

    lab = multinode.HostState(EngineHost("a"))
    lab.net = {"route": {"ip": "172.30.0.2", "ifname": "eth0"}}
    assert multinode._rendezvous([lab], MultiNodeOptions()) == "172.30.0.2:29400"
    real = multinode.HostState(EngineHost("a", "10.0.0.5", umprov_rendezvous_port=29123))
    assert multinode._rendezvous([real], MultiNodeOptions()) == "10.0.0.5:29123"
    assert multinode._rendezvous([real], MultiNodeOptions(rendezvous="head:1")) == "head:1"


def test_hosts_is_an_alias_of_limit():
    """Issue 6 names the option --hosts PATTERN; it selects like --limit."""
    from umprov.cli.verify import verify

    limit = next(p for p in verify.params if p.name == "limit")
    assert {"--limit", "-l", "--hosts"} <= set(limit.opts)


@pytest.mark.parametrize(("error", "written"), [
    ("Unreachable", "did not join: unreachable: c: boom"),
    ("TrustError", "did not join: untrusted: c: boom"),
    ("AuthFailed", "did not join: c: boom"),  # a refused login is no unreachable host
    ("EngineDown", "did not join: c: boom")])
def test_a_host_that_cannot_be_connected_is_written_as_verify_writes_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str, written: str) -> None:
    import umprov.errors
    import umprov.hosts.engine
    from umprov.verify import multinode

    fake_fleet(monkeypatch, tmp_path, down=set())
    reachable = umprov.hosts.engine.docker_client

    def client(host: EngineHost, **kw: object) -> object:
        if host.name == "c":
            raise getattr(umprov.errors, error)("c: boom")
        return reachable(host, **kw)

    monkeypatch.setattr(umprov.hosts.engine, "docker_client", client)
    monkeypatch.setattr(multinode, "_launch_all", lambda *a, **k: None)
    docs = multinode.verify_multinode([EngineHost("a"), EngineHost("c")],
                                      MultiNodeOptions(backend="gloo", timeout=5))
    assert _checks({d["host"]: d for d in docs}["c"])["multinode.join"]["detail"] == written
