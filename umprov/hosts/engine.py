"""The docker SDK, on a host's engine over verified SSH or on this machine's engine.

``docker_client`` gives a docker SDK client whose ssh:// transport runs over a paramiko
connection made by ``umprov.hosts.ssh.connect`` (the SDK's own transport would read only
~/.ssh/known_hosts). ``local_engine`` is this machine's engine, never started here. Beside
them, what every caller of an engine needs: one line for an engine's error, a command in a
container under a deadline (the SDK has none), and files in and out of a container as tar.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import struct
import tarfile
import threading
import time
import types
from collections.abc import Iterable, Mapping
from typing import Any

from umprov.errors import Cancelled, EngineDown, EnvironmentProblem, UmprovError
from umprov.hosts import HostLike
from umprov.hosts.ssh import plain_reason

# ---------------------------------------------------------------------------------------------
# Clients


def docker_client(host: HostLike, *, trust_new: bool = False, timeout: float = 300.0,
                  ssh: Any = None) -> Any:
    """A docker SDK client for the engine on ``host``, over SSH with a verified host key.

    How: the SDK builds its ssh:// transport (SSHHTTPAdapter) from ~/.ssh/config and the user's
    known_hosts only. We create the client in shell-out mode with a pinned API version, which
    makes no connection at all, then mount our adapter, whose paramiko client was connected by
    ``connect`` (RejectPolicy semantics, umprov's known_hosts files). Returns a
    docker.DockerClient. Requests then run as the SDK
    expects: each HTTP connection is an exec channel running ``docker system dial-stdio``,
    kept for reuse in one pool per engine (the adapter's ``get_connection``). ``ssh``: a
    connection ``connect`` made already, used instead of a second one (the client closes it).
    """
    import docker

    client = docker.DockerClient(
        base_url=f"ssh://{host.user or getpass.getuser()}@{host.address}:{host.port}",
        use_ssh_client=True,  # no connection here; replaced below
        version="1.41",
        timeout=int(timeout),
    )
    from umprov.hosts.docker_ssh import VerifiedSSHAdapter

    adapter = VerifiedSSHAdapter(host, trust_new, timeout, ssh)
    api = client.api
    api._custom_adapter = adapter
    api.mount("http+docker://ssh", adapter)
    keep_exec_output(api)
    try:
        api._version = api._retrieve_server_version()
    except docker.errors.DockerException as exc:
        adapter.close()
        raise EngineDown(
            f"{host.name}: Docker engine not answering ({engine_error(exc, limit=200)})"
        ) from None
    return client


def keep_exec_output(api: Any) -> None:
    """Make ``api`` (a docker.APIClient) run commands with ``exec_run`` without losing output
    (``_exec_start``)."""
    api.exec_start = types.MethodType(_exec_start, api)


def _exec_start(api: Any, exec_id: str, detach: bool = False, tty: bool = False,
                stream: bool = False, socket: bool = False, demux: bool = False) -> Any:
    """The SDK's ``exec_start`` (what ``exec_run`` calls) without losing output.

    The SDK reads the upgraded connection's raw channel, past the buffer that the HTTP client
    read the response's headers through: bytes that came in with the headers stayed in that
    buffer, and a short command's whole output came back empty with exit code 0 (13 times in
    300 under load: bench/exec_output.py; docker-py issues 2042 and 3332). Here the frames
    are read through that buffer. Other modes (detached, tty, streamed, socket) are the SDK's."""
    if detach or tty or stream or socket:
        return type(api).exec_start(api, exec_id, detach=detach, tty=tty, stream=stream,
                                    socket=socket, demux=demux)
    response = api._post_json(api._url("/exec/{0}/start", exec_id),
                              headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                              data={"Tty": False, "Detach": False}, stream=True)
    # Raises for the status; no read timeout: the caller's deadline bounds the command.
    api._disable_socket_timeout(api._get_raw_response_socket(response))
    buffered = response.raw._fp.fp  # the headers' buffer, then the channel behind it
    frames: list[tuple[int, bytes]] = []
    try:
        while len(header := _read_exactly(buffered, 8)) == 8:
            kind, length = _FRAME.unpack(header)
            frames.append((kind, _read_exactly(buffered, length)))
    finally:
        response.close()
    if demux:
        return tuple(b"".join(d for k, d in frames if k == want) or None for want in (1, 2))
    return b"".join(data for _, data in frames)  # as they came, as the SDK joins them


_FRAME = struct.Struct(">BxxxL")  # the engine's stream frame: stream number, payload length


def _read_exactly(raw: Any, size: int) -> bytes:
    chunks, left = [], size
    while left > 0 and (chunk := raw.read(left)):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def local_engine() -> Any:
    """A docker SDK client for this machine's engine (``docker.from_env``); never starts one."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except DockerException as exc:
        raise EnvironmentProblem(f"no Docker engine answers: {engine_error(exc)}") from None
    # The local socket loses short outputs as SSH does (`lab up --slurm`, whose client this
    # is too, read an empty `id -u munge`).
    keep_exec_output(client.api)
    return client


def connection_lost(client: Any, exc: BaseException) -> bool:
    """Whether ``exc``, raised by a docker client of ``docker_client``, means its SSH
    connection is gone (the host went away mid-run) rather than an error from the engine."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | EOFError | ConnectionError):
        return True
    try:
        transport = client.api._custom_adapter.ssh_client.get_transport()
    except AttributeError:
        return False
    return transport is None or not transport.is_active()


# ---------------------------------------------------------------------------------------------
# Errors, commands and files


def one_line(text: object, limit: int = 300) -> str:
    """``text`` folded onto one line, at most ``limit`` characters."""
    return " ".join(str(text).split())[:limit]


def engine_error(exc: BaseException, *, limit: int = 300, named: bool = False) -> str:
    """One line for an error of a Docker engine or the docker SDK: the engine's own
    explanation when it gave one; ``named``: after the exception's class name."""
    text = plain_reason(getattr(exc, "explanation", None) or exc)
    if named:
        text = f"{type(exc).__name__}: {text}"
    return text[:limit] or type(exc).__name__


def exec_in(
    container: Any,
    cmd: list[str],
    timeout: float,
    *,
    cancel: threading.Event | None = None,
    user: str | None = None,
) -> tuple[int | None, str]:
    """``docker exec`` with a deadline: (exit code, output), or (None, "") when the command had
    not ended within ``timeout`` seconds.

    With ``cancel``: raises Cancelled as soon as it is set (the run was interrupted). Either
    way a late command goes on in the container: the caller ends it if it must."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            res = container.exec_run(cmd, demux=False, **({"user": user} if user else {}))
            box["rc"], box["out"] = res.exit_code, (res.output or b"").decode(errors="replace")
        except Exception as exc:  # noqa: BLE001 - raised in the caller's thread below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="exec", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.is_set():
        if cancel is not None and cancel.is_set():
            raise Cancelled
        left = deadline - time.monotonic()
        if left <= 0:
            return None, ""
        done.wait(min(0.2, left))
    if "error" in box:
        raise box["error"]
    return box["rc"], box["out"]


# A throwaway container outlives its run by this much at most: should umprov be gone before it
# removes the container (killed, its connection lost, a create the engine answered only after
# an interrupt), the engine ends and removes it by itself.
THROWAWAY_GRACE_S = 300


def throwaway(run_s: float) -> dict[str, Any]:
    """containers.run arguments of a container that idles for the agent's execs: its main
    process ends ``run_s`` + THROWAWAY_GRACE_S seconds after the start, and the engine then
    removes it (a leftover never keeps a host's GPUs for good)."""
    return {"command": ["sleep", str(int(run_s + THROWAWAY_GRACE_S))], "entrypoint": [],
            "auto_remove": True, "detach": True}


def start_throwaway(client: Any, **kwargs: Any) -> Any:
    """``client.containers.run(**kwargs)`` (``name`` given). docker-py's run is a create and a
    start: a container the engine created but then refused to start is removed before the
    error is raised, so nothing is left and a retry may take its name."""
    try:
        return client.containers.run(**kwargs)
    except Exception:
        with contextlib.suppress(Exception):
            client.containers.get(kwargs["name"]).remove(force=True)
        raise


def tar_files(files: Mapping[str, bytes], *, mode: int = 0o644) -> bytes:
    """An uncompressed tar of ``files`` (path in the archive -> content), owned by root, for
    ``put_archive``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.uid = info.gid = 0
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def untar_one(chunks: Iterable[bytes]) -> bytes:
    """The first file in a tar stream (``get_archive``'s chunks)."""
    data = b"".join(chunks)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                fh = tar.extractfile(member)
                if fh is not None:
                    return fh.read()
    raise UmprovError("the archive from the container holds no file")
