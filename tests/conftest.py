"""Fixtures shared by every tier."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from umprov.cli import run

REPO = Path(__file__).resolve().parent.parent


def shared_library(out: Path, name: str, source: str, flags: tuple[str, ...] = (),
                   libraries: tuple[str, ...] = ()) -> Path:
    """The C ``source`` built with gcc into the shared library ``out/name`` (``flags`` before
    the source, ``libraries`` to link after it); the test is skipped where there is no gcc."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the stand-in library with")
    c_file = out / f"{name}.c"
    c_file.write_text(source)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", *flags, "-o",
                    str(out / name), str(c_file), *libraries], check=True)
    return out / name


@pytest.fixture(scope="session")
def managed_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """umprov's managed-memory library (docker/pytorch-cuda/managed/umprov_managed.c), built
    here with gcc as the image builds it, warnings as errors."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the managed-memory library with")
    out = tmp_path_factory.mktemp("managed") / "libumprov_managed.so"
    subprocess.run(["sh", str(REPO / "docker/pytorch-cuda/managed/build.sh"), str(out),
                    "-Wextra", "-Werror"], check=True)
    return out


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as in a terminal, however pytest was started: a shell starts a background job
    (`nohup make test &`) with SIGINT ignored, Python then keeps it ignored, and the tests that
    interrupt the main thread (_thread.interrupt_main) would wait forever."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The costliest files first. `make test` hands whole files to its workers in collection
    order (--dist loadfile --no-loadscope-reorder): a long lab module that started late would
    leave one worker running it alone at the end. A file declares its cost with
    `pytest.mark.cost(SECONDS)` in its pytestmark (its wall time on a 2-core machine, beside
    another worker); the others keep their order, and so does each file's tests (stable sort)."""
    def cost(item: pytest.Item) -> float:
        marker = item.get_closest_marker("cost")
        return float(marker.args[0]) if marker else 0.0

    items.sort(key=lambda item: -cost(item))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """`make test` runs the `serial` tests first, alone (Makefile); the second phase's output,
    which ends the run, repeats that phase's summary line just above its own."""
    serial = os.environ.get("UMPROV_TEST_SERIAL_RESULT", "").strip(" =")
    if serial:
        terminalreporter.write_sep("=", f"serial phase (run first, alone): {serial}")


class _Boundary(click.Command):
    """Lets CliRunner drive umprov through its real error boundary (umprov.cli.run)."""

    def main(self, args=None, prog_name=None, **_kwargs):  # type: ignore[override]
        sys.exit(run(list(args or [])))


@pytest.fixture
def umprov_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """Run `umprov ARGS...` in-process; returns click's Result (exit_code, stdout, stderr)."""
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(REPO))
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(_Boundary("umprov"), list(args), input=input, catch_exceptions=False)

    yield invoke


def torch_with_dynamo() -> Any:
    """torch with torch._dynamo imported (the optimizers and umprov's pool import it), or the
    test skipped without torch. ansible-core replaces sys.intern with a callable object in any
    process that imported it (a test worker has), and dynamo's import refuses to wrap that: it
    is imported with Python's own sys.intern, put back afterwards."""
    torch = pytest.importorskip("torch")
    patched = sys.intern
    sys.intern = getattr(type(patched), "unpatched_implementation", patched)
    try:
        import torch._dynamo  # noqa: F401
    finally:
        sys.intern = patched
    return torch
