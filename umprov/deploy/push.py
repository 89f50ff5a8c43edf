"""--push: ONE local ``docker save`` streamed into the ``docker load`` of the hosts given
(deploy gives the hosts that lack the image, --forks at a time).

A host whose engine already holds some of the image's layers (graph-driver image stores) gets
the stream without their files: one rewrite of the save stream per distinct set of layers
left out (``image_tar``). An incremental load that fails (a layer gone from the host since it
was asked) is tried once more with every layer. The time until the host's engine had read the
last byte is kept apart from the time its ``docker load`` then takes to register the layers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from umprov.deploy.image_tar import (
    RewriteStats,
    host_chain_ids,
    rootfs_diff_ids,
    skip_plan,
)
from umprov.deploy.outcome import HostState
from umprov.deploy.stream import Broadcast, load_into, rewrite_into
from umprov.hosts.engine import engine_error
from umprov.hosts.fanout import Parallel
from umprov.hosts.progress import Progress, size_text

PUSH_CHUNK = 1 << 20
Plan = dict[str, str]  # the layers a host holds: {diff ID: chain ID}


def push_image(
    states: list[HostState], local_client: Any, pool: Parallel, progress: Progress
) -> None:
    """Push the image to every live host that lacks it; each host's trouble is its outcome."""
    need = [st for st in states if st.live and st.image_id is None]
    if not need:
        return
    ref = str(need[0].settings.image) if need[0].settings else ""
    local = local_client.images.get(ref)
    # Sum of the layers' contents: the tar stream is a little larger (headers, padding).
    estimate = int(local.attrs.get("Size", 0))
    diff_ids = rootfs_diff_ids(local.attrs)
    plans = list(pool.map(lambda st: _held_layers(st, diff_ids, progress), need))
    for st, plan in zip(need, plans, strict=True):
        if plan:
            progress(st.name, f"the host already has {len(plan)} of the image's "
                              f"{len(diff_ids or ())} layers: they stay out of its stream")
    image = (ref, str(local.id), estimate)
    retry = _Round(need, plans, image, progress).run(local_client)
    if retry:
        # An incremental load failed (a layer gone from the host since it was asked?): once
        # more with every layer, from a docker save of its own.
        _Round(retry, [{} for _ in retry], image, progress).run(local_client)


def _held_layers(st: HostState, diff_ids: list[str] | None, progress: Progress) -> Plan:
    """Which of the image's layers this host's engine already holds; empty (the full stream)
    unless everything about the host looks as expected."""
    if not diff_ids:
        return {}
    try:
        held, why = host_chain_ids(st.client)
    except Exception as exc:  # noqa: BLE001 - any doubt: the full stream
        held, why = None, engine_error(exc)
    if held is None:
        progress(st.name, f"sending every layer ({why})")
        return {}
    return skip_plan(diff_ids, held)


def percent(done: int, estimate: int) -> str:
    """'~NN%' of an estimate that the tar stream may exceed: never above 99 until the end."""
    if estimate <= 0:
        return ""
    return f" (~{min(99, int(100 * done / estimate))}%)"


class _Round:
    """One local docker save streamed into every host of ``need``: as it is to hosts with an
    empty plan, and through one rewrite per distinct plan (the layers left out) to the others.
    ``run`` returns the hosts whose incremental load failed (to be sent the full stream)."""

    def __init__(
        self, need: list[HostState], plans: list[Plan], image: tuple[str, str, int],
        progress: Progress,
    ) -> None:
        self.need = need
        self.ref, self.image_id, self.estimate = image
        self.progress = progress
        groups: dict[frozenset[tuple[str, str]], list[HostState]] = {}
        for st, plan in zip(need, plans, strict=True):
            groups.setdefault(frozenset(plan.items()), []).append(st)
        direct = [st.name for st in groups.pop(frozenset(), [])]
        keys = [f"rewrite-{i}" for i in range(len(groups))]
        self.source = Broadcast(direct + keys)
        self.feeds: dict[str, Broadcast] = dict.fromkeys(direct, self.source)
        self.stats: dict[str, RewriteStats] = {}
        self.rewriters: list[threading.Thread] = []
        for key, (plan, members) in zip(keys, groups.items(), strict=True):
            sink = Broadcast([st.name for st in members])
            group_stats = RewriteStats()
            for st in members:
                self.feeds[st.name] = sink
                self.stats[st.name] = group_stats
            self.rewriters.append(threading.Thread(
                target=rewrite_into, args=(self.source, key, dict(plan), sink, group_stats),
                name=f"push-{key}", daemon=True,
            ))
        self.sent = {st.name: [0] for st in need}  # bytes read by each host's engine
        self.streamed: dict[str, float] = {}  # seconds until the engine had read the stream
        self.retry: list[HostState] = []
        self.done = threading.Event()

    def run(self, local_client: Any) -> list[HostState]:
        def save() -> Iterator[bytes]:
            # Save by reference, so the loaded image carries the tag too.
            yield from local_client.api.get_image(self.ref, chunk_size=PUSH_CHUNK)

        for st in self.need:
            self.progress(st.name, f"pushing {self.ref} (~{self.estimate / 1e6:.0f} MB)")
        reporter = threading.Thread(target=self._report, name="push-progress", daemon=True)
        # One thread per host: a pool smaller than the host count would leave the broadcast
        # waiting on hosts that never start reading.
        loaders = [threading.Thread(target=self._load, args=(st,), name=f"push-{st.name}",
                                    daemon=True) for st in self.need]
        streams = [self.source, *{id(feed): feed for feed in self.feeds.values()}.values()]
        for thread in [reporter, *self.rewriters, *loaders]:
            thread.start()
        try:
            self.source.produce(save())
            for thread in [*self.rewriters, *loaders]:
                thread.join()
        except BaseException:  # Ctrl-C or SIGTERM: every stream stops, the loads are cut short
            for stream in streams:
                stream.abort()
            raise
        finally:
            self.done.set()
        reporter.join()
        return self.retry

    def _load(self, st: HostState) -> None:
        """One host's docker load, fed from its stream (in its own thread)."""
        name, feed = st.name, self.feeds[st.name]
        started = time.monotonic()
        ok = False

        def stream() -> Iterator[bytes]:
            yield from feed.consume(name, self.sent[name])
            # The request body is complete: what follows is the host's docker load registering
            # the layers (untar into the storage driver, digest check), no more transfer.
            seconds = self.streamed[name] = time.monotonic() - started
            sent = self.sent[name][0]
            rate = f" ({sent / seconds / 1e6:.0f} MB/s)" if seconds > 0 else ""
            self.progress(name, f"sent {size_text(sent)} in {seconds:.0f} s{rate}; "
                                "the host's docker load is registering the layers")

        try:
            load_into(st.client, stream())
            st.client.images.get(self.image_id)
            st.image_id = self.image_id
            ok = True
        except BaseException as exc:  # noqa: BLE001 - recorded for this host only
            feed.drop(name)
            if name in self.stats and self.source.error is None:
                self.progress(name, f"incremental push failed ({engine_error(exc)}): "
                                    "sending every layer")
                self.retry.append(st)
            else:
                st.fail(st.error(exc, "push failed: "))
        finally:
            self._account(st, time.monotonic() - started, ok)

    def _account(self, st: HostState, seconds: float, ok: bool) -> None:
        """Add this attempt to the host's push figures; say what it took."""
        name, data = st.name, st.outcome.data
        sent = self.sent[name][0]
        data["pushed_bytes"] += sent
        data["push_seconds"] += seconds
        # A failed attempt (before a retry) counts whole, in both figures.
        data["push_stream_seconds"] += self.streamed.get(name, seconds) if ok else seconds
        skipped = self.stats[name].skipped_bytes if ok and name in self.stats else 0
        data["skipped_bytes"] = skipped
        if ok:
            note = f", {size_text(skipped)} already on the host" if skipped else ""
            split = ""
            if name in self.streamed:
                split = (f" (sent in {self.streamed[name]:.0f} s, "
                         f"loaded in {seconds - self.streamed[name]:.0f} s)")
            self.progress(name, f"pushed {size_text(sent)} in {seconds:.0f} s{split}{note}")

    def _report(self) -> None:
        """Every second until the round ends: how far each host's stream has come."""
        while not self.done.wait(1.0):
            for st in self.need:
                if st.live and st.image_id is None and st.name not in self.streamed:
                    sent = self.sent[st.name][0]
                    group = self.stats.get(st.name)
                    skipped = group.skipped_bytes if group else 0
                    note = f", {size_text(skipped)} already on the host" if skipped else ""
                    pct = percent(sent + skipped, self.estimate)
                    self.progress(st.name, f"pushing {size_text(sent)}{note}{pct}")
