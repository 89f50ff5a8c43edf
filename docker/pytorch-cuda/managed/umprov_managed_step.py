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
gradient backward made in device memory goes down while backward still runs (``GradsDown``,
umprov_managed_grads.py): copied into pinned host memory, its device memory freed soon after,
``.grad`` a CUDA view of that host memory, so code between backward and step
(``clip_grad_norm_``) still reads and scales it in place. Parameters are watched from the
first forward (``_before_forward``), and gradients go down once the job spills or the GPU is
nearly full, so the first step's gradients need not spill either.

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

import os
import threading
import warnings
import weakref
from collections import defaultdict
from typing import Any

import torch
import umprov_managed_grads as grads
import umprov_managed_pinned as pinned_memory
from torch.optim.optimizer import (
    _get_fused_kernels_supported_devices,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

KINDS = ("SGD", "Adam", "AdamW", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta")
CHUNK = 256 << 20  # bytes of parameters a chunk: big enough for the CPU's threads and the bus
ALIGN = 512  # each gradient's place in a slot: any dtype's view of it starts aligned
SLOTS = 3  # pinned gradient slots: one coming down, one stepped, one spare
_lib: Any = None
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
    if not grads.wanted():
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
            if not grads.wanted():  # torch.distributed since install()
                _stop_watching()
                return
            down, _up = _managed().copy_streams(params[0].device.index)
            early = _early["grads"] = grads.GradsDown([], down, waiting=True)
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


def _take_early() -> grads.GradsDown | None:
    """At an optimizer step: the parameters watched since the first forward, if any; the
    forward hook is done either way."""
    _stop_watching()
    early, _early["grads"] = _early["grads"], None
    return early


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
    spilling = grads.spilling()  # read at every step: stats()'s peak
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


def _state_would_spill(opt: torch.optim.Optimizer, early: grads.GradsDown) -> bool:
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

    def __init__(self, opt: torch.optim.Optimizer, early: grads.GradsDown | None = None) -> None:
        self.opt = opt
        self.grads_down: grads.GradsDown | None = None
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
        wanted = grads.wanted()
        if early is not None and (not wanted or early.device not in (None, self.device)):
            early.release()  # another GPU's parameters, or distributed since the forward
            early = None
        if wanted:
            self.grads_down = early if early is not None else grads.GradsDown([], self.down)
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
            flat = pinned_memory.pinned(sum(p.numel() for p in mine), dtype, self.device, self,
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
            self.slots = [pinned_memory.pinned(need, torch.uint8, self.device, self, self.slot_pins)
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
                if grads.in_reservoir(grad):
                    master.grad = pinned_memory.host_view(grad)
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


def _managed() -> Any:
    import umprov_managed

    return umprov_managed
