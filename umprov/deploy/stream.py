"""One stream, many readers: a local ``docker save`` fanned out to every host's ``docker
load``, and rewritten on the way for hosts that already hold some of the image's layers.

A Broadcast has one producer and one bounded queue per reader, so the stream goes at the pace
of the slowest live reader; a reader whose load fails is dropped and the others go on. An
interrupt aborts producer and readers at once (they raise Cancelled).
"""

from __future__ import annotations

import contextlib
import queue
import tarfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from umprov.deploy.image_tar import RewriteStats, rewrite_save_stream
from umprov.errors import Cancelled, UmprovError
from umprov.hosts.engine import engine_error


class Broadcast:
    """One producer (a local docker save, or a rewrite of it), many consumers (each host's
    docker load, or a rewrite feeding hosts of its own).

    Bounded queues: the stream goes at the pace of the slowest live consumer; a consumer whose
    load fails is dropped and the others go on.
    """

    def __init__(self, hosts: list[str], depth: int = 16) -> None:
        self.queues: dict[str, queue.Queue[bytes | None]] = {
            h: queue.Queue(maxsize=depth) for h in hosts
        }
        self.dead: set[str] = set()
        self.error: UmprovError | None = None
        self.aborted = threading.Event()
        self.lock = threading.Lock()

    def produce(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                self.put(chunk)
        except Exception as exc:  # noqa: BLE001 - handed to every consumer
            self.close(UmprovError(f"docker save failed: {engine_error(exc)}"))
        except BaseException:  # Ctrl-C or SIGTERM: the whole run stops, not only this stream
            self.abort()
            raise
        else:
            self.close()

    def abort(self) -> None:
        """The run was interrupted: producer and consumers stop at once."""
        self.aborted.set()

    def put(self, chunk: bytes) -> None:
        self._put_all(chunk)

    def close(self, error: UmprovError | None = None) -> None:
        if error is not None:
            self.error = error
        self._put_all(None)

    @property
    def all_dead(self) -> bool:
        with self.lock:
            return len(self.dead) == len(self.queues)

    def _put_all(self, item: bytes | None) -> None:
        for host, q in self.queues.items():
            while host not in self.dead and not self.aborted.is_set():
                try:
                    q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue

    def drop(self, host: str) -> None:
        with self.lock:
            self.dead.add(host)
        q = self.queues[host]
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()

    def consume(self, host: str, counter: list[int]) -> Iterator[bytes]:
        q = self.queues[host]
        while True:
            try:
                item = q.get(timeout=0.5)
            except queue.Empty:
                if self.aborted.is_set():
                    raise Cancelled from None
                continue
            if self.aborted.is_set():
                raise Cancelled
            if item is None:
                if self.error is not None:
                    raise UmprovError(str(self.error))
                return
            counter[0] += len(item)
            yield item


class _Writer:
    """The file a streaming tar rewrite writes into: chunks go to a Broadcast. With nobody
    left to read them it raises BrokenPipeError, as a pipe without a reader does."""

    def __init__(self, broadcast: Broadcast) -> None:
        self.broadcast = broadcast

    def write(self, data: bytes) -> int:
        if self.broadcast.all_dead:
            raise BrokenPipeError("every host fed by this stream has dropped out")
        if data:
            self.broadcast.put(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def rewrite_into(
    source: Broadcast, key: str, skip: Mapping[str, str], sink: Broadcast, stats: RewriteStats
) -> None:
    """Feed ``sink``'s hosts the ``source`` stream without the layers of ``skip``."""
    error: UmprovError | None = None
    try:
        rewrite_save_stream(source.consume(key, [0]), skip, _Writer(sink), stats)
    except BrokenPipeError:
        pass  # nobody left to feed
    except UmprovError as exc:  # the docker save itself failed
        error = exc
    except (tarfile.TarError, OSError, ValueError) as exc:
        error = UmprovError(f"rewriting the image stream failed: {exc}")
    except BaseException as exc:  # noqa: BLE001 - handed to this group's hosts
        error = UmprovError(f"rewriting the image stream failed: {engine_error(exc)}")
    finally:
        source.drop(key)  # never leave the docker save blocked on this reader
        sink.close(error)


def load_into(client: Any, data: Iterator[bytes]) -> None:
    """docker load on the host's engine from a stream of tar chunks."""
    from docker.errors import APIError

    try:
        for chunk in client.api.load_image(data):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise UmprovError(f"docker load failed: {chunk['error']}")
    except APIError as exc:
        raise UmprovError(f"docker load failed: {engine_error(exc)}") from None
