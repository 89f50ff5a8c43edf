"""SSH sessions that the docker SDK opens through umprov's adapter (umprov.hosts.docker_ssh).

The stand-in is a paramiko transport whose sessions are socket pairs, each served by a small
HTTP engine in a thread (as ``docker system dial-stdio`` passes HTTP to the engine), with
sshd's limit on sessions per connection: past ``max_sessions`` a new one is refused as sshd
refuses it. A closed session ends ``linger`` seconds later, as dial-stdio takes a moment to
exit on a loaded host.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import paramiko
import pytest

from tests.unit.fakes import FakeHost
from umprov.errors import EngineDown
from umprov.hosts import docker_ssh, engine


class _Channel(socket.socket):
    def exec_command(self, command: str) -> None:
        assert command == "docker system dial-stdio"


class _Transport:
    def __init__(self, max_sessions: int, linger: float) -> None:
        self.max_sessions, self.linger = max_sessions, linger
        self.lock = threading.Lock()
        self.open = self.peak = self.refused = 0

    def is_active(self) -> bool:
        return True

    def open_session(self) -> _Channel:
        with self.lock:
            if self.open >= self.max_sessions:
                self.refused += 1
                raise paramiko.ChannelException(2, "Connect failed")
            self.open += 1
            self.peak = max(self.peak, self.open)
        ours, theirs = socket.socketpair()
        threading.Thread(target=self._serve, args=(theirs,), daemon=True).start()
        return _Channel(fileno=ours.detach())

    def _serve(self, sock: socket.socket) -> None:
        with sock, sock.makefile("rb") as reader:
            while (line := reader.readline()) and line.strip():
                path = line.split()[1].decode()
                length = 0
                while (header := reader.readline().strip()):
                    name, _, value = header.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                reader.read(length)
                body = json.dumps({"ApiVersion": "1.41", "Path": path}).encode()
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(self.linger)
        with self.lock:
            self.open -= 1


class _Client:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport

    def get_transport(self) -> _Transport:
        return self.transport

    def close(self) -> None:
        pass


@pytest.fixture
def host_engine(monkeypatch: pytest.MonkeyPatch):
    """docker_client(host) over a stand-in sshd: (max_sessions, linger) -> (client, transport)."""
    made: list[Any] = []

    def make(max_sessions: int = 10, linger: float = 0.0) -> tuple[Any, _Transport]:
        transport = _Transport(max_sessions, linger)
        monkeypatch.setattr(docker_ssh, "connect", lambda host, trust_new=False: _Client(transport))
        client = engine.docker_client(FakeHost(name="gpu-1"))
        made.append(client)
        return client, transport

    yield make
    for client in made:
        client.close()


def test_requests_to_many_urls_reuse_one_session(host_engine) -> None:
    # The SDK's own adapter keeps a pool per URL (9): each exec's URLs held a session of
    # their own, and with sessions that end late the host refused new ones.
    client, transport = host_engine(max_sessions=3, linger=0.5)
    for i in range(40):
        assert client.api.inspect_container(f"c{i}")["Path"] == f"/v1.41/containers/c{i}/json"
    assert transport.peak == 1
    assert transport.refused == 0


def test_a_refused_session_is_asked_for_again(host_engine) -> None:
    client, transport = host_engine(max_sessions=1)
    client.api.inspect_container("warm")  # one session, idle in the pool
    client.api.close()  # the pool's idle session ends
    while transport.open:
        time.sleep(0.01)
    other = transport.open_session()  # another caller holds the one session the host allows
    threading.Timer(0.3, other.close).start()
    started = time.monotonic()
    assert client.api.inspect_container("c1")["Path"].endswith("/c1/json")
    assert transport.refused >= 1
    assert time.monotonic() - started >= 0.25


def test_a_session_refused_for_good_names_the_host_and_max_sessions(
    host_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, transport = host_engine(max_sessions=1)
    client.api.close()
    while transport.open:
        time.sleep(0.01)
    blocker = transport.open_session()
    monkeypatch.setattr(docker_ssh, "SESSION_WAIT_S", 0.3)
    with pytest.raises(EngineDown, match=r"gpu-1: sshd refused a new SSH session .*MaxSessions"):
        client.api.inspect_container("c1")
    blocker.close()
