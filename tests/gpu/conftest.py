"""GPU tier: needs an NVIDIA GPU and a torch that sees it; skipped with the reason otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from umprov.verify.bundle import agent_zipapp


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so `pytest tests/gpu` works without the project's pytest settings.
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (tests/gpu); skipped without one")


def _gpu_count() -> tuple[int, str]:
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed for this Python"
    if not torch.cuda.is_available():
        return 0, f"no CUDA GPU visible to torch {torch.__version__}"
    return torch.cuda.device_count(), ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if "tests/gpu/" in str(i.fspath)]
    for item in mine:
        item.add_marker(pytest.mark.gpu)
    if not mine:
        return
    count, why = _gpu_count()
    if count == 0:
        skip = pytest.mark.skip(reason=f"GPU tests: {why}")
        for item in mine:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_count() -> int:
    return _gpu_count()[0]


@pytest.fixture(scope="session")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's zipapp, as umprov ships it to hosts."""
    return agent_zipapp(cache=tmp_path_factory.mktemp("agent"))
