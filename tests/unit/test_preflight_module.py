"""gpu_preflight's own module (roles/gpu_preflight/library): pure helpers, no host needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles/gpu_preflight/library/gpu_preflight_facts.py"


@pytest.fixture(scope="module")
def facts() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_preflight_facts", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel(running: str, newest: str, headers: dict[str, bool]) -> dict[str, Any]:
    return {
        "running": running,
        "newest": newest,
        "headers": {r: {"package": f"linux-headers-{r}", "installed": ok, "installable": False}
                    for r, ok in headers.items()},
    }


def test_an_old_kernel_without_headers_does_not_count(facts: Any) -> None:
    # Debian keeps only the current ABI's headers: 6.1.0-26 stays installed, its headers gone.
    k = kernel("6.1.0-28-amd64", "6.1.0-28-amd64",
               {"6.1.0-26-amd64": False, "6.1.0-28-amd64": True})
    assert facts.kernel_headers_missing(k) == []


def test_running_and_newest_kernels_need_headers(facts: Any) -> None:
    k = kernel("6.1.0-26-amd64", "6.1.0-28-amd64",
               {"6.1.0-26-amd64": False, "6.1.0-28-amd64": False, "6.1.0-21-amd64": False})
    assert facts.kernel_headers_missing(k) == [
        "linux-headers-6.1.0-26-amd64", "linux-headers-6.1.0-28-amd64"]
    same = kernel("6.8.0-48-generic", "6.8.0-48-generic", {"6.8.0-48-generic": False})
    assert facts.kernel_headers_missing(same) == ["linux-headers-6.8.0-48-generic"]


def test_headers_meta_packages_follow_the_kernel_meta_packages(facts: Any) -> None:
    installed = [
        "linux-image-amd64", "linux-image-6.1.0-28-amd64", "linux-image-cloud-amd64",
        "linux-image-generic-hwe-24.04", "linux-image-unsigned-6.8.0-48-generic",
        "linux-image-6.1.0-28-amd64-dbg", "linux-image-aws", "linux-image-",
    ]
    assert facts.header_meta_packages(installed) == [
        "linux-headers-amd64", "linux-headers-aws", "linux-headers-cloud-amd64",
        "linux-headers-generic-hwe-24.04",
    ]
    assert facts.header_meta_packages([]) == []
