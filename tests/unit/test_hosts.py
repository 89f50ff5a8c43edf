"""umprov.hosts: one outcome model and its exit codes, its renderers, the fan-out, commands in
a container under a deadline, tar in and out (no Docker, no network)."""

from __future__ import annotations

import io
import socket
import struct
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from docker.models.containers import ExecResult

from umprov.errors import Cancelled, ExitCode
from umprov.hosts import is_loopback, render
from umprov.hosts.engine import (
    engine_error,
    exec_in,
    keep_exec_output,
    one_line,
    tar_files,
    untar_one,
)
from umprov.hosts.fanout import settle
from umprov.hosts.results import HostOutcome, Kind, exit_code

# --- outcomes and exit codes -----------------------------------------------------------------


def test_exit_codes():
    """Deploy's states: failed beats untrusted beats unreachable."""
    ok = HostOutcome("a", "unchanged")
    down = HostOutcome("b", "unreachable")
    untrusted = HostOutcome("c", "untrusted")
    failed = HostOutcome("d", "failed")
    assert exit_code([ok]) == ExitCode.OK
    assert exit_code([ok, down]) == ExitCode.HOSTS_UNREACHABLE
    assert exit_code([ok, down, untrusted]) == ExitCode.TRUST
    assert exit_code([ok, down, failed]) == ExitCode.HOSTS_FAILED
    assert exit_code([]) == ExitCode.OK


def test_every_state_not_a_problem_is_a_success():
    for word in ("created", "replaced", "started", "changed", "ok", "reachable", "pass"):
        assert HostOutcome("a", word).ok and HostOutcome("a", word).kind is Kind.OK
    assert not HostOutcome("a").ok  # pending: it never finished
    assert exit_code([HostOutcome("a")]) == ExitCode.HOSTS_FAILED


def test_verify_verdicts_map_to_verifys_exit_codes():
    """The model fits verify: a failed check is 13, warnings only 12, and 11 when the only
    failures are hosts that could not be reached (as umprov.verify.report.run_exit_code)."""
    from umprov.verify import report

    def verdicts(*words: str) -> ExitCode:
        return exit_code([HostOutcome(str(i), w) for i, w in enumerate(words)],
                         failed=ExitCode.VERIFY_FAIL)

    unreachable = report.failed_host_report("x", "agent.connect", f"{report.UNREACHABLE}gone")
    broken = report.failed_host_report("y", "agent.run", "the agent crashed")
    for docs, words in (([unreachable], ("unreachable",)), ([broken, unreachable],
                                                            ("fail", "unreachable"))):
        assert report.run_exit_code(docs) == verdicts(*words)
    assert verdicts("pass", "warn") == ExitCode.VERIFY_WARN
    assert verdicts("pass", "warn", "unreachable") == ExitCode.HOSTS_UNREACHABLE
    assert verdicts("pass", "fail", "unreachable") == ExitCode.VERIFY_FAIL


# --- renderers -------------------------------------------------------------------------------


FIELDS: list[render.Field] = [
    ("host", render.host),
    ("ok", render.ok),
    ("status", render.state),
    ("seconds", render.datum("seconds", 2)),
    ("extra", render.datum("extra")),
    ("error", lambda o: o.detail or render.ABSENT),
]


def test_records_keep_the_field_order_and_leave_absent_fields_out():
    done = HostOutcome("a", "created", data={"seconds": 1.23456, "extra": [1]})
    down = HostOutcome("b", "unreachable", "refused", data={"seconds": 0.0})
    assert render.records([done, down], FIELDS) == [
        {"host": "a", "ok": True, "status": "created", "seconds": 1.23, "extra": [1]},
        {"host": "b", "ok": False, "status": "unreachable", "seconds": 0.0, "error": "refused"},
    ]
    assert list(render.records([done], FIELDS)[0]) == ["host", "ok", "status", "seconds", "extra"]


def test_rows_give_empty_cells_for_absent_fields():
    down = HostOutcome("b", "unreachable", "refused", data={"seconds": 0.5})
    assert render.rows([down], FIELDS) == [["b", False, "unreachable", 0.5, None, "refused"]]


# --- fan-out ---------------------------------------------------------------------------------


def test_settle_gives_each_result_error_or_lateness_in_order():
    release = threading.Event()

    def work(item: str) -> str:
        if item == "boom":
            raise ValueError("boom")
        if item == "slow":
            release.wait(10)
        return item.upper()

    started = time.monotonic()
    out = settle(work, ["a", "boom", "slow"], timeout=0.5)
    release.set()
    assert time.monotonic() - started < 3
    assert out[0] == "A"
    assert isinstance(out[1], ValueError) and isinstance(out[2], TimeoutError)


# --- engine helpers --------------------------------------------------------------------------


class Container:
    def __init__(self, delay: float = 0.0, result: ExecResult | None = None) -> None:
        self.delay = delay
        self.result = result or ExecResult(0, b"out\n")
        self.calls: list[dict[str, Any]] = []

    def exec_run(self, cmd: list[str], **kwargs: Any) -> ExecResult:
        self.calls.append(kwargs)
        time.sleep(self.delay)
        return self.result


def test_exec_in_returns_code_and_output():
    box = Container(result=ExecResult(3, b"caf\xc3\xa9 \xff"))
    assert exec_in(box, ["true"], 5) == (3, "café \ufffd")
    assert box.calls == [{"demux": False}]
    exec_in(box, ["true"], 5, user="root")
    assert box.calls[-1] == {"demux": False, "user": "root"}


def test_exec_in_deadline_and_cancel():
    started = time.monotonic()
    assert exec_in(Container(delay=5), ["sleep"], 0.3) == (None, "")
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(Cancelled):
        exec_in(Container(delay=5), ["sleep"], 30, cancel=cancel)
    assert time.monotonic() - started < 3


def test_exec_in_raises_the_sdks_error_in_the_caller():
    class Broken:
        def exec_run(self, cmd: list[str], **kwargs: Any) -> ExecResult:
            raise ConnectionError("gone")

    with pytest.raises(ConnectionError, match="gone"):
        exec_in(Broken(), ["x"], 5)


class _Engine:
    """A requests adapter standing in for an engine over SSH: the command's frames already sit
    in the buffer the response's headers were read through (they came in together), and the
    channel behind it is at its end, as when a short command ended before the client read on."""

    def __init__(self, frames: bytes) -> None:
        self.frames = frames
        self.channels: list[socket.socket] = []

    def send(self, request: Any, **_kw: Any) -> Any:
        import requests

        response = requests.Response()
        response.status_code, response.request, response.url = 200, request, request.url
        if request.url.endswith("/exec"):
            response._content = b'{"Id": "e1"}'
        elif request.url.endswith("/exec/e1/json"):
            response._content = b'{"ExitCode": 0, "Running": false}'
        else:  # /exec/e1/start
            ours, theirs = socket.socketpair()
            theirs.close()
            self.channels.append(ours)
            buffered = io.BytesIO(self.frames)
            buffered.channel = ours  # what the SDK reads for ssh://
            response.raw = SimpleNamespace(_fp=SimpleNamespace(fp=buffered),
                                           close=lambda: None, release_conn=lambda: None)
        return response

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


@pytest.mark.parametrize("demux", [False, True])
def test_exec_output_that_came_with_the_headers_is_kept(demux: bool) -> None:
    import docker
    from docker.models.containers import Container as Model

    frames = _frame(1, b"ssh-ed25519 AAAA") + _frame(2, b"a warning\n") + _frame(1, b" key\n")
    api = docker.APIClient(base_url="ssh://lab@127.0.0.1:2222", use_ssh_client=True,
                           version="1.41")
    engine = _Engine(frames)
    api.mount("http+docker://ssh", engine)
    try:
        # The SDK's own reading loses it all: exit code 0, no output.
        assert docker.APIClient.exec_start(api, "e1") == b""
        keep_exec_output(api)
        result = Model(attrs={"Id": "c1"}, client=SimpleNamespace(api=api)).exec_run(
            ["cat", "key.pub"], demux=demux)
    finally:
        engine.close()
    assert result.exit_code == 0
    if demux:
        assert result.output == (b"ssh-ed25519 AAAA key\n", b"a warning\n")
    else:
        assert result.output == b"ssh-ed25519 AAAAa warning\n key\n"  # as the frames came


@pytest.mark.parametrize("make", ["product", "lab"])
def test_local_engine_clients_keep_exec_output(make: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's engine loses short outputs too (`lab up --slurm` once read an empty
    `id -u munge`): the product's client and the lab's both read exec output whole."""
    import docker

    from umprov.hosts import engine
    from umprov_lab.engine import docker_engine

    client = SimpleNamespace(api=SimpleNamespace(), ping=lambda: True)
    monkeypatch.setattr(docker, "from_env", lambda **_: client)
    made = engine.local_engine() if make == "product" else docker_engine(start=False)
    assert made is client
    assert client.api.exec_start.__func__ is engine._exec_start


def test_tar_round_trip_and_modes():
    import io
    import tarfile

    data = tar_files({"etc/a": b"one", "b": b"two"}, mode=0o400)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [(m.name, m.mode, m.uid) for m in members] == [("etc/a", 0o400, 0), ("b", 0o400, 0)]
    assert untar_one([data[:100], data[100:]]) == b"one"


def test_engine_errors_are_one_line():
    err = SimpleNamespace(explanation="port is\nalready allocated")
    exc = type("APIError", (Exception,), {"explanation": "port is\nalready allocated"})("500")
    assert engine_error(exc) == "port is already allocated"
    assert engine_error(exc, named=True) == "APIError: port is already allocated"
    assert engine_error(RuntimeError("x" * 400)) == "x" * 300
    assert engine_error(RuntimeError("")) == "RuntimeError"
    assert one_line(err.explanation, 7) == "port is"


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("gpu-node-1")
    assert not is_loopback("0.0.0.0")  # noqa: S104 (a value under test)
