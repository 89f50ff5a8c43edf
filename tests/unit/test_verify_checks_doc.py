"""Every record name the verifier agent can emit is documented: docs/verify-checks.md (the
passive checks also docs/slurm.md).

Read statically with ast (no torch, nothing imported from the agent). A record's ``check``
comes from the calls below (PRIMITIVES), or from a function that passes one of its parameters
on to such a call: found by following the parameters until nothing changes (``GpuChild.rec``,
``guard``, ``fits``, ``Rank.emit``, ``oom_skip``, ``guarded``, ``temperature(check=...)``,
nccl.py's ``_all_reduce(..., name)`` ...). A check name that is not a literal is resolved
from the assignments, loops and module constants it is made of (``CHECK``, ``SWEEP_CHECK``,
``for check in (...)``); an f-string is listed in COMPUTED with its documented spelling.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.conftest import REPO

AGENT = REPO / "umprov" / "verify" / "agent"
DOCS = (REPO / "docs" / "verify-checks.md", REPO / "docs" / "slurm.md")
DOTTED = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+\Z")
DOC_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)+")

# The calls that make a record: (how the callee is named, its name) -> (position of the check
# argument as called, its keyword). "name": called by a plain name (a function, or a callable
# passed in under that name, as monitor.py passes schema.record); "attr": a method.
PRIMITIVES: dict[tuple[str, str], set[tuple[int, str]]] = {
    ("name", "record"): {(2, "check")},  # schema.record
    ("name", "figure"): {(2, "check")},  # schema.figure
    # Emitter.start: a child that dies or hangs after it is reported under that name, with
    # reason crash or timeout (runner.Child.outcome/_unfinished; a crash guard's fail record:
    # runner.guarded).
    ("attr", "start"): {(0, "check")},
    # runner.Child: the record of a child that died before its first start event (its
    # ``check``, else its name).
    ("name", "Child"): {(6, "check")},
}
# Modules whose start events no one turns into records: the multi-node workers write events
# only, judged on the control side (umprov/verify/multinode_judge.py, which names its own
# multinode.* records; docs/verify-multinode.md).
EVENTS_ONLY = {"multinode.py"}
# Call sites whose check name is taken at run time from elsewhere, every source of which is
# collected here already: (module, function).
DYNAMIC = {
    # the last start event's check, else Child's own: both collected above
    ("runner.py", "_unfinished"),
}
# f-string names: the pattern as written -> how the docs spell it.
COMPUTED = {
    "xid.{code}": "xid.N",  # xid.py: one record per Xid code found in the kernel log
}


@dataclass
class Func:
    node: ast.FunctionDef | ast.AsyncFunctionDef | None  # None: the module's top level
    module: str
    method: bool
    outer: Func | None


@dataclass
class Found:
    names: dict[str, list[str]] = field(default_factory=dict)  # name -> where
    unresolved: list[str] = field(default_factory=list)
    dynamic: set[tuple[str, str]] = field(default_factory=set)  # DYNAMIC entries met

    def add(self, name: str, where: str) -> None:
        self.names.setdefault(name, []).append(where)


def _own_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function (or module) body, nested functions and classes left out."""
    stack = list(ast.iter_child_nodes(root))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _functions(module: str, tree: ast.Module) -> list[Func]:
    out = [Func(None, module, False, None)]

    def visit(node: ast.AST, outer: Func | None, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = Func(child, module, in_class, outer)
                out.append(f)
                visit(child, f, False)
            elif isinstance(child, ast.ClassDef):
                visit(child, outer, True)
            else:
                visit(child, outer, in_class)

    visit(tree, None, False)
    return out


def _params(f: Func) -> list[ast.arg]:
    if f.node is None:
        return []
    a = f.node.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def _default(f: Func, name: str) -> ast.expr | None:
    assert f.node is not None
    a = f.node.args
    positional = [*a.posonlyargs, *a.args]
    pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
    pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    return next((d for p, d in pairs if p.arg == name), None)


def _bound_to(node: ast.AST, name: str) -> ast.expr | None:
    """What ``node`` binds ``name`` to, if it does: an assignment's value, a loop's iterable."""
    def names(target: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}

    if isinstance(node, ast.Assign) and any(name in names(t) for t in node.targets):
        return node.value
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and \
            name in names(node.target):
        return node.value
    if isinstance(node, (ast.For, ast.comprehension)) and name in names(node.target):
        return node.iter
    return None


def _callee(call: ast.Call) -> tuple[str, str] | None:
    if isinstance(call.func, ast.Name):
        return "name", call.func.id
    if isinstance(call.func, ast.Attribute):
        return "attr", call.func.attr
    return None


class Collector:
    def __init__(self) -> None:
        self.trees = {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(AGENT.glob("*.py"))}
        self.funcs = [f for m, t in self.trees.items() for f in _functions(m, t)]
        self.sinks = {k: set(v) for k, v in PRIMITIVES.items()}
        self.found = Found()

    # -- which calls make records
    def _aliases(self, f: Func) -> dict[str, tuple[str, str]]:
        """Local names bound to a sink: ``g = self.guard`` (gpu.py)."""
        out = {}
        for node in _own_nodes(f.node or self.trees[f.module]):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                v = node.value
                key = (("attr", v.attr) if isinstance(v, ast.Attribute) else
                       ("name", v.id) if isinstance(v, ast.Name) else None)
                if key in self.sinks:
                    out[node.targets[0].id] = key
        return out

    def _check_args(self, f: Func) -> Iterator[tuple[ast.Call, ast.expr]]:
        """(call, its check argument) of every record-making call in ``f``'s own body."""
        aliases = self._aliases(f)
        for call in _own_nodes(f.node or self.trees[f.module]):
            if not isinstance(call, ast.Call):
                continue
            key = _callee(call)
            if key and key[0] == "name" and key[1] in aliases:
                key = aliases[key[1]]
            if key not in self.sinks or (key == ("attr", "start") and f.module in EVENTS_ONLY):
                continue
            for pos, kw in self.sinks[key]:
                arg = next((k.value for k in call.keywords if k.arg == kw), None)
                if arg is None and any(isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
                    continue  # *args passed through (passive.py's lambda): its callers count
                if arg is None and pos < len(call.args):
                    arg = call.args[pos]
                if arg is None and key == ("name", "Child") and call.args:
                    arg = call.args[0]  # no check given: the child's name is its record's
                if arg is not None:
                    yield call, arg

    def propagate(self) -> None:
        """A function that hands one of its parameters on as a check name makes records too."""
        changed = True
        while changed:
            changed = False
            for f in self.funcs:
                if f.node is None:
                    continue
                params = _params(f)
                for _call, arg in self._check_args(f):
                    if not isinstance(arg, ast.Name):
                        continue
                    idx = next((i for i, p in enumerate(params) if p.arg == arg.id), None)
                    if idx is None:
                        continue
                    pos = idx - 1 if f.method else idx  # a method is called without self
                    key = ("attr" if f.method else "name", f.node.name)
                    if (pos, arg.id) not in self.sinks.setdefault(key, set()):
                        self.sinks[key].add((pos, arg.id))
                        changed = True

    # -- what the check arguments are
    def _bindings(self, f: Func | None, name: str, module: str) -> list[ast.expr] | None:
        """The expressions ``name`` is bound to in ``f`` (loops: what they iterate over), else
        in the functions around it, else at the module's top level or where it is imported
        from; None when nowhere."""
        while True:
            root = f.node if f is not None and f.node is not None else self.trees[module]
            out: list[ast.expr] = []
            for node in _own_nodes(root):
                bound = _bound_to(node, name)
                if bound is not None:
                    out.append(bound)
                elif isinstance(node, ast.ImportFrom) and node.level == 1 and any(
                        (a.asname or a.name) == name for a in node.names):
                    source = f"{node.module}.py"
                    if source in self.trees:
                        return self._bindings(None, name, source)
            if out:
                return out
            if f is None or f.node is None:
                return None
            f = f.outer

    def values(self, expr: ast.expr, f: Func, seen: set | None = None) -> set[str]:
        """The check names ``expr`` can be: literals, f-string patterns, and the dotted string
        constants of what its names are bound to (an over-approximation, filtered to dotted
        names)."""
        seen = set() if seen is None else seen
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.JoinedStr):
            return {"".join(v.value if isinstance(v, ast.Constant) else
                            "{" + ast.unparse(v.value) + "}"
                            for v in expr.values)}
        out: set[str] = set()
        for node in ast.walk(expr):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    DOTTED.match(node.value):
                out.add(node.value)
            elif isinstance(node, ast.Name) and (f.module, id(f), node.id) not in seen:
                seen.add((f.module, id(f), node.id))
                for bound in self._bindings(f, node.id, f.module) or []:
                    out |= self.values(bound, f, seen)
        return out

    def collect(self) -> Found:
        self.propagate()
        for f in self.funcs:
            params = {p.arg for p in _params(f)}
            fname = f.node.name if f.node is not None else "<module>"
            for call, arg in self._check_args(f):
                where = f"{f.module}:{call.lineno}"
                if isinstance(arg, ast.Name) and arg.id in params:
                    default = _default(f, arg.id)
                    if default is not None:  # temperature(check="gpu.temperature")
                        for v in self.values(default, f):
                            self.found.add(v, where)
                    continue  # its callers give the names
                names = self.values(arg, f)
                if names:
                    for v in names:
                        self.found.add(v, where)
                elif (f.module, fname) in DYNAMIC:
                    self.found.dynamic.add((f.module, fname))
                else:
                    self.found.unresolved.append(f"{where} {ast.unparse(arg)}")
        return self.found


def documented() -> set[str]:
    """Every dotted name in backticks in the docs."""
    out: set[str] = set()
    for path in DOCS:
        for span in re.findall(r"`([^`\n]+)`", path.read_text()):
            out |= set(DOC_TOKEN.findall(span))
    return out


FOUND = Collector().collect()


def test_the_collector_finds_the_well_known_names() -> None:
    names = set(FOUND.names)
    for name in ("managed.oversubscription", "nccl.init", "gpu.hbm_copy", "gpu.smoke_kernel",
                 "host.gpu_count", "nccl.busbw_4g", "nccl.allreduce_sweep",
                 "burnin.temperature", "gpu.temperature", "nccl.all_reduce_bf16",
                 "managed.concurrent_access", "managed.setup", "monitor.end", "agent.active",
                 "burnin.gemm_bf16_rate", "xid.{code}"):
        assert name in names, f"the collector missed {name}; it found {sorted(names)}"
    assert len(names) > 60, sorted(names)
    assert "multinode.init" not in names  # a worker's start event, never a record


def test_every_check_name_is_resolved() -> None:
    assert not FOUND.unresolved, (
        "record names not resolvable statically (list them in DYNAMIC or COMPUTED, with why): "
        + "; ".join(FOUND.unresolved))
    assert FOUND.dynamic == DYNAMIC, f"DYNAMIC entries no longer needed: {DYNAMIC - FOUND.dynamic}"
    computed = {n for n in FOUND.names if "{" in n}
    assert computed <= set(COMPUTED), f"f-string names not in COMPUTED: {computed - set(COMPUTED)}"
    odd = {n for n in FOUND.names if "{" not in n and not DOTTED.match(n)}
    assert not odd, f"check names that are not dotted names: {odd}"


def test_every_record_name_is_documented() -> None:
    docs = documented()
    missing = {n: w for n, w in FOUND.names.items() if COMPUTED.get(n, n) not in docs}
    assert not missing, (
        "record names the agent emits that neither docs/verify-checks.md nor docs/slurm.md "
        "names (in backticks): " + ", ".join(f"{COMPUTED.get(n, n)} ({', '.join(sorted(set(w)))})"
                                             for n, w in sorted(missing.items())))
