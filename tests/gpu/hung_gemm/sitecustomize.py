"""Put on PYTHONPATH by tests/gpu/test_verify_gpu.py: GPU 0's bf16 GEMM rate check hangs.

Python imports this module at start-up in every process of the agent's run. It wraps torch,
once torch is imported, so that ``torch.mm`` on a tensor of cuda:0 never returns: of the
agent's checks only gpu.gemm_bf16_rate calls torch.mm (the others use ``@``), so gpu0's child
hangs there, as on a GPU whose kernel never finishes, and every other check runs as usual.
"""

import importlib.abc
import importlib.util
import sys
import time


def _hang_on_gpu0(torch):
    real_mm = torch.mm

    def mm(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and a.is_cuda and a.device.index == 0 for a in args):
            while True:
                time.sleep(3600)
        return real_mm(*args, **kwargs)

    torch.mm = mm


class _WrapTorch(importlib.abc.MetaPathFinder):
    """Finds the real torch through the other finders, and wraps its loading."""

    busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _hang_on_gpu0(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _WrapTorch())
