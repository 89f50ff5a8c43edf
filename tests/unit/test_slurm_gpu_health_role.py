"""The slurm_gpu_health role's own logic, rendered by Ansible's templar from the role's files:
the health check program (run, with a stand-in Python that records what the agent was given),
the slurm.conf block and the check for settings made outside it."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import fakebin
from tests.unit import templating
from tests.unit.templating import render

ROLE = Path(__file__).resolve().parents[2] / "roles" / "slurm_gpu_health"


def role_vars(**overrides: Any) -> dict[str, Any]:
    return templating.role_vars("slurm_gpu_health", **overrides)


@pytest.fixture
def program(tmp_path):
    """Write the health check program for some variables; run it, as slurmd would, by a name.
    Returns (exit code, the agent's arguments)."""
    python = fakebin.shell(tmp_path, "python3", 'printf \'%s\\n\' "$@" > "$(dirname "$0")/argv"\n'
                                                'exit "${AGENT_RC:-0}"\n')

    def run(variables: dict[str, Any], *args: str, name: str = "umprov-gpu-health",
            agent_rc: int = 0) -> tuple[int, list[str]]:
        text = render((ROLE / "templates" / "umprov-gpu-health.j2").read_text(),
                      role_vars(slurm_gpu_health_python=str(python), **variables))
        script = fakebin.program(tmp_path / name, text)
        proc = subprocess.run([str(script), *args], env={"AGENT_RC": str(agent_rc),
                                                         "PATH": "/usr/bin:/bin"}, timeout=10)
        return proc.returncode, (tmp_path / "argv").read_text().splitlines()

    return run


def test_slurm_runs_the_health_check_active_when_idle_by_default(program):
    rc, argv = program({"umprov_expected_gpus": 8})
    assert rc == 0
    assert argv == ["/opt/umprov/agent.pyz", "--scheduler", "slurm", "--expected-gpus", "8",
                    "--slurm-health", "--active-when-idle", "--quick"]


def test_with_active_checks_elsewhere_the_health_check_stays_passive(program):
    _, argv = program({"slurm_gpu_health_active": "epilog"})
    assert argv[-2:] == ["--slurm-health", "--passive"]


def test_as_epilog_the_active_checks_run_and_slurm_is_never_told_to_drain(program):
    variables = {"slurm_gpu_health_active": "epilog", "slurm_gpu_health_active_quick": False,
                 "slurm_gpu_health_container": "umprov"}
    rc, argv = program(variables, name="umprov-gpu-health-epilog", agent_rc=13)
    assert rc == 0  # the agent drained the node with its own reason
    assert argv == ["/opt/umprov/agent.pyz", "--scheduler", "slurm", "--container", "umprov",
                    "--slurm-health"]


@pytest.mark.parametrize(("agent_rc", "rc"), [(13, 1), (12, 0), (0, 0)])
def test_as_prolog_a_failing_check_stops_the_job(program, agent_rc, rc):
    got, _ = program({"slurm_gpu_health_active": "prolog"}, name="umprov-gpu-health-prolog",
                     agent_rc=agent_rc)
    assert got == rc


def test_arguments_go_to_the_agent_and_hook_commands_arrive_whole(program):
    hooks = {"slurm_gpu_health_scheduler": "hooks",
             "slurm_gpu_health_drain_command": "k8s-cordon \"$UMPROV_NODE\" 'x y'"}
    rc, argv = program(hooks, "--slurm-gate", "--passive", agent_rc=13)
    assert rc == 13
    assert argv == ["/opt/umprov/agent.pyz", "--scheduler", "hooks", "--drain-command",
                    "k8s-cordon \"$UMPROV_NODE\" 'x y'", "--slurm-gate", "--passive"]


# -- slurm.conf
def conf_vars(text: str, **overrides: Any) -> dict[str, Any]:
    content = base64.b64encode(text.encode()).decode()
    return role_vars(__slurm_gpu_health_conf={"content": content}, **overrides)


BLOCK = ("# BEGIN umprov slurm_gpu_health (Ansible)\nHealthCheckProgram=/usr/local/sbin/"
         "umprov-gpu-health\nHealthCheckInterval=300\n# END umprov slurm_gpu_health (Ansible)\n")


@pytest.mark.parametrize(("text", "active", "clash"), [
    ("ClusterName=lab\n" + BLOCK, "idle", []),  # its own block is not a clash
    ("ClusterName=lab\n#HealthCheckProgram=/usr/sbin/nhc\n", "idle", []),  # a comment
    ("ClusterName=lab\nhealthcheckprogram = /usr/sbin/nhc\n", "idle", ["healthcheckprogram"]),
    ("Epilog=/etc/slurm/epilog.sh\n" + BLOCK, "idle", []),  # not set by the role with idle
    ("Epilog=/etc/slurm/epilog.sh\n" + BLOCK, "epilog", ["Epilog"]),
])
def test_settings_made_outside_the_block_are_found(text, active, clash):
    variables = conf_vars(text, slurm_gpu_health_active=active)
    assert render("{{ __slurm_gpu_health_conf_clash }}", variables) == clash


def test_the_block_names_the_program_and_the_epilog_link():
    tasks = yaml.safe_load((ROLE / "tasks" / "slurm-conf.yml").read_text())
    (write,) = [t for t in tasks if "ansible.builtin.blockinfile" in t]
    variables = role_vars(slurm_gpu_health_active="epilog", slurm_gpu_health_interval=60)
    block = render(write["ansible.builtin.blockinfile"]["block"], variables)
    assert block.splitlines() == ["HealthCheckProgram=/usr/local/sbin/umprov-gpu-health",
                                  "HealthCheckInterval=60", "HealthCheckNodeState=ANY",
                                  "Epilog=/usr/local/sbin/umprov-gpu-health-epilog"]
    idle = render(write["ansible.builtin.blockinfile"]["block"], role_vars())
    assert "Epilog" not in idle and "Prolog" not in idle


def test_the_agent_is_the_one_gpu_agent_found():
    assert render("{{ __slurm_gpu_health_agent_path }}",
                  role_vars(gpu_agent_path="/tmp/a.pyz")) == "/tmp/a.pyz"
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (find,) = [t for t in tasks if "ansible.builtin.include_role" in t]
    assert find["ansible.builtin.include_role"]["name"] == "gpu_agent"
    assert find["vars"]["gpu_agent_src"] == "{{ slurm_gpu_health_agent_src }}"
