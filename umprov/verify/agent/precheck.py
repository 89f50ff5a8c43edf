"""What can be learnt before torch starts: driver, device nodes, libcuda, torch presence; the
GPU count to expect; and, when no GPU shows up, every reason found for it."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import re
import shutil
import sys
from typing import Any

from .runner import MULTICAST_OFF


def precheck() -> dict:
    """What can be learnt without torch or a GPU: driver, device nodes, torch presence."""
    facts: dict[str, Any] = {}
    try:
        with open("/proc/driver/nvidia/version") as fh:
            facts["kernel_module"] = " ".join(fh.readline().split())[:200]
    except OSError:
        facts["kernel_module"] = None
    facts["device_nodes"] = sorted(
        p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))
    facts["nvidiactl"] = os.path.exists("/dev/nvidiactl")
    facts["nvidia_uvm"] = os.path.exists("/dev/nvidia-uvm")
    facts["nvidia_smi"] = shutil.which("nvidia-smi")
    lib = None
    for cand in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if cand:
            try:
                ctypes.CDLL(cand)
                lib = cand
                break
            except OSError:
                continue
    facts["libcuda"] = lib
    facts["torch_importable"] = importlib.util.find_spec("torch") is not None
    facts["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    facts["multicast_env"] = {k: os.environ.get(k, f"{v} (set by the agent)")
                              for k, v in MULTICAST_OFF.items()}
    return facts


def guess_gpu_count(pre: dict) -> int | None:
    """How many GPUs CUDA will probably show, without starting CUDA (None: no idea)."""
    nodes = len(pre.get("device_nodes") or [])
    if not nodes:
        return None
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return nodes
    items = [x.strip() for x in cvd.split(",") if x.strip()]
    if not items or any(x.startswith("MIG-") for x in items):
        return None
    return min(len(items), nodes)


def no_gpu_reasons(pre: dict, disc: dict | None) -> list[str]:
    reasons = []
    if not pre.get("torch_importable"):
        reasons.append(f"no torch: python {sys.executable} cannot import torch")
    if not pre.get("kernel_module") and not pre.get("libcuda"):
        reasons.append("no NVIDIA driver: /proc/driver/nvidia/version missing and libcuda.so.1 "
                       "not loadable")
    elif not pre.get("libcuda"):
        reasons.append("libcuda.so.1 not loadable (container started without the NVIDIA runtime?)")
    if not pre.get("device_nodes"):
        reasons.append("no device: no /dev/nvidia0.. nodes (container without --gpus?)")
    if not pre.get("nvidia_uvm"):
        reasons.append("no /dev/nvidia-uvm (nvidia-uvm module not loaded or not passed in)")
    if disc:
        if disc.get("torch") and not disc.get("torch_cuda_build"):
            reasons.append(f"torch {disc['torch']} is a CPU-only build")
        if disc.get("cuda_error"):
            reasons.append(f"CUDA error: {disc['cuda_error']}")
        if disc.get("cuda_available") and not disc.get("devices"):
            reasons.append("CUDA reports 0 devices")
    if pre.get("cuda_visible_devices") in ("", "-1", "none", "void", "NoDevFiles"):
        reasons.append(f"CUDA_VISIBLE_DEVICES={pre['cuda_visible_devices']!r} hides every GPU")
    return reasons or ["torch sees no CUDA device (no other cause found)"]
