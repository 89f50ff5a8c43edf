"""The docker SDK's ssh:// transport over a paramiko connection umprov made and verified
(``umprov.hosts.ssh.connect``), with one pool of SSH sessions per engine. Imported by
``umprov.hosts.engine.docker_client`` when a client is made: docker and paramiko load then.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import paramiko
from docker.transport import sshconn
from docker.transport.basehttpadapter import BaseHTTPAdapter

from umprov.errors import EngineDown
from umprov.hosts import HostLike
from umprov.hosts.ssh import connect, host_pattern

# A new SSH session that the host's sshd refuses (past its MaxSessions) is asked for again
# until this many seconds have passed: the sessions of closed connections end with their
# ``docker system dial-stdio``, which a loaded host takes a moment to finish.
SESSION_WAIT_S = 30.0
# Idle connections (SSH sessions) kept for reuse: more than umprov runs at once on one engine,
# well under sshd's default MaxSessions (10).
POOL_SIZE = 4


class SessionConnection(sshconn.SSHConnection):
    """An HTTP connection to the engine: one SSH session running dial-stdio."""

    def __init__(self, host_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host_name = host_name  # for the error when sshd refuses every session

    def connect(self) -> None:
        deadline = time.monotonic() + SESSION_WAIT_S
        pause = 0.05
        while True:
            try:
                channel = self.ssh_transport.open_session()
                break
            except paramiko.ChannelException as exc:
                if time.monotonic() + pause > deadline:
                    raise EngineDown(
                        f"{self.host_name}: sshd refused a new SSH session for "
                        f"{SESSION_WAIT_S:.0f} s ({exc}); is its MaxSessions below the "
                        f"few that umprov opens at once ({POOL_SIZE} idle at most)?"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
        channel.settimeout(self.timeout)
        channel.exec_command("docker system dial-stdio")
        self.sock = channel


class SessionPool(sshconn.SSHConnectionPool):
    """The engine's one pool of SessionConnections."""

    def __init__(self, host_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host_name = host_name

    def _new_conn(self) -> Any:
        return SessionConnection(self.host_name, ssh_transport=self.ssh_transport,
                                 timeout=self.timeout, host=self.ssh_host)


class VerifiedSSHAdapter(sshconn.SSHHTTPAdapter):
    """A docker SSHHTTPAdapter that uses an SSHClient we connected (and verified) ourselves,
    with one pool of connections for the engine (``get_connection``)."""

    def __init__(self, host: HostLike, trust_new: bool, timeout: float,
                 ssh: Any = None) -> None:
        # Not SSHHTTPAdapter.__init__: it builds its own paramiko client from
        # ~/.ssh/config and ~/.ssh/known_hosts only.
        self._umprov_host = host
        self._umprov_trust_new = trust_new
        self.ssh_params = {}
        self.ssh_host = host_pattern(host.address, host.port)
        self.timeout = timeout
        self.max_pool_size = POOL_SIZE
        self.pools = sshconn.RecentlyUsedContainer(1, dispose_func=lambda p: p.close())
        BaseHTTPAdapter.__init__(self)
        self.ssh_client = ssh or connect(host, trust_new=trust_new)

    def _connect(self) -> None:
        # Called by get_connection when the transport is gone: reconnect, verified again.
        with contextlib.suppress(Exception):
            self.ssh_client.close()
        self.ssh_client = connect(self._umprov_host, trust_new=False)

    def get_connection(self, url: Any, proxies: Any = None) -> Any:
        # One pool whatever the URL. The SDK keeps a pool per URL (9 of them), and each
        # exec has URLs of its own: every exec opened SSH sessions that stayed open in
        # pools, up to 9 idle at once, one short of sshd's default MaxSessions (10); a
        # session still ending made the host refuse the next ("Connect failed").
        with self.pools.lock:
            transport = self.ssh_client.get_transport()
            if transport is None or not transport.is_active():
                self.pools.clear()
                self._connect()
            pool = self.pools.get("engine")
            if pool is None:
                pool = SessionPool(self._umprov_host.name, ssh_client=self.ssh_client,
                                   timeout=self.timeout, maxsize=self.max_pool_size,
                                   host=self.ssh_host)
                self.pools["engine"] = pool
        return pool
