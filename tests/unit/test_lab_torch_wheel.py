"""The CPU torch wheel of the lab image, found as a user expects (named, on disk, PyTorch's CPU
index), and the image built without torch where none can be had: `make demo` on any Debian 12
machine. No image is built here: the docker client is faked at umprov.image.build's seam, and
pip is faked where it would reach the network."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from umprov.errors import ExitCode
from umprov_lab import torch_wheel
from umprov_lab.arch import host_arch

MACHINE = host_arch().machine
CPU = "+cpu" if MACHINE == "x86_64" else ""  # aarch64's plain wheels are the CPU builds
LAB = torch_wheel.Target()  # the lab base: Python 3.11, glibc 2.36


def wheel_name(version: str = "2.13.0", python: str = "cp311", platform: str = "") -> str:
    platform = platform or f"manylinux_2_28_{MACHINE}"
    return f"torch-{version}{CPU}-{python}-{python}-{platform}.whl"


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """No wheel anywhere: no setting, an empty /opt/wheels and .lab/wheels, and a pip whose
    download from PyTorch's index fails as it does where the index cannot be reached."""
    opt = tmp_path / "opt-wheels"
    opt.mkdir()
    monkeypatch.delenv(torch_wheel.ENV, raising=False)
    monkeypatch.setattr(torch_wheel, "LOCAL_DIRS", (opt,))
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path / "project"))
    pip_calls: list[list[str]] = []
    state = SimpleNamespace(opt=opt, pip_calls=pip_calls, pip_writes=None)

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        pip_calls.append(cmd)
        if state.pip_writes:
            dest = Path(cmd[cmd.index("--dest") + 1])
            (dest / state.pip_writes).write_bytes(b"wheel")
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 1, "", (
            "WARNING: Retrying ... Failed to establish a new connection\n"
            "ERROR: Could not find a version that satisfies the requirement torch\n"))

    monkeypatch.setattr(torch_wheel, "run_pip", run)
    return state


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """What `umprov lab image` asks umprov's image builder for; nothing is built."""
    from umprov import image
    from umprov_lab import engine, host_image

    monkeypatch.setattr(engine, "docker_engine", lambda *a, **k: "client")
    monkeypatch.setattr(host_image, "ensure_host_image", lambda client, progress: ("base:1", False))
    asked: list[dict[str, Any]] = []

    def build(client: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return image.BuildResult(kwargs["tag"], "sha256:" + "0" * 64, kwargs["base"], 1, 1.0,
                                 tmp_path, 3)

    monkeypatch.setattr(image, "build", build)
    return asked


@pytest.mark.parametrize("setting", ["none", ""])
def test_a_wheel_setting_pointing_at_nothing_builds_the_image_without_torch(
    umprov_cli: Any, nowhere: SimpleNamespace, builds: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch, setting: str,
) -> None:
    (nowhere.opt / wheel_name()).write_bytes(b"wheel")  # not looked for: the setting says none
    monkeypatch.setenv(torch_wheel.ENV, setting)
    result = umprov_cli("lab", "image", "--json")
    assert result.exit_code == 0, result.stderr
    assert builds[0]["torch_wheel"] is None
    assert "WITHOUT torch" in result.stderr and "no torch" in result.stderr
    assert json.loads(result.stdout)["tag"].endswith("-lab")
    assert nowhere.pip_calls == []


def test_without_any_wheel_the_image_is_built_without_torch(
    umprov_cli: Any, nowhere: SimpleNamespace, builds: list[dict[str, Any]]
) -> None:
    result = umprov_cli("lab", "image")
    assert result.exit_code == 0, result.stderr
    assert builds[0]["torch_wheel"] is None
    (pip,) = nowhere.pip_calls
    assert pip[pip.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "--no-deps" in pip and pip[pip.index("--retries") + 1] == "0"
    assert "PyTorch's index gave no wheel: ERROR: Could not find a version" in result.stderr
    assert "WITHOUT torch" in result.stderr


def test_a_wheel_from_pytorchs_index_is_kept_for_the_next_build(
    nowhere: SimpleNamespace, tmp_path: Path
) -> None:
    nowhere.pip_writes = wheel_name("2.9.1")
    found = torch_wheel.find()
    assert found == tmp_path / "project" / ".lab" / "wheels" / wheel_name("2.9.1")
    nowhere.pip_writes = None
    assert torch_wheel.find() == found and len(nowhere.pip_calls) == 1  # on disk now


def test_a_wheel_on_disk_is_the_newest_that_fits_the_lab_python(nowhere: SimpleNamespace) -> None:
    for name in (wheel_name("2.9.0"), wheel_name("2.13.0"), wheel_name("2.14.0", "cp312"),
                 wheel_name("2.15.0", platform=f"manylinux_2_39_{MACHINE}"),
                 "torch-2.16.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.0.whl"):
        (nowhere.opt / name).write_bytes(b"wheel")
    assert torch_wheel.find() == nowhere.opt / wheel_name("2.13.0")
    assert nowhere.pip_calls == []


@pytest.mark.parametrize(("name", "fits"), [
    (wheel_name(), True),
    (wheel_name(platform=f"manylinux2014_{MACHINE}"), True),
    (wheel_name(platform=f"manylinux_2_36_{MACHINE}"), True),
    (wheel_name(platform=f"manylinux_2_37_{MACHINE}"), False),  # newer than Debian 12's glibc
    (wheel_name(python="cp312"), False),
    (wheel_name(platform="manylinux_2_28_riscv64"), False),
    ("torch-2.13.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl", False),  # a CUDA build
])
def test_which_wheels_fit_the_lab_image(name: str, fits: bool) -> None:
    assert torch_wheel.fits(name, LAB, MACHINE) is fits


def test_a_named_wheel_that_is_not_there_is_an_error_not_a_fallback(
    umprov_cli: Any, nowhere: SimpleNamespace, builds: list[dict[str, Any]], tmp_path: Path
) -> None:
    missing = tmp_path / "torch-typo.whl"
    result = umprov_cli("lab", "image", "--torch-wheel", str(missing))
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert f"torch wheel not found: {missing}" in result.stderr
    assert builds == [] and nowhere.pip_calls == []
    folder = tmp_path / "empty"
    folder.mkdir()
    result = umprov_cli("lab", "image", "--torch-wheel", str(folder))
    assert result.exit_code == ExitCode.ENVIRONMENT and "no CPU torch wheel" in result.stderr


def test_the_venv_step_installs_the_wheel_for_its_own_python(
    nowhere: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert torch_wheel._main() == 1  # noqa: SLF001 - the module's command line, as make runs it
    assert "no CPU torch wheel for Python" in capsys.readouterr().err
    mine = nowhere.opt / wheel_name(python=here, platform=f"manylinux2014_{MACHINE}")
    mine.write_bytes(b"wheel")
    assert torch_wheel._main() == 0  # noqa: SLF001
    assert capsys.readouterr().out.strip() == str(mine)


def test_umprov_builds_a_context_without_torch_when_given_no_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """umprov.image.build(torch_wheel=None) on a base without torch: no torch requirement, and
    the image's install script checks torch only where there is one."""
    from docker.errors import ImageNotFound

    from umprov import image

    reqs: list[list[str]] = []

    def download(dest: Path, wanted: list[str], target: Any, **_: Any) -> int:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "requirements.txt").write_text("\n".join(wanted) + "\n")
        reqs.append(wanted)
        return len(wanted)

    def get(ref: str) -> Any:
        if ref == "base:1":
            raise ImageNotFound(ref)
        return SimpleNamespace(id="sha256:" + "1" * 64, attrs={"Size": 10})

    client = SimpleNamespace(images=SimpleNamespace(get=get), api=SimpleNamespace(
        build=lambda **kw: iter([{"stream": "Step 1/2 : FROM base:1"}, {"stream": "done"}])))
    monkeypatch.setattr(image, "download_wheels", download)
    context = tmp_path / "context"  # not the checkout's docker/pytorch-cuda/context
    prepare = image.prepare_context
    monkeypatch.setattr(image, "prepare_context",
                        lambda target, **kw: prepare(target, context=context, **kw))
    result = image.build(client, base="base:1", tag="t:1", torch_wheel=None)
    assert result.image_id.startswith("sha256:1")
    assert reqs == [list(image.PACKAGES)] and not any(r.startswith("torch") for r in reqs[0])
    script = (context / "install-python-packages.sh").read_text()
    assert "grep -q '^torch==' \"$wheels/requirements.txt\"" in script
    assert "NO torch in this image" in script
