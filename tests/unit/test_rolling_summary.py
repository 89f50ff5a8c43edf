"""`umprov provision --rolling`: its options, what it gives ansible-playbook, and the per-batch
summary built from ansible-runner's events.

tests/data/rolling/events.jsonl was recorded from a real `umprov provision --rolling --batch 2
--max-fail-percent 50 --verify passive` over four local hosts with stand-in Slurm nodes (the
set-up of test_rolling_playbook.py): n1 the canary, n3 sick (a failed row remap), n4 drained by
an administrator. Events were trimmed to the fields umprov reads; nothing was added to them
except where a test says so. Here ansible-runner replays them.
"""

from __future__ import annotations

import io
import json
import shlex
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from umprov import rolling

DATA = Path(__file__).resolve().parents[1] / "data" / "rolling"
PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "rolling.yml"


def recorded() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def inventory(tmp_path) -> Path:
    hosts = {name: {"ansible_connection": "local"} for name in ("n1", "n2", "n3", "n4")}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


@pytest.fixture
def replay(monkeypatch, tmp_path):
    """ansible-runner replaced by a replay of ``replay.events``; ``replay.given`` is what
    ansible-playbook would have been given (its playbook and every -e file's variables)."""
    import ansible_runner

    state = SimpleNamespace(events=recorded(), given={})

    def run_async(**kw: Any) -> tuple[threading.Thread, Any]:
        args = shlex.split(kw["cmdline"])
        files = [a[1:] for a in args if a.startswith("@")]
        state.given = {"playbook": kw["playbook"],
                       "vars": [json.loads(Path(f).read_text()) for f in files]}
        stats = next(e["event_data"] for e in state.events if e["event"] == "playbook_on_stats")
        runner = SimpleNamespace(status="failed", rc=2, stats=stats, stdout=io.StringIO(""),
                                 config=SimpleNamespace(artifact_dir=str(tmp_path / "a" / "1")))

        def play() -> None:
            for event in state.events:
                kw["event_handler"](event)
            kw["finished_callback"](runner)

        thread = threading.Thread(target=play, daemon=True)
        thread.start()
        return thread, runner

    monkeypatch.setattr(ansible_runner, "run_async", run_async)
    return state


def test_the_summary_says_per_batch_how_each_host_was_left(umprov_cli, inventory, replay):
    result = umprov_cli("provision", str(inventory), "--rolling", "--batch", "2",
                        "--max-fail-percent", "50", "--verify", "passive", "--json")
    assert result.exit_code == 10, result.stderr  # a host failed
    doc = json.loads(result.stdout)
    assert doc["schema"] == "umprov.rolling/1" and doc["playbook"] == "playbooks/rolling.yml"
    assert doc["batches"] == [["n1"], ["n2", "n3"], ["n4"]]
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert {n: (h["batch"], h["action"], h["verified"]) for n, h in hosts.items()} == {
        "n1": (1, "resumed", "passive pass"), "n2": (2, "resumed", "passive pass"),
        "n3": (2, "drained", "passive fail"), "n4": (3, "left drained", "passive pass")}
    assert hosts["n3"]["status"] == "failed"
    assert hosts["n3"]["reason"] == "umprov: gpu0 ecc.row_remap_failure"
    assert (hosts["n4"]["status"], hosts["n4"]["reason"]) == ("ok", "bad DIMM B3")
    assert hosts["n1"]["changed"] == "3 task(s) changed"  # the health check installed
    err = result.stderr
    assert "rolling batch 1 of 3 (canary): 1 host(s)" in err
    assert "rolling batch 3 of 3: 1 host(s)" in err
    assert "rolling: 4 host(s) in 3 of 3 batch(es)" in err
    assert "rollout stopped after" not in err  # every batch ran


@pytest.mark.parametrize(("total", "variables", "sizes"), [
    (4, {"umprov_rolling_batch": 2}, [1, 2, 1]),
    (8, {}, [1, 2, 2, 2, 1]),  # the playbook's defaults: a canary, then 25 % of all hosts
    (8, {"umprov_rolling_canary": 1, "umprov_rolling_batch": "3,4"}, [1, 3, 4]),
    (2, {"umprov_rolling_batch": "10%"}, [1, 1]),  # a percent is at least one host
    (1, {"umprov_rolling_canary": 2}, [1]),
])
def test_the_planned_batches_are_ansibles_serial(total, variables, sizes):
    assert rolling.planned_batches(total, variables) == sizes


def test_a_canary_over_the_failure_budget_says_it_stopped_the_rollout():
    """Two batches planned, the canary failed with a budget of 0 %: 'batch 1 of 2', and a line
    saying why the second never ran."""
    from umprov.hosts.results import HostOutcome

    hosts = [HostOutcome("n1", "failed", "gate failed", {"batch": 1}),
             HostOutcome("n2", "failed", "not reached", {"batch": None})]
    result = rolling.RollingResult("playbooks/rolling.yml", "hosts.yml", 1.0, "", hosts,
                                   [["n1"]], rolling.planned_batches(2, {}), 0)
    titles = [title for title, _ in result.batch_outcomes()]
    assert titles == ["batch 1 of 2 (canary): 1 host(s)", "not reached: 1 host(s)"]
    assert result.stopped_by_budget() == (
        "the rollout stopped after batch 1: 1 of its 1 host(s) failed, over the failure budget "
        "of 0 % (--max-fail-percent); 1 host(s) not reached")


def test_the_options_reach_the_playbook_and_the_agent_travels(umprov_cli, inventory, replay):
    umprov_cli("provision", str(inventory), "--rolling", "--canary", "2", "--batch", "25%",
               "--max-fail-percent", "10", "--verify", "full", "--drain-timeout", "600",
               "--only", "driver", "-e", "umprov_rolling_reason=driver 580.95")
    assert replay.given["playbook"].endswith("playbooks/rolling.yml")
    agent, user, options = replay.given["vars"]
    assert Path(agent["slurm_gpu_health_agent_src"]).suffix == ".pyz"
    assert user == {"umprov_rolling_reason": "driver 580.95"}
    assert options == {"umprov_rolling_canary": 2, "umprov_rolling_batch": "25%",
                       "umprov_rolling_max_fail_percentage": 10,
                       "umprov_rolling_verify": "full", "umprov_rolling_drain_timeout": 600,
                       "umprov_rolling_roles": ["nvidia_driver"]}


def test_a_list_of_batch_sizes_reaches_the_playbook_as_given(umprov_cli, inventory, replay):
    umprov_cli("provision", str(inventory), "--rolling", "--batch", "3,4")
    assert replay.given["vars"][-1]["umprov_rolling_batch"] == "3,4"


def test_what_a_role_did_is_what_changed(umprov_cli, inventory, replay):
    # Added to the recording: the driver role's own summary fact, as it sets it on n1.
    status = {"action": "installed", "version": "580.95.05", "kernel_module": "open",
              "rebooted": True}
    at = next(i for i, e in enumerate(replay.events) if e["event_data"].get("task") ==
              rolling.GATE)
    replay.events.insert(at, {"event": "runner_on_ok", "event_data": {
        "host": "n1", "play": rolling.PLAY, "task": "Record the driver state for the run summary",
        "res": {"changed": False, "ansible_facts": {"nvidia_driver_status": status}}}})
    result = umprov_cli("provision", str(inventory), "--rolling", "--json")
    (n1,) = [h for h in json.loads(result.stdout)["hosts"] if h["host"] == "n1"]
    assert n1["changed"] == "driver 580.95.05 installed (open), rebooted"


def interrupted_rollout(umprov_cli: Any, inventory: Any, monkeypatch: Any, task: str,
                        offset: int) -> tuple[Any, list[str]]:
    """`provision --rolling` fed the recorded run's events up to batch 2's ``task`` start (plus
    ``offset`` events), then Ctrl-C: the result (exit 130) and its "rollout stopped" lines."""
    events = recorded()
    starts = [i for i, e in enumerate(events) if e["event"] == "playbook_on_task_start"
              and e["event_data"]["task"] == task]

    def interrupted(inventory: Any, **kw: Any) -> None:
        for event in events[: starts[1] + offset + 1]:
            kw["on_raw"](event)
        raise KeyboardInterrupt

    monkeypatch.setattr("umprov.provision.run_playbook", interrupted)
    result = umprov_cli("provision", str(inventory), "--rolling")
    assert result.exit_code == 130
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("umprov: rollout stopped")]
    return result, lines


def test_an_interrupt_says_how_it_left_each_host_it_reached(umprov_cli, inventory, monkeypatch):
    """Interrupted after batch 2's hosts were held: both stay drained, each with its reason."""
    # batch 2 held, its gate not started
    result, lines = interrupted_rollout(umprov_cli, inventory, monkeypatch, rolling.GATE, -1)
    assert len(lines) == 3
    assert lines[0].startswith("umprov: rollout stopped: n1 (batch 1): resumed")
    for host, line in zip(("n2", "n3"), lines[1:], strict=True):
        assert line.startswith(f"umprov: rollout stopped: {host} (batch 2): drained: "
                               "umprov: rolling driver change 20")
    assert "a re-run continues where this one stopped" in result.stderr


def test_an_interrupt_during_a_hold_names_the_hosts_still_in_it(umprov_cli, inventory,
                                                                  monkeypatch):
    """Interrupted while batch 2's hold runs (a job to wait for): no result came for it, and
    each of its hosts is named, as maybe drained (seen on the lab's real Slurm)."""
    _result, lines = interrupted_rollout(umprov_cli, inventory, monkeypatch, rolling.HOLD, 0)
    assert lines[0].startswith("umprov: rollout stopped: n1 (batch 1): resumed")
    assert lines[1:] == [f"umprov: rollout stopped: {host} (batch 2): stopped during its hold: "
                         f"drained with 'umprov: rolling ...' once its scontrol ran "
                         f"(sinfo -R -n {host})" for host in ("n2", "n3")]


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--batch", "0"], 4, "--batch: '0' is not a number of hosts (3), a percent of them"),
    (["--batch", "3,,4"], 4, "--batch: '3,,4' is not a number of hosts"),
    (["--batch", "x%"], 4, "--batch: 'x%' is not a number of hosts"),
    (["--canary", "0"], 4, "--canary"),  # Click's range: a bad value too
    (["--max-fail-percent", "101"], 4, "--max-fail-percent"),
    (["--verify", "slow"], 4, "--verify"),
    (["--check"], 4, "--rolling cannot be a dry run (--check)"),
    (["--playbook", "site.yml", "--playbook", "driver.yml"], 4, "--playbook does not apply"),
])
def test_bad_rolling_options_are_refused_before_any_host(umprov_cli, args, code, message):
    result = umprov_cli("provision", "nowhere.yml", "--rolling", *args)
    assert result.exit_code == code
    assert message in result.stderr


def test_rolling_options_need_rolling(umprov_cli):
    result = umprov_cli("provision", "nowhere.yml", "--batch", "3", "--verify", "quick")
    assert result.exit_code == 4
    assert "--batch, --verify: only with --rolling" in result.stderr


def test_the_help_shows_the_rolling_options(umprov_cli):
    result = umprov_cli("provision", "--rolling", "--help")
    assert result.exit_code == 0
    for option in ("--rolling", "--canary", "--batch", "--max-fail-percent", "--verify",
                   "--drain-timeout"):
        assert option in result.stdout


def test_the_steps_it_reads_are_the_playbooks():
    plays = yaml.safe_load(PLAYBOOK.read_text())
    (play,) = [p for p in plays if p.get("name") == rolling.PLAY]
    names: list[str] = []
    pending = list(play["tasks"])
    while pending:
        task = pending.pop()
        names.append(task["name"])
        pending += task.get("block", []) + task.get("rescue", [])
    assert set(rolling.STEPS) <= set(names)
