"""The gpu_verify and gpu_agent roles (playbooks/verify.yml): the agent found or built on the
controller, the agent's options from the role's variables, the verdict that fails a host, and
the gpu_verify module's own argument handling and run (the real agent, on this machine's
Python, which has no GPU)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import fakebin
from tests.unit.templating import ROLES, render, role_vars

MODULE = ROLES / "gpu_verify" / "library" / "gpu_verify.py"


def verify_vars(**overrides: Any) -> dict[str, Any]:
    return role_vars("gpu_verify", **overrides)


def test_gpu_agent_prefers_the_given_then_the_shipped_then_the_built_agent():
    tasks = yaml.safe_load((ROLES / "gpu_agent" / "tasks" / "main.yml").read_text())
    (name,) = [t for t in tasks if "ansible.builtin.set_fact" in t]
    expr = name["ansible.builtin.set_fact"]["gpu_agent_path"]
    built = {"stdout_lines": ["/root/.local/state/umprov/agent/agent-0123.pyz"]}
    given = dict(gpu_agent_src="/tmp/a.pyz", __gpu_agent_shipped="/c/files/agent.pyz")
    assert render(expr, {**given, "__gpu_agent_built": built}) == "/tmp/a.pyz"
    shipped = dict(gpu_agent_src="", __gpu_agent_shipped="/c/files/agent.pyz")
    assert render(expr, {**shipped, "__gpu_agent_built": {"skipped": True}}) == "/c/files/agent.pyz"
    assert render(expr, {"gpu_agent_src": "", "__gpu_agent_shipped": "",
                         "__gpu_agent_built": built}).endswith("agent-0123.pyz")


def test_a_checkout_ships_no_agent_so_gpu_agent_builds_one():
    variables = role_vars("gpu_agent")
    assert render("{{ __gpu_agent_shipped }}", variables) == ""


def test_the_build_command_gives_the_zipapp_path(tmp_path):
    """The controller-side build gpu_agent runs when given no agent: its own command line."""
    tasks = yaml.safe_load((ROLES / "gpu_agent" / "tasks" / "main.yml").read_text())
    (build,) = [t for t in tasks if t["name"].startswith("Build the verifier agent")]
    argv = build["ansible.builtin.command"]["argv"]
    proc = subprocess.run([sys.executable, *argv[1:3], str(ROLES.parent)], capture_output=True,
                          text=True, timeout=60,
                          env={"UMPROV_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and path.suffix == ".pyz" and path.is_file()
    assert json.loads(subprocess.run([sys.executable, str(path), "--list-profiles"],
                                     capture_output=True, text=True, timeout=60).stdout)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, ["--timeout", "120"]),
    ({"gpu_verify_mode": "quick", "gpu_verify_exclusive": True},
     ["--timeout", "120", "--quick", "--exclusive"]),
    ({"gpu_verify_mode": "passive", "umprov_expected_gpus": 8, "umprov_gpu_profile": "h200",
      "gpu_verify_extra_args": ["--duration", "60"]},
     ["--timeout", "120", "--passive", "--expected-gpus", "8", "--profile", "h200",
      "--duration", "60"]),
])
def test_the_agent_options_follow_the_variables(overrides, expected):
    assert render("{{ __gpu_verify_args }}", verify_vars(**overrides)) == expected


@pytest.mark.parametrize(("verdict", "fail_on_warn", "failed"), [
    ("pass", False, False), ("warn", False, False), ("warn", True, True), ("fail", False, True),
])
def test_a_failing_check_fails_the_host_and_a_warning_only_when_asked(verdict, fail_on_warn,
                                                                     failed):
    variables = verify_vars(gpu_verify_fail_on_warn=fail_on_warn,
                            __gpu_verify_run={"verdict": verdict})
    assert render("{{ __gpu_verify_failed | bool }}", variables) is failed


def test_the_reports_go_to_umprovs_inbox_in_its_state_folder(monkeypatch):
    monkeypatch.setenv("UMPROV_STATE_DIR", "/srv/umprov-state")
    assert render("{{ gpu_verify_report_dir }}", verify_vars()) == "/srv/umprov-state/verify-inbox"
    monkeypatch.delenv("UMPROV_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", "/home/u/.state")
    assert render("{{ gpu_verify_report_dir }}", verify_vars()) == "/home/u/.state/umprov/verify-inbox"


def run_module(tmp_path: Path, **args: Any) -> dict:
    """The module run as Ansible runs it (its arguments in a JSON file), its JSON result."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True,
                          text=True, timeout=300)
    return json.loads(proc.stdout)


def test_the_module_requires_an_agent_and_a_positive_timeout(tmp_path):
    assert "agent" in run_module(tmp_path)["msg"]
    result = run_module(tmp_path, agent="/x/agent.pyz", timeout=0)
    assert result["failed"] and "timeout must be a positive" in result["msg"]
    result = run_module(tmp_path, agent="/x/agent.pyz", mode="fast")
    assert result["failed"] and "mode" in result["msg"]


def test_a_missing_container_is_named(tmp_path):
    docker = fakebin.shell(tmp_path, "docker",
                           'echo "Error response from daemon: No such container: $2" >&2\nexit 1\n')
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(b"")
    result = run_module(tmp_path, agent=str(agent), container="gone", docker=str(docker))
    assert result["failed"] and "No such container: gone" in result["msg"]


def test_a_missing_agent_names_the_role_that_delivers_it(tmp_path):
    result = run_module(tmp_path, agent=str(tmp_path / "agent.pyz"), container="")
    assert result["failed"] and "lstat" not in result["msg"]
    assert result["msg"].startswith(f"no verifier agent at {tmp_path / 'agent.pyz'} on this host")
    assert "umprov.gpu.gpu_agent role" in result["msg"]


def test_the_module_docs_list_the_agent_options_for_a_check_run(capsys):
    """The options of the agent's --help before its scheduler's, less the two the module
    passes itself, are each named in the docs of the module's args."""
    from umprov.verify.agent.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    options = set(re.findall(r"^  (--[\w-]+)", capsys.readouterr().out.split("scheduler:")[0],
                             re.M)) - {"--help", "--json", "--quiet", "--list-profiles"}
    docs = yaml.safe_load(MODULE.read_text().split('DOCUMENTATION = r"""')[1].split('"""')[0])
    described = " ".join(docs["options"]["args"]["description"])
    assert len(options) >= 8 and all(f"C({o}" in described for o in options), options


def test_the_agent_on_a_host_without_gpus_reports_a_failing_check(tmp_path):
    """The real agent (the zipapp umprov verify runs) with this machine's Python: no GPU is a
    failing check, named, never a pass; the report is the agent's own, under the given name."""
    from umprov.verify.bundle import agent_zipapp

    agent = agent_zipapp(cache=tmp_path / "cache")
    result = run_module(tmp_path, agent=str(agent), container="", python=sys.executable,
                        args=["--passive"], host="gpu07", timeout=120)
    assert not result.get("failed"), result
    assert result["verdict"] == "fail" and result["exit_code"] == 13
    assert result["report"]["schema"] == "umprov.verify.host"
    assert result["report"]["host"] == "gpu07"
    assert result["failed_checks"] and all(" on " in line for line in result["failed_checks"])


CONTAINER_MODULE = ROLES / "pytorch_container" / "library" / "pytorch_container.py"


def run_container_module(tmp_path: Path, **args: Any) -> dict:
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {"UMPROV_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(CONTAINER_MODULE), str(args_file)],
                          capture_output=True, text=True, timeout=120, env=env)
    return json.loads(proc.stdout)


def test_the_deploy_module_checks_its_values_with_umprovs_rules_before_any_host(tmp_path):
    """pytorch_container is umprov's deploy: a bad image or a missing key is refused with
    umprov's own message, and no host (192.0.2.1, TEST-NET) is contacted."""
    base = {"host": "gpu01", "address": "192.0.2.1"}
    result = run_container_module(tmp_path, **base, delivery="ship")
    assert result["failed"] and "delivery" in result["msg"]
    key = tmp_path / "id.pub"
    key.write_text("not a key\n")
    result = run_container_module(tmp_path, **base, authorized_key=str(key))
    assert result["failed"] and "id.pub" in result["msg"], result
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHZuZ3R0ZXN0a2V5bm90cmVhbHJlYWxseQ us\n")
    result = run_container_module(tmp_path, **base, authorized_key=str(key),
                                  image="Not An Image!")
    assert result["failed"] and "Not An Image!" in result["msg"], result
    result = run_container_module(tmp_path, **base, authorized_key=str(key),
                                  variables={"umprov_ssh_port": 70000})
    assert result["failed"] and "umprov_ssh_port" in result["msg"], result
