"""The container's environment and the managed-memory switch, seen from every side (issue 36,
item 3): `--env` / `umprov_env` and their rules, the pool's clash with cudaMallocAsync, which
setting a replacement changed, the image that lacks the pool, the switch in deploy's and
status's output; secrets never printed (no Docker, no network)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.fakes import FakeHost
from tests.unit.test_interrupt_aftermath import FakeEngine
from umprov.deploy import options, outcome, rollout
from umprov.deploy import spec as specs
from umprov.errors import ConfigError
from umprov.hosts.render import rows
from umprov.hosts.results import HostOutcome
from umprov.inventory.container_env import env_problem

SECRET = 'hf_s3cret "quoted" value'  # noqa: S105 (a value under test)
ASYNC = "backend:cudaMallocAsync,expandable_segments:True"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def pubkey(tmp_path: Path) -> Path:
    path = tmp_path / "id.pub"
    path.write_text(KEY + "\n")
    return path


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "managed", "message"), [
    ({"1ABC": "x"}, False, "'1ABC' is not a variable name"),
    ({"A-B": "x"}, False, "'A-B' is not a variable name"),
    ({"SSH_AUTHORIZED_KEYS": "x"}, False, "set by umprov's container spec"),
    ({"JUPYTER_TOKEN": "x"}, False, "set by umprov's container spec"),
    ({"UMPROV_MANAGED_MEMORY": "1"}, False, "use --managed-memory or umprov_managed_memory"),
    ({"HF_TOKEN": "a\nb"}, False, "the value of HF_TOKEN holds a line break"),
    ({"FLAG": True}, False, "FLAG is the boolean true: quote the value"),
    ({"NESTED": {"a": 1}}, False, "NESTED must be text, not a dict"),
    ({"PYTORCH_CUDA_ALLOC_CONF": ASYNC}, True,
     f"PYTORCH_CUDA_ALLOC_CONF='{ASYNC}' with managed memory on: the pool needs PyTorch's"),
    ({"PYTORCH_ALLOC_CONF": "backend : cudaMallocAsync"}, True, "PYTORCH_ALLOC_CONF="),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:256"}, True,
     "never split the pool's one large block (drop max_split_size_mb"),
    # the pool's own settings, by the pool's rules (its conf module), pool on or off
    ({"UMPROV_MANAGED_RESERVOIR": "lots"}, False,
     "UMPROV_MANAGED_RESERVOIR='lots' is not a size (bytes, or with k/m/g)"),
    ({"UMPROV_MANAGED_HEADROOM": "-1g"}, True, "UMPROV_MANAGED_HEADROOM='-1g' is not a size"),
    ({"UMPROV_MANAGED_GRADS_DOWN": "off"}, True,
     "UMPROV_MANAGED_GRADS_DOWN='off': expected 0 or 1"),
    ({"UMPROV_MANAGED_HOST_STEP": "yes"}, True,
     "UMPROV_MANAGED_HOST_STEP='yes': expected auto or 0 or 1"),
    ({"UMPROV_MANAGED_HEADRM": "1g"}, True, "UMPROV_MANAGED_HEADRM is not a setting of umprov's "
     "managed-memory pool (did you mean UMPROV_MANAGED_HEADROOM?)"),
])
def test_the_rules_of_the_container_environment(env: dict[str, Any], managed: bool,
                                                message: str) -> None:
    problem = env_problem(env, managed)
    assert problem is not None and message in problem
    assert "a\nb" not in problem


@pytest.mark.parametrize("env", [
    {"HF_HOME": "/workspace/hf", "NCCL_DEBUG": 1, "EMPTY": "", "SPACES": SECRET},
    {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    {"UMPROV_MANAGED_RESERVOIR": "64g", "UMPROV_MANAGED_BUDGET": 1073741824,
     "UMPROV_MANAGED_HEADROOM": "0", "UMPROV_MANAGED_HOST_RESERVE": "4GiB",
     "UMPROV_MANAGED_GRADS_DOWN": "0", "UMPROV_MANAGED_HOST_STEP": "auto",
     "UMPROV_MANAGED_LIBRARY": "/opt/x/libumprov_managed.so"},
])
def test_what_the_pool_runs_with_is_allowed(env: dict[str, Any]) -> None:
    assert env_problem(env, managed=True) is None
    assert env_problem({"PYTORCH_CUDA_ALLOC_CONF": ASYNC}, managed=False) is None


def test_env_options_take_a_value_or_this_shells() -> None:
    environ = {"HF_TOKEN": SECRET}
    got = options.parse_env(["A=1", "B=x=y", "C=", "HF_TOKEN"], environ)
    assert got == {"A": "1", "B": "x=y", "C": "", "HF_TOKEN": SECRET}
    with pytest.raises(ConfigError, match=r"--env NOPE: NOPE is not set in umprov's environ"):
        options.parse_env(["NOPE"], environ)
    with pytest.raises(ConfigError, match="--env gives A twice"):
        options.parse_env(["A=1", "A=2"], environ)


def test_the_command_line_wins_over_the_hosts_umprov_env() -> None:
    host = FakeHost(vars={"umprov_env": {"A": "host", "B": 2}})
    settings = options.settings_for(host, options.DeployOptions(env={"A": "cli"}))
    assert settings.env == {"A": "cli", "B": "2"}
    with pytest.raises(ConfigError, match=r"^gpu1: PYTORCH_CUDA_ALLOC_CONF='backend"):
        options.settings_for(FakeHost(vars={"umprov_env": {"PYTORCH_CUDA_ALLOC_CONF": ASYNC}}),
                             options.DeployOptions(managed_memory=True))
    with pytest.raises(ConfigError, match="gpu1: umprov_env must be a mapping"):
        options.settings_for(FakeHost(vars={"umprov_env": "A=1"}), options.DeployOptions())


# --- the command line: exit 4 before any host, one line, no value ------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--env", "BAD NAME=1"], "umprov: error: --env: 'BAD NAME' is not a variable name"),
    (["--env", "JUPYTER_PORT=1"], "umprov: error: --env: JUPYTER_PORT is set by umprov's container"),
    (["--env", "UMPROV_MANAGED_MEMORY=1"], "use --managed-memory"),
    (["--env", "UMPROV_MANAGED_GRADS_DOWN=false"], "--env: UMPROV_MANAGED_GRADS_DOWN='false'"),
    (["--env", "UMPROV_TEST_UNSET"], "--env UMPROV_TEST_UNSET: UMPROV_TEST_UNSET is not set"),
    (["--env", f"HF_TOKEN={SECRET}\nmore"], "the value of HF_TOKEN holds a line break"),
    (["--managed-memory", "--env", f"PYTORCH_CUDA_ALLOC_CONF={ASYNC}"],
     "--env: PYTORCH_CUDA_ALLOC_CONF='backend:cudaMallocAsync,expandable_segments:True' with"),
])
def test_deploy_refuses_a_bad_env_option_in_one_line(umprov_cli: Any, pubkey: Path,
                                                      tmp_path: Path, args: list[str],
                                                      message: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pubkey), *args)
    assert result.exit_code == 4, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert SECRET not in result.stderr


def test_deploy_refuses_the_pool_asked_for_on_the_command_line_with_a_hosts_async_backend(
    umprov_cli: Any, pubkey: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         "    gpu2: {umprov_env: {PYTORCH_CUDA_ALLOC_CONF: 'backend:cudaMallocAsync'}}\n")
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pubkey),
                        "--managed-memory")
    assert result.exit_code == 4, result.stderr
    assert result.stderr.startswith("umprov: error: gpu2: PYTORCH_CUDA_ALLOC_CONF='backend:cudaMalloc")


# --- the inventory: exit 3 naming the file, the host and the value ----------------------------


@pytest.mark.parametrize(("host_vars", "message"), [
    ("{umprov_managed_memory: true, umprov_env: {PYTORCH_CUDA_ALLOC_CONF: "
     "'backend:cudaMallocAsync'}}",
     "variable 'umprov_env' on host 'gpu2': PYTORCH_CUDA_ALLOC_CONF='backend:cudaMallocAsync' "
     "with managed memory on"),
    ("{umprov_env: {'NO WAY': 1}}", "variable 'umprov_env' on host 'gpu2': 'NO WAY' is not a"),
    ("{umprov_env: {SSH_AUTHORIZED_KEYS: x}}", "SSH_AUTHORIZED_KEYS is set by umprov's"),
    ("{umprov_env: {HF_TOKEN: \"s3cret\\nline\"}}", "the value of HF_TOKEN holds a line break"),
])
def test_inventory_check_refuses_a_bad_umprov_env(umprov_cli: Any, tmp_path: Path,
                                                   host_vars: str, message: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  hosts:\n    gpu1: {{}}\n    gpu2: {host_vars}\n")
    result = umprov_cli("inventory", "check", str(inventory))
    assert result.exit_code == 3, result.stderr
    assert message in result.stderr and f"{inventory}:" in result.stderr
    assert "s3cret" not in result.stderr


def test_inventory_check_never_prints_an_env_value(umprov_cli: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu1: {umprov_managed_memory: true, umprov_env: "
        f"{{HF_TOKEN: '{SECRET}', PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True'}}}}\n")
    result = umprov_cli("inventory", "check", str(inventory), "--json")
    assert result.exit_code == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["vars"]["umprov_env"] == {"HF_TOKEN": "<hidden>",
                                          "PYTORCH_CUDA_ALLOC_CONF": "<hidden>"}
    assert "s3cret" not in result.stdout + result.stderr


# --- the spec: the environment in it, no value in the labels ---------------------------------


def _spec(**kw: Any) -> dict[str, Any]:
    base = options.HostSettings("img:1", "all", 2222, 8888, "127.0.0.1", "umprov")
    return specs.container_spec(replace(base, **kw), "sha256:img", KEY)


def test_the_environment_is_part_of_the_spec_and_no_label_holds_a_value() -> None:
    plain, given = _spec(), _spec(env={"HF_TOKEN": SECRET})
    assert given["environment"]["HF_TOKEN"] == SECRET
    assert specs.spec_hash(plain) != specs.spec_hash(given)
    assert specs.spec_hash(given) != specs.spec_hash(_spec(env={"HF_TOKEN": "other"}))
    labels = specs.labels_for(given, "img:1")
    assert "s3cret" not in json.dumps(labels)
    assert "HF_TOKEN" not in plain["environment"]  # no env given: the spec as before


@pytest.mark.parametrize(("before", "after", "changed"), [
    ({"managed_memory": True}, {}, ["managed memory off"]),
    ({}, {"managed_memory": True}, ["managed memory on"]),
    ({"env": {"A": "1", "B": "1"}}, {"env": {"A": "2", "C": "1"}},
     ["env A changed", "env B removed", "env C added"]),
    ({}, {"ssh_port": 2224, "gpus": "none"}, ["gpus", "ports"]),
])
def test_a_replacement_names_the_settings_that_changed(before: dict[str, Any],
                                                       after: dict[str, Any],
                                                       changed: list[str]) -> None:
    old, new = (specs.labels_for(_spec(**kw), "img:1") for kw in (before, after))
    assert specs.changed_settings(old, new) == changed


def test_a_container_of_an_older_umprov_says_its_parts_are_not_known() -> None:
    new = specs.labels_for(_spec(), "img:1")
    (said,) = specs.changed_settings({specs.HASH_LABEL: "older"}, new)
    assert "older umprov" in said


# --- the roll out: why it replaced, the image without the pool --------------------------------


def _rollout(engine: FakeEngine, opts: options.DeployOptions) -> Any:
    result = outcome.new_outcome("gpu1")
    host = FakeHost()
    rollout.rollout(engine, host, options.settings_for(host, opts), opts, "sha256:img", result)
    return result


def _engine(pool: str | None) -> FakeEngine:
    engine = FakeEngine()
    labels = {"org.umprov.user": "umprov"} | ({specs.POOL_LABEL: pool} if pool else {})
    engine.images = SimpleNamespace(get=lambda _id: SimpleNamespace(labels=labels))
    return engine


OPTS = options.DeployOptions(image="img:1", gpus="none", authorized_keys=KEY)


def test_switching_the_pool_off_says_so() -> None:
    engine = _engine("1")
    first = _rollout(engine, replace(OPTS, managed_memory=True))
    assert first.state == "created" and first.data["changed"] == []
    assert first.data["managed_memory"] is True and first.data["managed_memory_pool"] is True
    assert first.data["warnings"] == []
    engine.all[0].start()
    off = _rollout(engine, OPTS)
    assert off.state == "replaced" and off.data["changed"] == ["managed memory off"]
    assert off.detail == ("replaced: managed memory off; new Jupyter token: "
                          f"`umprov status --connect {off.host}` gives its URL")
    assert off.data["managed_memory"] is False


def test_a_replaced_container_says_its_jupyter_token_changed() -> None:
    """Replacing a container rotates its token: the old URL stops working, and deploy says
    where the new one is; a created or kept container says nothing of it."""
    from umprov.deploy.state import stored_token

    engine = _engine("1")
    first = _rollout(engine, OPTS)
    assert "token" not in first.detail
    old_token = stored_token("gpu1")
    engine.all[0].start()
    again = _rollout(engine, replace(OPTS, force=True))
    assert again.state == "replaced" and stored_token("gpu1") != old_token
    assert "new Jupyter token: `umprov status --connect gpu1` gives its URL" in again.detail


@pytest.mark.parametrize(("pool", "said"), [
    ("0", "was built without it (UMPROV_MANAGED_ALLOCATOR=0)"),
    (None, "does not say it has it (no org.umprov.managed-memory label"),
])
def test_an_image_without_the_pool_is_named_when_the_pool_is_asked_for(pool: str | None,
                                                                       said: str) -> None:
    result = _rollout(_engine(pool), replace(OPTS, managed_memory=True))
    (warning,) = result.data["warnings"]
    assert said in warning and "UMPROV_MANAGED_MEMORY=1 does nothing there" in warning
    assert result.ok and result.data["managed_memory_pool"] is (False if pool else None)
    assert _rollout(_engine(pool), OPTS).data["warnings"] == []  # not asked for: nothing said


def test_deploy_table_shows_the_switch_and_the_warning() -> None:
    from umprov.cli.deploy import COLUMNS

    result = outcome.new_outcome("gpu1")
    result.state, result.detail = "replaced", "replaced: managed memory on"
    result.data.update(managed_memory=True, managed_memory_pool=False,
                       warnings=["managed memory is on, but the image x was built without it"])
    (row,) = rows([result], COLUMNS)
    cells = dict(zip([name for name, _ in COLUMNS], row, strict=True))
    assert cells["managed memory"] == "on (image has no pool)"
    assert cells["message"] == ("replaced: managed memory on; managed memory is on, but the "
                                "image x was built without it")


# --- status --------------------------------------------------------------------------------------


def test_status_shows_whether_the_pool_is_on() -> None:
    from umprov import status
    from umprov.cli.status import COLUMNS

    container = SimpleNamespace(
        labels={specs.POOL_LABEL: "1"},
        attrs={"Config": {"Env": ["PATH=/usr/bin", "UMPROV_MANAGED_MEMORY=1"]}})
    data: dict[str, Any] = {}
    status._managed_memory(container, data)
    assert data == {"managed_memory": True, "managed_memory_pool": True}
    container.attrs = {"Config": {"Env": ["PATH=/usr/bin"]}}
    status._managed_memory(container, data)
    assert data["managed_memory"] is False
    cell = dict(COLUMNS)["managed memory"]
    assert cell(HostOutcome("gpu1", data=data)) == "off"
    assert cell(HostOutcome("gpu1", data={})) == "-"


def test_every_variable_deploy_reads_is_documented_with_its_default() -> None:
    import re

    from tests.conftest import REPO

    source = "".join((REPO / "umprov" / name).read_text()
                     for name in ("deploy/options.py", "deploy/rollout.py", "status.py"))
    read = set(re.findall(r'"(umprov_[a-z_]+)"', source))
    doc = (REPO / "docs" / "deploy-variables.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| `(umprov_[a-z_]+)` \|[^|]+\| \S", doc, re.M)}
    assert read and read <= rows, read - rows
    assert "docs/deploy-variables.md" in (REPO / "README.md").read_text()
