"""What an interrupted run leaves and the next one takes up (no Docker, no network): SIGTERM
and SIGHUP at the CLI's boundary, the image stream cut short on every host, a deploy taking up
what an interrupted one left (fake Docker), a re-run's rescued dpkg, the agent's end-of-run
clean-up, a killed playbook's rc. None of these bounds an elapsed time or signals beyond its own
process, so they run side by side; the timed ones are test_interrupts.py's (serial).
"""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from docker.models.containers import ExecResult

from tests.unit.fakes import FakeHost
from umprov.cli import cli, run
from umprov.deploy import options, outcome, rollout, state, stream
from umprov.deploy import spec as specs
from umprov.errors import Cancelled, ExitCode, Terminated, UmprovError
from umprov.hosts.fanout import Parallel
from umprov.hosts.progress import quiet
from umprov.hosts.results import HostOutcome
from umprov.paths import write_private
from umprov.provision import environment
from umprov.provision import results as run_results

# ---------------------------------------------------------------------------------------------
# SIGTERM at the boundary


def test_sigterm_is_not_an_exception_and_exits_143(capsys: pytest.CaptureFixture[str]) -> None:
    assert not issubclass(Terminated, Exception)  # `except Exception` per host lets it through

    @cli.command("boom-term")
    def _cmd() -> None:
        try:
            raise Terminated
        except Exception:  # noqa: BLE001 - what a per-host handler does
            pytest.fail("SIGTERM swallowed")

    try:
        assert run(["boom-term"]) == ExitCode.TERMINATED == 143
    finally:
        cli.commands.pop("boom-term", None)
    assert capsys.readouterr().err.strip() == "umprov: terminated (SIGTERM)"


def test_sigterm_handler_raises_terminated_in_the_main_thread() -> None:
    from umprov.cli import _on_sigterm

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sighup_stops_like_sigterm_and_exits_129(capsys: pytest.CaptureFixture[str]) -> None:
    from umprov.cli import _on_sigterm

    previous = signal.signal(signal.SIGHUP, _on_sigterm)

    @cli.command("hangup")
    def _cmd() -> None:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
        pytest.fail("SIGHUP did not stop the command")

    try:
        assert run(["hangup"]) == ExitCode.HANGUP == 129
    finally:
        cli.commands.pop("hangup", None)
        signal.signal(signal.SIGHUP, previous)
    assert capsys.readouterr().err.strip() == "umprov: terminated (SIGHUP)"


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN])
def test_main_handles_sighup_unless_started_under_nohup(
    inherited: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import umprov.cli as cli_module

    monkeypatch.setattr(cli_module, "run", lambda: 0)
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM)}
    signal.signal(signal.SIGHUP, inherited)
    try:
        with pytest.raises(SystemExit):
            cli_module.main()
        expected = cli_module._on_sigterm if inherited is signal.SIG_DFL else signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) == expected
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)




# ---------------------------------------------------------------------------------------------
# umprov.hosts.fanout


def test_parallel_map_keeps_order_and_raises_a_task_error() -> None:
    pool = Parallel(2)
    assert pool.map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]

    def boom(x: int) -> int:
        if x == 2:
            raise ValueError("two")
        return x

    with pytest.raises(ValueError, match="two"):
        Parallel(3).map(boom, [1, 2, 3])



# ---------------------------------------------------------------------------------------------
# The image stream (deploy --push)


def test_broadcast_interrupted_in_the_producer_stops_every_consumer() -> None:
    """Ctrl-C or SIGTERM while `docker save` streams: not a failed save on every host (exit
    10) but the interrupt itself, and every host's load is cut short at once."""
    b = stream.Broadcast(["a", "b"], depth=2)
    outcome: dict[str, str] = {}

    def eat(name: str) -> None:
        try:
            for _ in b.consume(name, [0]):
                pass
            outcome[name] = "complete"
        except Cancelled:
            outcome[name] = "cancelled"

    def chunks() -> Any:
        yield b"x" * 10
        yield b"y" * 10
        raise Terminated

    threads = [threading.Thread(target=eat, args=(n,), daemon=True) for n in "ab"]
    for t in threads:
        t.start()
    with pytest.raises(Terminated):
        b.produce(chunks())
    for t in threads:
        t.join(5)
    assert outcome == {"a": "cancelled", "b": "cancelled"}


def test_broadcast_save_error_still_reaches_the_hosts() -> None:
    b = stream.Broadcast(["a"], depth=2)
    got: list[str] = []

    def eat() -> None:
        try:
            list(b.consume("a", [0]))
        except UmprovError as exc:
            got.append(str(exc))

    t = threading.Thread(target=eat, daemon=True)
    t.start()

    def chunks() -> Any:
        yield b"x"
        raise OSError("disk gone")

    b.produce(chunks())
    t.join(5)
    assert got and "docker save failed" in got[0]


# ---------------------------------------------------------------------------------------------
# Deploy takes up what an interrupted deploy left (fake Docker)


KEY_BLOB = base64.b64encode(
    b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(range(32))).decode()
HOST_KEY = f"ssh-ed25519 {KEY_BLOB}"
NEVER = "0001-01-01T00:00:00Z"


class FakeContainer:
    def __init__(self, engine: FakeEngine, name: str, labels: dict[str, str], *,
                 started: bool = False, running: bool = False, token: str | None = None) -> None:
        self.engine = engine
        self.name = name
        self.labels = labels
        self.id = f"id-{len(engine.all) + 1}"
        self.state = {"Running": running, "Status": "running" if running else "created",
                      "StartedAt": "2026-12-01T00:00:00Z" if started else NEVER}
        self.token = token

    @property
    def attrs(self) -> dict[str, Any]:
        return {"State": dict(self.state)}

    @property
    def status(self) -> str:
        return str(self.state["Status"])

    def reload(self) -> None:
        pass

    def start(self) -> None:
        self.state.update(Running=True, Status="running", StartedAt="2026-12-01T00:00:01Z")

    def stop(self, timeout: int = 10) -> None:
        self.state.update(Running=False, Status="exited")

    def rename(self, name: str) -> None:
        assert self.engine.named(name) is None, f"{name} is taken"
        self.name = name

    def remove(self, force: bool = False) -> None:
        self.engine.all.remove(self)

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.getmembers()[0]
            fh = tar.extractfile(member)
            assert fh is not None
            self.token = fh.read().decode()
        return True

    def exec_run(self, cmd: list[str], user: str = "", demux: bool = False) -> ExecResult:
        if cmd[0] == "/usr/local/bin/umprov-healthcheck":
            return ExecResult(0, b"")
        if cmd[:4] == ["sh", "-c", 'cat "$1" && echo && cat "$2"', "sh"]:  # key and token
            files = {"/etc/ssh/keys/ssh_host_ed25519_key.pub": HOST_KEY + "\n", "/dev/null": ""}
            if self.token:
                files[specs.TOKEN_PATH] = self.token
            key, second = cmd[4:]
            if second not in files:
                return ExecResult(1, f"{files[key]}\ncat: {second}: No such file".encode())
            return ExecResult(0, f"{files[key]}\n{files[second]}".encode())
        raise AssertionError(cmd)


class FakeEngine:
    """The docker SDK surface rollout uses: containers get/list/create, images.get."""

    def __init__(self) -> None:
        self.all: list[FakeContainer] = []
        self.containers = SimpleNamespace(get=self._get, list=self._list, create=self._create)
        self.images = SimpleNamespace(
            get=lambda _id: SimpleNamespace(labels={"org.umprov.user": "umprov"}))

    def named(self, name: str) -> FakeContainer | None:
        return next((c for c in self.all if c.name == name), None)

    def _get(self, name: str) -> FakeContainer:
        from docker.errors import NotFound

        found = self.named(name)
        if found is None:
            raise NotFound(name)
        return found

    def _list(self, all: bool = False, filters: dict[str, Any] | None = None) -> list[Any]:  # noqa: A002
        return list(self.all)

    def _create(self, **kwargs: Any) -> FakeContainer:
        container = FakeContainer(self, kwargs["name"], dict(kwargs["labels"]))
        assert self.named(container.name) is None, "name taken"
        self.all.append(container)
        return container

    def add(self, name: str, labels: dict[str, str], **state: Any) -> FakeContainer:
        container = FakeContainer(self, name, labels, **state)
        self.all.append(container)
        return container


OPTS = options.DeployOptions(image="img:1", gpus="none", authorized_keys="ssh-ed25519 AAAA me")


def _labels() -> dict[str, str]:
    settings = options.settings_for(FakeHost(), OPTS)
    spec = specs.container_spec(settings, "sha256:img", OPTS.authorized_keys)
    return specs.labels_for(spec, settings.image)


def _rollout(engine: FakeEngine, progress: Any = quiet,
             cancel: threading.Event | None = None) -> HostOutcome:
    result = outcome.new_outcome("gpu1")
    host = FakeHost()
    rollout.rollout(engine, host, options.settings_for(host, OPTS), OPTS, "sha256:img", result,
                   progress, cancel=cancel)
    return result


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


def test_container_set_aside_by_an_interrupted_replacement_is_taken_back() -> None:
    engine = FakeEngine()
    engine.add("umprov-replaced-1764547200123", _labels(), started=True, token="tok-old")
    result = _rollout(engine)
    assert [c.name for c in engine.all] == ["umprov"]
    assert result.state == "started" and engine.all[0].token == "tok-old"
    assert state.token_path("gpu1").read_text() == "tok-old\n"


def test_container_created_but_never_started_is_replaced() -> None:
    engine = FakeEngine()
    engine.add("umprov", _labels())  # interrupted between create and start: maybe no token
    result = _rollout(engine)
    assert result.state == "replaced"
    (container,) = engine.all
    assert container.name == "umprov" and container.status == "running"
    assert state.token_path("gpu1").read_text().strip() == container.token


def test_token_file_of_a_replaced_container_is_corrected() -> None:
    """A run stopped after starting the new container, before recording its token."""
    engine = FakeEngine()
    engine.add("umprov", _labels(), started=True, running=True, token="tok-new")
    write_private(state.token_path("gpu1"), "tok-old\n")
    assert _rollout(engine).state == "unchanged"
    assert state.token_path("gpu1").read_text() == "tok-new\n"


def test_interrupted_replacement_puts_the_old_container_back() -> None:
    engine = FakeEngine()
    old = engine.add("umprov", {**_labels(), "org.umprov.spec-hash": "older"}, started=True,
                     running=True, token="tok-old")
    cancel = threading.Event()

    def progress(_host: str, message: str) -> None:
        if message == "creating the container":
            cancel.set()  # Ctrl-C arrives now; the next step stops

    with pytest.raises(Cancelled):
        _rollout(engine, progress, cancel)
    assert engine.all == [old]
    assert old.name == "umprov" and old.status == "running"
    assert not state.token_path("gpu1").exists()


def test_click_is_not_in_the_way_of_terminated() -> None:
    """Click turns KeyboardInterrupt into Abort; Terminated must pass through untouched."""

    @click.command()
    def cmd() -> None:
        raise Terminated

    with pytest.raises(Terminated):
        cmd.main([], standalone_mode=False)


def test_a_rescued_failure_is_a_note_not_the_hosts_failure() -> None:
    """A re-run after an interrupt: dpkg was left interrupted, the role's rescue finished it and
    ran the task again; the host converged (failed 0), so its result has no failure."""
    results: dict[str, run_results.HostCounts] = {}
    run_results.consume({"event": "runner_on_failed", "event_data": {
        "host": "a", "task": "Install Docker",
        "res": {"msg": "E: dpkg was interrupted, you must manually run 'dpkg --configure -a'"},
    }}, results, None)
    stats = {"ok": {"a": 9}, "changed": {"a": 2}, "failures": {}, "dark": {}, "skipped": {},
             "rescued": {"a": 1}}
    run_results.apply_stats(SimpleNamespace(stats=stats), results)
    assert results["a"].failure is None and results["a"].status == "changed"
    assert results["a"].notes == ["recovered: Install Docker: E: dpkg was interrupted, you must "
                                  "manually run 'dpkg --configure -a'"]


def test_end_of_an_agent_run_kills_its_marked_processes_and_removes_its_folder(
    tmp_path: Path,
) -> None:
    """What verify runs in the container on the way out (here, on this machine): every process
    carrying the run's mark ends, in any session; other processes are left alone."""
    from umprov.verify.remote import RUN_MARK, _end_run_script

    workdir = tmp_path / "umprov-verify-abcd1234"
    workdir.mkdir()
    env = {**os.environ, RUN_MARK: "abcd1234"}
    marked = [subprocess.Popen(["sleep", "60"], env=env),  # noqa: S607
              subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)]  # noqa: S607
    other = subprocess.Popen(["sleep", "60"], env={**env, RUN_MARK: "ffff0000"})  # noqa: S607
    try:
        time.sleep(0.2)
        done = subprocess.run(["sh", "-c", _end_run_script("abcd1234", str(workdir))],  # noqa: S607
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert [p.wait(timeout=10) for p in marked] == [-9, -9]
        assert other.poll() is None
        assert not workdir.exists()
    finally:
        for proc in [*marked, other]:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("written", "kept"), [("None", "254"), ("", "254"), ("0", "0"),
                                               ("-15", "-15"), ("2\n", "2\n")])
def test_a_killed_playbook_leaves_a_numeric_rc(tmp_path: Path, written: str, kept: str) -> None:
    # ansible-runner writes "None" when the child was killed before it saw the cancel.
    (tmp_path / "rc").write_text(written)
    environment.settle_rc(tmp_path)
    assert (tmp_path / "rc").read_text() == kept
    environment.settle_rc(tmp_path / "missing")  # no rc file: nothing to do


def test_an_interrupted_run_leaves_without_a_thread_that_does_not_end() -> None:
    """After a signal, a lingering non-daemon thread (ansible-runner's, on a starved machine)
    does not hold umprov's exit; the code and what was printed are kept."""
    import sys

    script = ("import threading, time\n"
              "threading.Thread(target=time.sleep, args=(600,)).start()\n"
              "print('report', flush=False)\n"
              "from umprov.cli import leave\n"
              "leave(130)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130 and done.stdout == "report\n"


def test_a_finished_run_leaves_with_its_code() -> None:
    import sys

    done = subprocess.run([sys.executable, "-c", "from umprov.cli import leave; leave(3)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
