"""`umprov lab image` where no CPU torch wheel can be had (`make demo` on a Debian 12 machine
without /opt/wheels and without PyTorch's index): the image is really built without torch,
JupyterLab and the entrypoint are there, and the verification agent run in it reports "no
torch" as a failing check, never a crash. Builds an image of its own (a few minutes, its
layers mostly cached from the lab image's) and removes it afterwards."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import _Boundary
from tests.lab.conftest import image_build_lock, lab_name

pytestmark = pytest.mark.cost(175)

TAG = f"umprov/pytorch-cuda:{lab_name('pytest-notorch')}"


@pytest.fixture(scope="module")
def built(docker_client: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """`umprov lab image --torch-wheel none`: (its JSON, what it said on stderr)."""
    with image_build_lock():
        result = CliRunner().invoke(
            _Boundary("umprov"), ["lab", "image", "--torch-wheel", "none", "--tag", TAG, "--json"],
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.stderr
    try:
        yield json.loads(result.stdout), result.stderr
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(TAG, force=True)


def run_in_image(docker_client: Any, script: str, **kwargs: Any) -> str:
    """A shell script in a throw-away container of the image (not its entrypoint): output."""
    out = docker_client.containers.run(TAG, ["-c", script], entrypoint="/bin/sh", remove=True,
                                       network_disabled=True, user="root", **kwargs)
    return out.decode(errors="replace")


def test_the_image_is_built_without_torch_and_says_so(built: tuple[dict[str, Any], str]) -> None:
    doc, said = built
    assert doc["tag"] == TAG and doc["image_id"].startswith("sha256:")
    assert "WITHOUT torch" in said and "no torch" in said


def test_jupyter_is_there_and_torch_is_not(docker_client: Any, built: Any) -> None:
    out = run_in_image(docker_client, (
        "python3 -c 'import jupyterlab' && echo jupyter=yes; "
        "python3 -c 'import torch' 2>/dev/null && echo torch=yes || echo torch=no; "
        "test -x /usr/local/bin/umprov-entrypoint && echo entrypoint=yes"))
    assert out.split() == ["jupyter=yes", "torch=no", "entrypoint=yes"], out


def test_verify_in_the_image_reports_no_torch_as_a_failing_check(
    docker_client: Any, built: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from umprov.verify import report
    from umprov.verify.bundle import agent_zipapp

    agent = agent_zipapp(cache=tmp_path_factory.mktemp("agent"))
    out = run_in_image(
        docker_client, "python3 /agent.pyz --quiet --json /tmp/r.json; echo \"rc=$?\"; "
        "cat /tmp/r.json",
        volumes={str(agent): {"bind": "/agent.pyz", "mode": "ro"}},
    )
    first, _, rest = out.partition("\n")
    assert first == "rc=13", out  # a failing check, as on every lab host; not a crash (70)
    doc = json.loads(rest)
    assert report.validate(doc) == []
    (gpu_visible,) = [r for r in doc["records"] if r["check"] == "host.gpu_visible"]
    assert gpu_visible["verdict"] == "fail"
    assert "cannot import torch" in gpu_visible["detail"], gpu_visible
