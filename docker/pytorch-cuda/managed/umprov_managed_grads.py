"""Gradients down: each gradient backward makes in device memory goes to pinned host memory
while backward still runs, ``.grad`` a CUDA view of it (docs/managed-memory.md); and where
the job stands (whether it spills, whether a tensor is in the reservoir), which the optimizer's
host step (umprov_managed_step.py) reads too.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

import torch
import umprov_managed_pinned as pinned_memory

# Bytes of gradients copying down while backward runs on, held on the device: 256 MiB gives
# their blocks back soon enough that backward's next gradients find room (run H: with 1 GiB,
# 9.4 of 11.25 GiB of them still spilled).
LAG = 256 << 20
RECHECK = 1.0  # seconds between reads of the reservoir's live bytes
NEARLY_FULL = 2 << 30  # device room below which gradients go down before any spills
ROOM_RECHECK = 0.01  # seconds between reads of the device's room while waiting
# Reservoir room below which a gradient backward put there goes down too, its block free for
# the next ones (run K: a reservoir of 9.25 GiB, the GPU's free memory, ran out in backward).
RESERVOIR_SHORT = 2 << 30
RESERVOIR_RECHECK = 0.05  # seconds between reads of the reservoir's room (1 ms each)
_seen: dict[str, Any] = {"at": -RECHECK, "spilling": False}
# Room held back from forward (GradsDown._backward_done): one guard for the process, so one
# flag for every GradsDown in it.
_held = {"on": False}


def wanted() -> bool:
    """Gradients down unless UMPROV_MANAGED_GRADS_DOWN=0, and never under torch.distributed
    (DDP's reducer writes ``.grad`` after backward's hooks, on its own schedule)."""
    if os.environ.get("UMPROV_MANAGED_GRADS_DOWN", "1") == "0":
        return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


def in_reservoir(tensor: torch.Tensor) -> bool:
    return _managed().in_reservoir(tensor)


def spilling() -> bool:
    """Live bytes in the reservoir, read at most every RECHECK seconds: reading them (the
    reservoir's segment snapshot) costs about a millisecond, a third of a small step."""
    now = time.monotonic()
    if now - _seen["at"] >= RECHECK:
        _seen.update(at=now, spilling=_managed().spilled() > 0)
    return _seen["spilling"]


class GradsDown:
    """Gradients to pinned host memory while backward runs, as torchao's offload and
    ZeRO-Offload move them, with ``.grad`` kept: a CUDA view of the same host memory. A
    parameter's pinned home is made when its gradient first arrives in device memory: one
    that backward put in the reservoir is read there by the step, and a home for it too would
    hold it twice on the host (docs/managed-memory.md, run G: 9.4 of 11.25 GiB), unless the
    reservoir runs short: then it goes down too and its block takes the next spill."""

    def __init__(self, params: list[torch.Tensor], down: torch.cuda.Stream,
                 home: Any = None, waiting: bool = False) -> None:
        self.down = down
        # param -> (pinned CPU tensor, its CUDA view) | None
        self.home = home or pinned_memory.pinned_home
        self.host: dict[torch.Tensor, torch.Tensor] = {}
        self.alias: dict[torch.Tensor, torch.Tensor] = {}
        self.streams: set = set()  # the streams backward accumulated on, this pass
        self.copying: deque = deque()  # (device gradient, its stream, copied event)
        self.copying_bytes = 0
        self.waiting = waiting  # until the job spills, gradients stay where backward put them
        self.on_first_arrival: Any = None  # called once, when backward first reaches a hook
        self.device: torch.device | None = None  # the watched parameters' GPU (one)
        self.handles: dict[torch.Tensor, Any] = {}  # parameter -> its hook (parameters only)
        self.room_checked = -ROOM_RECHECK
        # From one backward's end to the next one's first gradient, room for backward's
        # first gradients is held back from forward (hold_back): LAG and the largest one.
        self.largest = 0
        self.reservoir_checked, self.short = -RESERVOIR_RECHECK, False
        for p in params:
            self.watch(p)

    def watch(self, p: torch.Tensor) -> None:
        """``p``'s gradients go down from now on (once the job spills, while waiting); one
        GPU's parameters only."""
        if p in self.handles or self.device not in (None, p.device):
            return
        self.device = p.device
        self.handles[p] = p.register_post_accumulate_grad_hook(self._arrived)

    def host_of(self, p: torch.Tensor) -> torch.Tensor | None:
        grad, alias = p.grad, self.alias.get(p)
        if grad is None or alias is None or grad.data_ptr() != alias.data_ptr():
            return None
        return self.host[p]

    def detach(self) -> None:
        for handle in list(self.handles.values()):
            handle.remove()
        self.handles.clear()
        self._give_room_back()

    def _give_room_back(self) -> None:
        if _held["on"]:
            _held["on"] = False
            _managed().hold_back(0)

    def release(self, params: list[torch.Tensor] | None = None) -> None:
        """For a device step from here on (every parameter's, or ``params``'): hooks gone, and
        each ``.grad`` that is a host view becomes device memory again, so the step and later
        backwards (``zero_grad`` that keeps tensors) do not read and write it across the bus."""
        chosen = list({**self.handles, **self.alias}) if params is None else params
        with torch.no_grad():
            for p in chosen:
                handle = self.handles.pop(p, None)
                if handle is not None:
                    handle.remove()
                alias = self.alias.pop(p, None)
                self.host.pop(p, None)
                if alias is not None and p.grad is not None and (
                        p.grad.data_ptr() == alias.data_ptr()):
                    p.grad = alias.clone()
        if not self.handles:  # nothing left to send down: forward may take the room
            self._give_room_back()

    def _arrived(self, p: torch.Tensor) -> None:
        """After backward accumulated ``p.grad``: it goes down behind the kernels that made
        it, its device memory is given back once copied, ``.grad`` is the host view."""
        if self.on_first_arrival is not None:
            first, self.on_first_arrival = self.on_first_arrival, None
            first()
        self._give_room_back()  # backward's gradients take what forward left
        grad, alias = p.grad, self.alias.get(p)
        if (grad is None or (alias is not None and grad.data_ptr() == alias.data_ptr())
                or grad.is_sparse or grad.dtype != p.dtype or grad.shape != p.shape
                or not grad.is_contiguous()):
            return  # in the view already, or not plain
        if self.waiting and not wanted():  # torch.distributed since the forward
            return
        if in_reservoir(grad):  # spilled: the next ones go down
            self.waiting = False
            if not self._reservoir_short(grad.device):
                return  # the step reads it there: a home too would hold it twice
        if self.waiting:
            if not (spilling() or self._nearly_full(grad.device)):
                return
            self.waiting = False
        if alias is None:
            made = self.home(p)
            if made is None:  # host memory not mapped for the GPU here: the step copies
                self.detach()
                return
            self.host[p], self.alias[p] = made
            alias = self.alias[p]
        stream = torch.cuda.current_stream(grad.device)
        if not self.streams:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        self.streams.add(stream)
        self.down.wait_stream(stream)
        with torch.cuda.stream(self.down):
            self.host[p].copy_(grad, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(self.down)
        self.copying.append((grad, stream, copied))
        nbytes = grad.numel() * grad.element_size()
        self.copying_bytes += nbytes
        self.largest = max(self.largest, nbytes)
        p.grad = alias
        while self.copying_bytes > LAG and len(self.copying) > 1:  # one larger than LAG: kept
            self._release_oldest()

    def _nearly_full(self, device: torch.device) -> bool:
        """Whether PyTorch has less than NEARLY_FULL (or a twentieth of the GPU) of device
        memory left: backward's next gradients would spill, and the reservoir's host pages
        they touch stay taken (run I: waiting for the first spilled gradient was too late,
        forward's activations held the device and every later gradient spilled). Read at most
        every ROOM_RECHECK seconds: reading costs about a tenth of a millisecond."""
        now = time.monotonic()
        if now - self.room_checked < ROOM_RECHECK:
            return False
        self.room_checked = now
        total = torch.cuda.get_device_properties(device).total_memory
        return _managed().device_room(device.index) < max(NEARLY_FULL, total // 20)

    def _reservoir_short(self, device: torch.device) -> bool:
        """Whether ``device``'s reservoir has less than RESERVOIR_SHORT free: backward's next
        spills would find it full. Read at most every RESERVOIR_RECHECK seconds; the last
        reading holds between."""
        now = time.monotonic()
        if now - self.reservoir_checked >= RESERVOIR_RECHECK:
            self.reservoir_checked = now
            self.short = _managed().reservoir_room(device.index) < RESERVOIR_SHORT
        return self.short

    def _release_oldest(self) -> None:
        """The oldest copied gradient's memory back to PyTorch's cache: its stream waits for
        the copy, so what reuses the block there runs after it."""
        grad, stream, copied = self.copying.popleft()
        stream.wait_event(copied)
        self.copying_bytes -= grad.numel() * grad.element_size()

    def _backward_done(self) -> None:
        """What runs after backward (clip_grad_norm_, the step) reads the gradients once
        they are down; the device gradients still copying are given back behind that."""
        for stream in self.streams | {torch.cuda.current_stream()}:
            stream.wait_stream(self.down)
        self.copying.clear()
        self.copying_bytes = 0
        self.streams = set()
        # Run L: with the headroom, forward left 0.28 GiB, the first 256 MiB gradients spilled,
        # and a spilled one frees no device block for the next: 10.3 of 11.25 GiB spilled.
        if self.handles:  # detached mid-backward: no hook left to give it back
            _managed().hold_back(LAG + self.largest)
            _held["on"] = True


def _managed() -> Any:
    import umprov_managed

    return umprov_managed
