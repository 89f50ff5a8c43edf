"""A GPU's CUDA context made while its child imports torch.

``import torch`` takes a child 1.0-1.4 s of CPU work, and the CUDA context that follows
0.2-0.3 s more, one after the other on every child's path (docs/verify-checks.md, "How long a
run takes"). A thread retains the device's primary context through the driver (libcuda)
meanwhile, once the monitor child has listed the GPU's processes (the CUDA gate: the agent's
own contexts must not be in that list); torch's runtime then finds the context made. Where
there is no driver, no such device or the gate does not open, the thread does nothing and
torch starts CUDA as it would without it.

The child joins the thread right after its own wait for the gate, before anything changes the
environment (torch's CUDA start sets CUDA_MODULE_LOADING where it is unset; the
oversubscription check sets the pool's variables): setenv in one thread while the driver
reads the environment in another is undefined in C. CUDA_MODULE_LOADING is set here, before
the thread starts, to what torch would set, so the driver starts as it would under torch.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .runner import GATE_LIMIT, gate_open

LIBCUDA = "libcuda.so.1"


def start_early_context(ordinal: int, gate: str | None,
                        limit: float = GATE_LIMIT) -> threading.Thread:
    """Start the thread that retains CUDA device ``ordinal``'s primary context once ``gate``
    exists (None: at once); it gives up after ``limit`` seconds without the gate. Join it
    before the environment changes."""
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")  # torch's own default
    thread = threading.Thread(target=_retain_after, args=(ordinal, gate, limit),
                              name="early-cuda-context", daemon=True)
    thread.start()
    return thread


def _retain_after(ordinal: int, gate: str | None, limit: float) -> None:
    if gate is None or gate_open(gate, limit):
        retain_primary_context(ordinal)


def retain_primary_context(ordinal: int, library: str = LIBCUDA) -> bool:
    """Whether device ``ordinal``'s primary context was made (or was there) and is retained
    for the rest of the process (it ends with os._exit: nothing to release)."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return False
    device, context = ctypes.c_int(), ctypes.c_void_p()
    return (cuda.cuInit(0) == 0
            and cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0)
