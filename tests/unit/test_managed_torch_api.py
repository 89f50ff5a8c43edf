"""The managed pool reaches only for what torch 2.9 has (docs/managed-memory.md: the versions
it relies on): every ``torch.<attribute chain>`` and ``from torch.x import y`` in the modules of
docker/pytorch-cuda/managed must be in TORCH_2_9, the names checked against torch 2.9.0's own
source. A new name in any of them fails here until it is checked against
2.9 and added; a name 2.9 lacks cannot be added honestly (the check below, against the wheel,
fails for it).

TORCH_2_9 was verified against torch-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl by
``resolve_in`` below, which reads the wheel's Python sources and stubs (no import, no CUDA):
``UMPROV_TORCH_WHEEL=/path/to/that.whl pytest tests/unit/test_managed_torch_api.py`` runs that
check again; without the variable it is skipped and the committed list is what is checked.
Names reached through an object rather than a ``torch.`` chain (a method of a class the
modules patch or call) are listed by hand in INDIRECT, each tied to its spelling in the
modules' source."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
MODULES = sorted(MANAGED.glob("umprov_managed*.py"))  # every module the image carries

# Every name below resolved in torch 2.9.0's wheel (torch/**/*.py, torch/_C/*.pyi) by
# resolve_in(); checked 2026-12-05. Keep it to names that were checked that way.
TORCH_2_9 = frozenset({
    "torch",
    "torch.Tensor",
    "torch.Tensor._version",
    "torch.Tensor.copy_",
    "torch.Tensor.data_ptr",
    "torch.Tensor.detach",
    "torch.Tensor.device",
    "torch.Tensor.element_size",
    "torch.Tensor.grad",
    "torch.Tensor.is_complex",
    "torch.Tensor.is_contiguous",
    "torch.Tensor.is_floating_point",
    "torch.Tensor.is_sparse",
    "torch.Tensor.numel",
    "torch.Tensor.to",
    "torch.Tensor.view",
    "torch.Tensor.view_as",
    "torch.cuda",
    "torch.OutOfMemoryError",
    "torch.cuda.Event",
    "torch.cuda.Event.record",
    "torch.cuda.Event.synchronize",
    "torch.cuda.MemPool",
    "torch.cuda.Stream",
    "torch.cuda.Stream.wait_stream",
    "torch.cuda._lazy_call",
    "torch.cuda._utils",
    "torch.cuda._utils._get_device_index",
    "torch.cuda.current_device",
    "torch.cuda.device",
    "torch.cuda.get_device_properties",
    "torch.cuda.memory_allocated",
    "torch.cuda.set_device",
    "torch.cuda.set_per_process_memory_fraction",
    "torch.cuda.get_per_process_memory_fraction",
    "torch._C._CudaDeviceProperties.total_memory",
    "torch.cuda.MemPool.snapshot",
    "torch.cuda.Stream.wait_event",
    "torch.cuda.current_stream",
    "torch.cuda.device_count",
    "torch.cuda.empty_cache",
    "torch.cuda.init",
    "torch.cuda.memory._set_allocator_settings",
    "torch.backends",
    "torch.backends.cuda",
    "torch.backends.cuda.is_built",
    "torch.cuda.is_initialized",
    "torch.cuda.memory",
    "torch.cuda.memory.CUDAPluggableAllocator",
    "torch.cuda.memory.CUDAPluggableAllocator.allocator",
    "torch.cuda.stream",
    "torch.cuda.synchronize",
    "torch.cuda.use_mem_pool",
    "torch.dtype",
    "torch.empty",
    "torch.as_tensor",
    "torch.device",
    "torch.float32",
    "torch.frombuffer",
    "torch.no_grad",
    "torch.optim",
    "torch.optim.Adadelta",
    "torch.optim.Adagrad",
    "torch.optim.Adam",
    "torch.optim.AdamW",
    "torch.optim.Adamax",
    "torch.optim.NAdam",
    "torch.optim.Optimizer",
    "torch.optim.Optimizer.param_groups",
    "torch.optim.Optimizer.state",
    "torch.optim.Optimizer.step",
    "torch.optim.RAdam",
    "torch.optim.RMSprop",
    "torch.optim.SGD",
    "torch.optim.optimizer",
    "torch.optim.optimizer._get_fused_kernels_supported_devices",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.optim.optimizer.register_optimizer_step_pre_hook",
    "torch.uint8",
    "torch.Tensor.register_post_accumulate_grad_hook",
    "torch.autograd",
    "torch.autograd.Variable",
    "torch.autograd.Variable._execution_engine",  # set in torch/autograd/variable.py
    "torch.autograd.Variable._execution_engine.queue_callback",  # DDP's reducer uses it
    "torch.distributed",
    "torch.distributed.is_available",
    "torch.distributed.is_initialized",
    "torch.is_grad_enabled",
    "torch.cuda.mem_get_info",
    "torch.cuda.memory_stats",
    "torch.nn.Parameter",
    "torch.nn.parameter",
    "torch.nn.parameter.is_lazy",
    "torch.compiler",
    "torch.compiler.is_compiling",
    "torch.nn",
    "torch.nn.Module",
    "torch.nn.Module.parameters",
    "torch.nn.modules",
    "torch.nn.modules.module",
    "torch.nn.modules.module.register_module_forward_pre_hook",
    "torch.Tensor.is_leaf",
    "torch.Tensor.requires_grad",
})

# Reached through an object, not a torch. chain: (the name, how the modules' source spells it)
INDIRECT = [
    ("torch.cuda.memory.CUDAPluggableAllocator.allocator", '_state["allocator"].allocator()'),
    ("torch.cuda.Stream.wait_stream", "stream.wait_stream("),
    ("torch.cuda.Event.record", "self.uploaded.record("),
    ("torch.cuda.Event.record", "done.record(self.down)"),
    ("torch.cuda.MemPool.snapshot", "pool.snapshot()"),
    ("torch.cuda.Stream.wait_event", "stream.wait_event(copied)"),
    ("torch.cuda.Event.record", "copied.record(self.down)"),
    ("torch._C._CudaDeviceProperties.total_memory", "get_device_properties(device).total_memory"),
    ("torch.cuda.Event.synchronize", "self.uploaded.synchronize()"),
    ("torch.optim.Optimizer.step", "type(opt).step"),
    ("torch.optim.Optimizer.param_groups", "opt.param_groups"),
    ("torch.optim.Optimizer.state", "self.opt.state"),
    ("torch.Tensor._version", "p._version"),
    ("torch.Tensor.data_ptr", "tensor.data_ptr()"),
    ("torch.Tensor.detach", "p.detach()"),
    ("torch.Tensor.copy_", ".copy_("),
    ("torch.Tensor.view", ".view(grad.dtype)"),
    ("torch.Tensor.view_as", ".view_as(p)"),
    ("torch.Tensor.numel", "p.numel()"),
    ("torch.Tensor.element_size", ".element_size()"),
    ("torch.Tensor.is_complex", "p.is_complex()"),
    ("torch.Tensor.is_floating_point", "p.is_floating_point()"),
    ("torch.Tensor.is_sparse", "p.grad.is_sparse"),
    ("torch.Tensor.is_contiguous", "p.grad.is_contiguous()"),
    ("torch.Tensor.grad", "p.grad"),
    ("torch.Tensor.device", "p.device.type"),
    ("torch.Tensor.to", 'value.to("cpu"'),
    ("torch.Tensor.register_post_accumulate_grad_hook", "p.register_post_accumulate_grad_hook("),
    ("torch.nn.Module.parameters", "module.parameters(recurse=False)"),
    ("torch.Tensor.is_leaf", "p.is_leaf"),
    ("torch.Tensor.requires_grad", "p.requires_grad"),
]
# Set on each instance (in __init__), not on the class: checked on one made on the CPU
INSTANCE = {
    "torch.optim.Optimizer.param_groups": "torch.optim.SGD([torch.zeros(1, requires_grad=True)])",
    "torch.optim.Optimizer.state": "torch.optim.SGD([torch.zeros(1, requires_grad=True)])",
}
# Only in a CUDA build of torch (bound by torch._C's CUDA module at its import)
CUDA_ONLY = {"torch._C._CudaDeviceProperties.total_memory"}


def used_names(source: str) -> tuple[set[str], set[str]]:
    """The torch names a module uses: attribute chains rooted at the name ``torch`` (each
    prefix too: torch.cuda.memory.use_mem_pool needs torch.cuda.memory), and the modules and
    names of ``import torch...`` / ``from torch... import name``. Returned as (chains reached
    by attribute, names imported)."""
    chains, imported = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            parts, at = [], node
            while isinstance(at, ast.Attribute):
                parts.append(at.attr)
                at = at.value
            if isinstance(at, ast.Name) and at.id == "torch":
                chain = ["torch", *reversed(parts)]
                chains.update(".".join(chain[:n]) for n in range(1, len(chain) + 1))
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.split(".")[0] == "torch")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    return chains, imported


def all_used() -> tuple[set[str], set[str]]:
    chains, imported = set(), set()
    for module in MODULES:
        c, i = used_names(module.read_text())
        chains |= c
        imported |= i
    sys.path.insert(0, str(MANAGED))
    try:
        from umprov_managed_step import KINDS  # the optimizers it steps, by name
    finally:
        sys.path.remove(str(MANAGED))
    chains |= {f"torch.optim.{kind}" for kind in KINDS}
    return chains, imported


def test_the_scan_finds_what_the_modules_use():
    """The scan itself: chains, their prefixes, parameters named torch, from-imports."""
    chains, imported = used_names(
        "import torch\nfrom torch.optim.optimizer import a, b as c\n"
        "def f(torch): return torch.cuda.memory.use_mem_pool(x.torch.y)\n"
        "x: torch.cuda.Event | None = None\n")
    assert chains == {"torch", "torch.cuda", "torch.cuda.memory",
                      "torch.cuda.memory.use_mem_pool", "torch.cuda.Event"}
    assert imported == {"torch", "torch.optim.optimizer", "torch.optim.optimizer.a",
                        "torch.optim.optimizer.b"}
    chains, imported = all_used()
    assert {"torch.cuda.MemPool", "torch.cuda.set_per_process_memory_fraction",
            "torch.cuda.use_mem_pool", "torch.optim.AdamW"} <= chains
    assert "torch.optim.optimizer.register_optimizer_step_pre_hook" in imported


def unverified(chains: set[str], imported: set[str]) -> list[str]:
    return sorted((chains | imported) - TORCH_2_9)


def test_every_torch_name_the_pool_uses_is_in_torch_2_9():
    missing = unverified(*all_used())
    assert not missing, f"not checked against torch 2.9.0 (or not in it): {missing}"


def test_a_name_that_torch_2_9_lacks_fails_the_check():
    """Names of later torch (in 2.13, not in 2.9.0's wheel), as the pool might reach for them."""
    source = ("import torch\nfrom torch.cuda.memory import caching_allocator_disabled\n"
              "def f(graph):\n    torch.cuda.graphs.CUDAGraph.get_graph_data(graph)\n"
              "    return torch.cuda.MemPool\n")
    assert unverified(*used_names(source)) == [
        "torch.cuda.graphs", "torch.cuda.graphs.CUDAGraph",  # in 2.9, but not on the list
        "torch.cuda.graphs.CUDAGraph.get_graph_data",
        "torch.cuda.memory.caching_allocator_disabled"]


def test_every_indirect_use_is_still_spelled_so_in_the_modules():
    source = "\n".join(module.read_text() for module in MODULES)
    for name, spelling in INDIRECT:
        assert spelling in source, (name, spelling)
        assert name in TORCH_2_9, name


def test_the_verified_list_is_what_the_modules_use():
    """No stale entries: each verified name is used by the modules (a name the modules dropped
    leaves the list, so the list says what the pool relies on)."""
    chains, imported = all_used()
    indirect = {name for name, _ in INDIRECT}
    assert sorted(TORCH_2_9 - chains - imported - indirect) == []


def test_the_names_are_in_the_installed_torch_too():
    """In a fresh interpreter after a plain ``import torch``: a chain reached by attribute must
    be there without importing anything else (torch.optim.optimizer was not, in 2.11); a name
    from-imported, after its module's import. CUDA-only names are left out on a CPU build."""
    pytest.importorskip("torch")
    chains, imported = all_used()
    indirect = {name for name, _ in INDIRECT}
    program = """
import importlib, json, sys
import torch
names = json.loads(sys.argv[1])
missing = []
def resolve(name, start):
    obj = start
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
for name in names["attribute"]:
    try:
        resolve(name, torch)
    except AttributeError:
        missing.append(name)
for name, made in names["instance"].items():
    if not hasattr(eval(made), name.rpartition(".")[2]):
        missing.append(name)
for name in names["imported"]:
    module, _, attr = name.rpartition(".")
    try:
        importlib.import_module(name)
    except ImportError:
        try:
            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            missing.append(name)
print(json.dumps(missing))
"""
    names = {"attribute": sorted((chains | indirect) - CUDA_ONLY - set(INSTANCE)),
             "instance": {name: INSTANCE[name] for name in sorted(INSTANCE)},
             "imported": sorted(imported - CUDA_ONLY)}
    out = subprocess.run([sys.executable, "-c", program, json.dumps(names)], check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out.splitlines()[-1]) == []


# The check against torch 2.9.0's wheel: what TORCH_2_9 was built with.


class Wheel:
    """torch's Python sources and stubs in a wheel, parsed on demand."""

    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.files = set(self.zip.namelist())
        self.trees: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for candidate in (f"{base}/__init__.py", f"{base}.py", f"{base}/__init__.pyi",
                          f"{base}.pyi"):
            if candidate in self.files:
                return candidate
        return None

    def tree(self, dotted: str) -> ast.Module | None:
        if dotted not in self.trees:
            path = self.module(dotted)
            self.trees[dotted] = None if path is None else ast.parse(self.zip.read(path))
        return self.trees[dotted]


def _top_level(body: list[ast.stmt]):
    """Statements run at a module's (or class body's) top level, through if/try/with."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.With):
            yield from _top_level(stmt.body)
            yield from _top_level(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, stmt.orelse, stmt.finalbody,
                         *[h.body for h in stmt.handlers]):
                yield from _top_level(part)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def resolve_in(wheel: Wheel, name: str) -> bool:
    """Whether ``name`` (torch.a.b.C.m) exists in the wheel's torch: each part bound at the
    top level of the module it is looked up in (def, class, assignment, import, star import),
    a submodule its package imports, or a class member (its body, self.x in its methods, or
    a base class's)."""

    def in_module(module: str, attr: str, seen: frozenset = frozenset()) -> tuple | None:
        if (module, attr) in seen:
            return None
        seen |= {(module, attr)}
        tree = wheel.tree(module)
        if tree is None:
            return None
        path = wheel.module(module) or ""
        is_package = "__init__" in path
        stars = []
        for stmt in _top_level(tree.body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == attr:
                return ("value",)
            if isinstance(stmt, ast.ClassDef) and stmt.name == attr:
                return ("class", module, stmt)
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                    return ("value",)
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == attr:
                        return ("module", alias.name)
                    if alias.asname is None and _within(alias.name, f"{module}.{attr}"):
                        return ("module", f"{module}.{attr}")  # import a.b.c binds a.b
            if isinstance(stmt, ast.ImportFrom):
                source = _absolute(module, stmt, is_package)
                for alias in stmt.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == attr:
                        if wheel.module(f"{source}.{alias.name}"):
                            return ("module", f"{source}.{alias.name}")
                        return in_module(source, alias.name, seen)
                if _within(source, f"{module}.{attr}"):  # from .x import y binds x too
                    return ("module", f"{module}.{attr}")
        if module == "torch" and attr in PUBLIC_OPS_LOOP:  # torch's loop over _C's functions
            stars.append("torch._C._VariableFunctions")
        for source in stars:
            if not attr.startswith("_") or source.endswith("_VariableFunctions"):
                found = in_module(source, attr, seen)
                if found:
                    return found
        return None

    def in_class(module: str, cls: ast.ClassDef, attr: str) -> bool:
        for stmt in _top_level(cls.body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == attr:
                return True
            if isinstance(stmt, ast.AnnAssign | ast.Assign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                    return True
        for node in ast.walk(cls):  # self.attr = ... in its methods
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr == attr):
                return True
        for base in cls.bases:
            dotted = ast.unparse(base)
            head, *rest = dotted.split(".")
            found = in_module(module, head) if head != "torch" else ("module", "torch")
            for part in rest:
                if found is None or found[0] != "module":
                    found = None
                    break
                found = in_module(found[1], part) or (
                    ("module", f"{found[1]}.{part}") if wheel.module(f"{found[1]}.{part}")
                    else None)
            if found and found[0] == "class" and in_class(found[1], found[2], attr):
                return True
        return False

    parts = name.split(".")
    at: tuple | None = ("module", parts[0])
    for part in parts[1:]:
        if at is None:
            return False
        if at[0] == "module":
            at = in_module(at[1], part)
        elif at[0] == "class":
            at = ("value",) if in_class(at[1], at[2], part) else None
        else:
            return False
    return at is not None and (at[0] != "module" or wheel.tree(at[1]) is not None)


# torch/__init__.py binds every public function of torch._C._VariableFunctions in a loop
# (for __name in dir(_C._VariableFunctions): globals()[__name] = ...); resolve_in checks the
# loop is there before it counts on it.
PUBLIC_OPS_LOOP = {"empty", "frombuffer", "as_tensor"}


# Class attributes that hold an instance: their methods are looked up on its class
# (torch/autograd/variable.py: _execution_engine = ImperativeEngine(), torch._C's class).
TYPED = {"torch.autograd.Variable._execution_engine.": "torch._C._ImperativeEngine."}


def as_typed(name: str) -> str:
    for prefix, cls in TYPED.items():
        if name.startswith(prefix):
            return cls + name.removeprefix(prefix)
    return name


@pytest.mark.skipif(not os.environ.get("UMPROV_TORCH_WHEEL"),
                    reason="UMPROV_TORCH_WHEEL (torch 2.9.0's wheel) not set: the committed "
                           "list stands for it")
def test_the_list_is_what_torch_2_9s_wheel_has():
    wheel = Wheel(Path(os.environ["UMPROV_TORCH_WHEEL"]))
    version = wheel.zip.read("torch/version.py").decode()
    assert "__version__ = '2.9.0" in version, version
    init = wheel.zip.read("torch/__init__.py").decode()
    assert "for __name in dir(_C._VariableFunctions):" in init
    missing = sorted(name for name in TORCH_2_9 if not resolve_in(wheel, as_typed(name)))
    assert missing == []
    # and the resolver can say no
    for absent in ("torch.cuda.memory.caching_allocator_disabled",  # names of later torch
                   "torch.cuda.graphs.CUDAGraph.get_graph_data",
                   "torch.optim.Optimizer._accelerator_graph_capture_health_check",
                   "torch.cuda.GreenContext",
                   "torch.cuda.no_such_thing", "torch.optim.Optimizer.no_such_method",
                   "torch.Tensor.no_such_method", "torch.cuda.MemPool.no_such_property",
                   "torch.optim.Muon.step.x", "torch.no_such_module.x"):
        assert not resolve_in(wheel, absent), absent
