"""The optimizer's step where its state lives, once umprov's reservoir is in use
(docs/managed-memory.md).

Past the GPU's memory, what was allocated first stays in device memory (the model, then
activations) and the rest lands in the reservoir, on the host: gradients and the optimizer's
state (Adam's two moments: twice the model). A GPU step over spilled state reads and writes it
across PCIe several times a step. Here, an optimizer of a kind that updates each parameter on
its own steps on the host instead: its state lives in host memory, each parameter has a pinned
host copy (its master), gradients come down once and parameters go up once a step, chunk by
chunk, so the copies overlap the CPU's work. Unless UMPROV_MANAGED_GRADS_DOWN=0 (faster and no
more host memory than torchao's offload in the bench, run J of docs/managed-memory.md), each
gradient backward made in device memory goes down while backward still runs (``GradsDown``):
copied into pinned host memory, its device memory freed soon after, ``.grad`` a CUDA view of
that host memory, so code between backward and step (``clip_grad_norm_``) still reads and
scales it in place. Parameters are watched from the first forward (``_before_forward``), and
gradients go down once the job spills or the GPU is nearly full, so the first step's gradients
need not spill either.

The user's code is unchanged: global optimizer step hooks run the user's own optimizer (its
class, hyperparameters, LR schedule) over the host copies, then hide the parameters from the
device step that follows. ``optimizer.state`` keeps its keys; its tensors are host tensors,
so ``state_dict()`` saves them and ``load_state_dict()`` (which puts them on the GPU) is
brought back here at the next step. A parameter changed outside the optimizer (a checkpoint
loaded into the model) is read again from the GPU first (its version counter says so).

UMPROV_MANAGED_HOST_STEP: ``auto`` (default: once the reservoir holds live tensors), ``0``
never, ``1`` always (tests). Under torch.distributed gradients never go down during backward: DDP's
reducer writes ``.grad`` after backward's hooks, on its own schedule. Not used, and the step
runs on the GPU as written: closures, GradScaler's fused step, capturable or differentiable
optimizers, optimizers of other kinds (whose step may couple parameters) or with step hooks
of their own (torch runs those after the global pre-hook that steps here), parameters off
the GPU or on several GPUs, sparse gradients.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
import warnings
import weakref
from collections import defaultdict, deque
from typing import Any

import torch
from torch.optim.optimizer import (
    _get_fused_kernels_supported_devices,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

KINDS = ("SGD", "Adam", "AdamW", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta")
CHUNK = 256 << 20  # bytes of parameters a chunk: big enough for the CPU's threads and the bus
ALIGN = 512  # each gradient's place in a slot: any dtype's view of it starts aligned
SLOTS = 3  # pinned gradient slots: one coming down, one stepped, one spare
# Bytes of gradients copying down while backward runs on, held on the device: 256 MiB gives
# their blocks back soon enough that backward's next gradients find room (run H: with 1 GiB,
# 9.4 of 11.25 GiB of them still spilled).
LAG = 256 << 20
RECHECK = 1.0  # seconds between reads of the reservoir's live bytes
NEARLY_FULL = 2 << 30  # device room below which gradients go down before any spills
ROOM_RECHECK = 0.01  # seconds between reads of the device's room while waiting
PAGE = os.sysconf("SC_PAGE_SIZE")
_lib: Any = None
_seen: dict[str, Any] = {"at": -RECHECK, "spilling": False}
# Before the first optimizer step: the forward hook that watches parameters, the GradsDown
# watching them (``_before_forward``).
_early: dict[str, Any] = {"hook": None, "grads": None}
_early_lock = threading.Lock()


def install(library: Any) -> None:
    """The global step hooks (once the reservoir is made: ``umprov_managed._start``): the
    host step where it is wanted."""
    global _lib
    if _lib is not None:
        return
    _lib = library
    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(_after_step)
    if not _grads_down_wanted():
        return
    # Gradients down only: a global module hook. torch.compile(model) warns at each call while
    # one exists (it would run once more for the compiled wrapper, which has no parameters of
    # its own), and compiles once more after the first step, when the hook is gone.
    _early["hook"] = torch.nn.modules.module.register_module_forward_pre_hook(_before_forward)
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are "
                            "global hooks", category=UserWarning)


def _before_forward(module: torch.nn.Module, args: tuple) -> None:
    """Until backward first runs, each module's parameters are watched at its forward, so
    gradients go down from the first backward that spills rather than from the first step:
    host pages a gradient touches in the reservoir stay with the process after it is freed
    (docs/managed-memory.md, run H). Nothing goes down until the job spills or the GPU is
    nearly full."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return  # inference; or traced by torch.compile, where hooks made would break graphs
    params = [p for p in module.parameters(recurse=False) if _watchable(p)]
    if not params:
        return
    with _early_lock:  # once a module call: it guards only the watcher's making
        early = _early["grads"]
        if early is None:
            if not _grads_down_wanted():  # torch.distributed since install()
                _stop_watching()
                return
            down, _up = _managed().copy_streams(params[0].device.index)
            early = _early["grads"] = GradsDown([], down, waiting=True)
            early.on_first_arrival = _stop_watching
    for p in params:
        early.watch(p)


def _watchable(p: torch.Tensor) -> bool:
    """A model's own trained parameter on a GPU: not a lazy module's yet to be made, nor a
    tensor ``torch.func.functional_call`` put in its place."""
    return (isinstance(p, torch.nn.Parameter) and not torch.nn.parameter.is_lazy(p)
            and p.requires_grad and p.is_leaf and p.device.type == "cuda")


def _stop_watching() -> None:
    hook = _early["hook"]
    if hook is not None:
        hook.remove()
        _early["hook"] = None


def _take_early() -> GradsDown | None:
    """At an optimizer step: the parameters watched since the first forward, if any; the
    forward hook is done either way."""
    _stop_watching()
    early, _early["grads"] = _early["grads"], None
    return early


def _in_reservoir(tensor: torch.Tensor) -> bool:
    return _managed().in_reservoir(tensor)


def _spilling() -> bool:
    """Live bytes in the reservoir, read at most every RECHECK seconds: reading them (the
    reservoir's segment snapshot) costs about a millisecond, a third of a small step."""
    now = time.monotonic()
    if now - _seen["at"] >= RECHECK:
        _seen.update(at=now, spilling=_managed().spilled() > 0)
    return _seen["spilling"]


def eligible(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> bool:
    """Whether a host step computes what the user's device step would."""
    if type(opt).__name__ not in KINDS or type(opt).__module__.split(".")[:2] != ["torch",
                                                                                  "optim"]:
        return False
    if len(args) > 1 or kwargs:  # a closure, GradScaler's grad_scale / found_inf
        return False
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return False  # GradScaler's fused step: set on the optimizer, not passed
    if getattr(opt, "_optimizer_step_pre_hooks", None) or getattr(
            opt, "_optimizer_step_post_hooks", None):
        return False  # the user's own hooks would run after this step, over no parameters
    devices = set()
    for group in opt.param_groups:
        if group.get("capturable") or group.get("differentiable"):
            return False
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor) and lr.device.type != "cpu":
            return False
        for p in group["params"]:
            if p.device.type != "cuda" or p.is_complex() or not p.is_floating_point():
                return False
            devices.add(p.device)
            if p.grad is not None and (p.grad.is_sparse or not p.grad.is_contiguous()):
                return False
    return len(devices) == 1


def _before_step(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    spilling = _spilling()  # read at every step: stats()'s peak
    early = _take_early()
    host = opt.__dict__.get("_umprov_host")
    mode = os.environ.get("UMPROV_MANAGED_HOST_STEP", "auto")
    if host is None:
        # Gradients that went down kept backward out of the reservoir; a device step whose new
        # state has no room would put it there instead (and its host pages stay taken).
        spilling = spilling or (early is not None and not early.waiting
                                and _state_would_spill(opt, early))
        if mode == "0" or not eligible(opt, args, kwargs) or (mode != "1" and not spilling):
            if early is not None:
                early.release()
            return
        host = opt.__dict__["_umprov_host"] = HostStep(opt, early)
    elif not eligible(opt, args, kwargs):  # a closure once, say: the state goes back first
        host.leave()
        del opt.__dict__["_umprov_host"]
        return
    host.step()
    opt.__dict__["_umprov_groups"] = opt.param_groups
    opt.param_groups = [{**g, "params": []} for g in opt.param_groups]  # the device step: none


def _state_copies(kind: str, group: dict) -> int:
    """How many tensors of a parameter's size the optimizer keeps for it (KINDS)."""
    if kind == "SGD":
        return 1 if group.get("momentum") else 0
    if kind in ("Adam", "AdamW"):
        return 3 if group.get("amsgrad") else 2
    if kind == "RMSprop":
        return 1 + bool(group.get("momentum")) + bool(group.get("centered"))
    return 1 if kind == "Adagrad" else 2  # Adadelta, Adamax, NAdam, RAdam


def _state_would_spill(opt: torch.optim.Optimizer, early: GradsDown) -> bool:
    """Whether what a first device step would make on the GPU is more than PyTorch has room
    for there: its state (Adam's two moments: twice its parameters), the unfused step's
    temporaries (about one more, two for Adadelta), and the gradients ``early`` sent down,
    which come back for it."""
    need, device = 0, None
    kind = type(opt).__name__
    for g in opt.param_groups:
        copies = _state_copies(kind, g)
        made = copies + (0 if g.get("fused") else 2 if kind == "Adadelta" else 1)
        for p in g["params"]:
            if p.grad is None:
                continue
            nbytes = p.numel() * p.element_size()
            if not opt.state.get(p) and copies:
                need += made * nbytes
                device = p.device
            if early.host_of(p) is not None:
                need += nbytes
                device = p.device
    return device is not None and _managed().device_room(device.index) < need


def _after_step(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    groups = opt.__dict__.pop("_umprov_groups", None)
    if groups is not None:
        opt.param_groups = groups


class HostStep:
    """One optimizer's host side: pinned masters, gradient slots, the copy stream."""

    def __init__(self, opt: torch.optim.Optimizer, early: GradsDown | None = None) -> None:
        self.opt = opt
        self.grads_down: GradsDown | None = None
        self.step_fn = getattr(type(opt).step, "__wrapped__", type(opt).step)
        self.masters: dict[torch.Tensor, torch.Tensor] = {}
        self.versions: dict[torch.Tensor, int] = {}
        self.slots: list[torch.Tensor] = []
        self.master_pins: list[weakref.finalize] = []  # page locks, undone by calling
        self.slot_pins: list[weakref.finalize] = []
        self.device = next(p.device for g in opt.param_groups for p in g["params"])
        self.down, self.up = _managed().copy_streams(self.device.index)
        self.uploaded: torch.cuda.Event | None = None
        self.fused = "cpu" in _get_fused_kernels_supported_devices()
        own = [p for g in opt.param_groups for p in g["params"]
               if p.requires_grad and p.is_leaf and p.device == self.device]
        wanted = _grads_down_wanted()
        if early is not None and (not wanted or early.device not in (None, self.device)):
            early.release()  # another GPU's parameters, or distributed since the forward
            early = None
        if wanted:
            self.grads_down = early if early is not None else GradsDown([], self.down)
            self.grads_down.waiting = False
            mine = {id(p) for p in own}
            self.grads_down.release([p for p in self.grads_down.handles if id(p) not in mine])
            for p in own:  # another optimizer's, or no optimizer's: as backward leaves them
                self.grads_down.watch(p)

    def leave(self) -> None:
        """Back to the device step: the state beside its parameters, backward's hooks gone,
        the host copies unlocked once the last ones have gone up."""
        if self.grads_down is not None:
            self.grads_down.release()
        self.state_to_device()
        if self.uploaded is not None:
            self.uploaded.synchronize()
        for unpin in self.master_pins + self.slot_pins:
            unpin()

    def step(self) -> None:
        params = [p for g in self.opt.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        with torch.cuda.device(self.device):  # the parameters' streams, not the current GPU's
            self._step(params)

    def _step(self, params: list[torch.Tensor]) -> None:
        if self.uploaded is not None:
            self.uploaded.synchronize()  # the last step's masters have gone up
        self._masters_for(params)
        for stream in (self.down, self.up):  # backward's gradients are written
            stream.wait_stream(torch.cuda.current_stream())
        chunks = _chunks(params)
        self._size_slots([p for p in params if self._host_grad(p) is None])
        waiting = [self._down(chunk, i % SLOTS) for i, chunk in enumerate(chunks[:SLOTS])]
        for i, chunk in enumerate(chunks):
            waiting[i].synchronize()
            self._step_on_host(chunk)
            self._up(chunk)
            if i + SLOTS < len(chunks):  # the CPU is done with this slot: the next one down
                waiting.append(self._down(chunks[i + SLOTS], i % SLOTS))
        self.uploaded = torch.cuda.Event()
        self.uploaded.record(self.up)
        torch.cuda.current_stream().wait_stream(self.up)  # the next forward sees them
        for p in params:
            self.masters[p].grad = None
            self.versions[p] = p._version

    def _masters_for(self, params: list[torch.Tensor]) -> None:
        """Pinned host copies of the parameters, made once (exact sizes, one block a dtype);
        read again where a parameter changed outside the optimizer."""
        new = [p for p in params if p not in self.masters]
        for dtype in {p.dtype for p in new}:
            mine = [p for p in new if p.dtype == dtype]
            flat = _pinned(sum(p.numel() for p in mine), dtype, self.device, self,
                           self.master_pins)
            at = 0
            for p in mine:
                self.masters[p] = flat[at:at + p.numel()].view_as(p)
                at += p.numel()
        for p in params:
            if self.versions.get(p) != p._version:  # new, or changed outside the optimizer
                self.masters[p].copy_(p.detach())
        state = self.opt.state
        for p in params:
            for key, value in state[p].items():  # from load_state_dict, or a device step
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[p][key] = value.to("cpu", torch.float32 if key == "step" else None)

    def state_to_device(self) -> None:
        """The optimizer's state back beside its parameters, as a device step expects it."""
        for group in self.opt.param_groups:
            on_device = group.get("fused") or group.get("capturable")
            for p in group["params"]:
                state = self.opt.state.get(p, {})
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and (key != "step" or on_device):
                        state[key] = value.to(p.device)

    def _host_grad(self, p: torch.Tensor) -> torch.Tensor | None:
        """The gradient where backward already sent it (pinned host memory), if it did."""
        return None if self.grads_down is None else self.grads_down.host_of(p)

    def _size_slots(self, params: list[torch.Tensor]) -> None:
        """Pinned gradient slots, each as large as a chunk or the largest parameter, where a
        gradient still has to come down."""
        if not params:
            return
        need = max([CHUNK] + [_nbytes(p) for p in params])
        if not self.slots or self.slots[0].numel() < need:  # the old ones are idle: unlocked
            for unpin in self.slot_pins:
                unpin()
            self.slot_pins = []
            self.slots = [_pinned(need, torch.uint8, self.device, self, self.slot_pins)
                          for _ in range(SLOTS)]

    def _down(self, chunk: list[torch.Tensor], slot: int) -> torch.cuda.Event:
        """The chunk's gradients to the host: read in place where they spilled (the
        reservoir), else copied into a pinned slot."""
        at = 0
        with torch.cuda.stream(self.down):
            for p in chunk:
                grad, master = p.grad, self.masters[p]
                sent = self._host_grad(p)
                if sent is not None:
                    master.grad = sent
                    continue
                if _in_reservoir(grad):
                    master.grad = _host_view(grad)
                    continue
                nbytes = grad.numel() * grad.element_size()
                view = self.slots[slot][at:at + nbytes].view(grad.dtype).view_as(grad)
                view.copy_(grad, non_blocking=True)
                master.grad = view
                at += _nbytes(grad)
        done = torch.cuda.Event()
        done.record(self.down)
        return done

    def _step_on_host(self, chunk: list[torch.Tensor]) -> None:
        """The user's optimizer over the chunk's masters, with the user's groups and state."""
        opt = self.opt
        groups, state = opt.param_groups, opt.state
        inner: defaultdict = defaultdict(dict)
        host_groups = []
        ids = {id(p) for p in chunk}
        for g in groups:
            mine = [p for p in g["params"] if id(p) in ids]
            if not mine:
                continue
            for p in mine:
                inner[self.masters[p]] = state[p]
            extra = {"foreach": False, "fused": self.fused} if "fused" in g else {"foreach": False}
            host_groups.append({**g, **extra, "params": [self.masters[p] for p in mine]})
        opt.param_groups, opt.state = host_groups, inner
        try:
            with torch.no_grad():
                self.step_fn(opt)
        finally:
            opt.param_groups, opt.state = groups, state

    def _up(self, chunk: list[torch.Tensor]) -> None:
        with torch.cuda.stream(self.up), torch.no_grad():
            for p in chunk:
                p.detach().copy_(self.masters[p], non_blocking=True)


class GradsDown:
    """Gradients to pinned host memory while backward runs, as torchao's offload and
    ZeRO-Offload move them, with ``.grad`` kept: a CUDA view of the same host memory. A
    parameter's pinned home is made when its gradient first arrives in device memory: one
    that backward put in the reservoir is read there by the step, and a home for it too would
    hold it twice on the host (docs/managed-memory.md, run G: 9.4 of 11.25 GiB)."""

    def __init__(self, params: list[torch.Tensor], down: torch.cuda.Stream,
                 home: Any = None, waiting: bool = False) -> None:
        self.down = down
        self.home = home or _pinned_home  # param -> (pinned CPU tensor, its CUDA view) | None
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

    def _arrived(self, p: torch.Tensor) -> None:
        """After backward accumulated ``p.grad``: it goes down behind the kernels that made
        it, its device memory is given back once copied, ``.grad`` is the host view."""
        if self.on_first_arrival is not None:
            first, self.on_first_arrival = self.on_first_arrival, None
            first()
        grad, alias = p.grad, self.alias.get(p)
        if (grad is None or (alias is not None and grad.data_ptr() == alias.data_ptr())
                or grad.is_sparse or grad.dtype != p.dtype or grad.shape != p.shape
                or not grad.is_contiguous()):
            return  # in the view already, or not plain
        if self.waiting and not _grads_down_wanted():  # torch.distributed since the forward
            return
        if _in_reservoir(grad):  # spilled: the step reads it there; the next ones go down
            self.waiting = False
            return
        if self.waiting:
            if not (_spilling() or self._nearly_full(grad.device)):
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
        self.copying_bytes += grad.numel() * grad.element_size()
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


class _Mapped:
    """Pinned host memory as a CUDA array (``__cuda_array_interface__``) for torch.as_tensor;
    it holds the host tensor while a view of it lives."""

    def __init__(self, pointer: int, nbytes: int, host: torch.Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (pointer, False), "version": 3}


def _device_view(flat: torch.Tensor, device: torch.device,
                 pins: list[weakref.finalize]) -> torch.Tensor | None:
    """A CUDA tensor over the pinned host memory of ``flat`` (kernels read it across the
    bus), or None where it is not mapped. ``pins``: ``flat``'s page lock, moved onto the
    view's memory (kept locked while any view lives), or released at once with None."""
    if not flat.numel():
        return torch.empty(0, dtype=flat.dtype, device=device)
    pointer = ctypes.c_void_p()
    if not pins or _cudart().cudaHostGetDevicePointer(
            ctypes.byref(pointer), ctypes.c_void_p(flat.data_ptr()), 0) != 0:
        for unpin in pins:
            unpin()
        return None
    nbytes = flat.numel() * flat.element_size()
    mapped = _Mapped(int(pointer.value or 0), nbytes, flat)
    pins[0].detach()
    weakref.finalize(mapped, _unpin, flat, device)
    return torch.as_tensor(mapped, device=device).view(flat.dtype)


def _pinned_home(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pinned host memory of ``p``'s size, and a CUDA view of it (None where not mapped)."""
    pins: list[weakref.finalize] = []
    flat = _pinned(p.numel(), p.dtype, p.device, pins=pins, mapped=True)
    view = _device_view(flat, p.device, pins)
    return None if view is None else (flat.view_as(p), view.view_as(p))


def _grads_down_wanted() -> bool:
    if os.environ.get("UMPROV_MANAGED_GRADS_DOWN", "1") == "0":
        return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


def _nbytes(tensor: torch.Tensor) -> int:
    """The tensor's bytes rounded up to ALIGN: its room in a gradient slot."""
    return -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN


def _chunks(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive parameters, at most CHUNK bytes of slot room a chunk (or one larger one)."""
    chunks: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in params:
        if chunks[-1] and size + _nbytes(p) > CHUNK:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += _nbytes(p)
    return [chunk for chunk in chunks if chunk]


def _host_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same (host-resident managed) memory: no copy."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = (ctypes.c_byte * nbytes).from_address(tensor.data_ptr())
    return torch.frombuffer(raw, dtype=tensor.dtype).view_as(tensor)


def _pinned(numel: int, dtype: torch.dtype, device: torch.device, owner: Any = None,
            pins: list | None = None, mapped: bool = False) -> torch.Tensor:
    """Host memory of this size, page-locked for ``device``'s copy engines (PyTorch's pinned
    allocator rounds up to a power of two: 12 GiB would take 16), unlocked with its owner or
    by the finalizer appended to ``pins``; ``mapped``: kernels can address it too
    (cudaHostRegisterMapped), unlocked with its device view (``_device_view``). Its pages are
    its own: a page shared with another allocation (a small tensor's neighbour) could not be
    locked twice."""
    nbytes = numel * dtype.itemsize
    locked = -(-nbytes // PAGE) * PAGE
    buffer = torch.empty(locked + PAGE, dtype=torch.uint8)
    start = -buffer.data_ptr() % PAGE
    flat = buffer[start:start + nbytes].view(dtype)
    flags = 2 if mapped else 0
    if nbytes and _cudart().cudaHostRegister(ctypes.c_void_p(flat.data_ptr()),
                                             ctypes.c_size_t(locked), flags) == 0:
        unpin = weakref.finalize(flat if owner is None else owner, _unpin, flat, device)
        if pins is not None:
            pins.append(unpin)
    return flat


def _unpin(flat: torch.Tensor, device: torch.device) -> None:
    """Unlocked once ``device`` is done with it: its owner may go with copies or kernels over
    it still queued (an optimizer dropped after its step, gradients read after the host step
    was left)."""
    if torch.cuda.is_initialized():
        with contextlib.suppress(RuntimeError):  # CUDA torn down already (the process's exit)
            torch.cuda.synchronize(device)
    _cudart().cudaHostUnregister(ctypes.c_void_p(flat.data_ptr()))


def _cudart() -> Any:
    return _managed()._cudart()


def _managed() -> Any:
    import umprov_managed

    return umprov_managed
