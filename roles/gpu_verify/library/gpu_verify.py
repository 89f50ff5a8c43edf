#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Run umprov's verifier agent on a GPU host, in a container or with the host's Python."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_verify
short_description: Run umprov's GPU verifier agent and return its report
description:
  - Runs the verifier agent (the zipapp C(umprov verify) runs) on the target, inside a running
    container through the docker CLI (the container C(umprov deploy) made, by default), or with
    a Python of the host's own when I(container) is empty.
  - Returns the agent's host report (schema C(umprov.verify.host)), its verdict, and the checks
    that failed or warned. It never fails for a verdict; the calling role decides (the
    C(gpu_verify) role fails the host on a failing check).
  - Changes nothing on the host but a temporary folder that it removes; every process of the
    run is ended on the way out, also after a timeout. Not run in check mode.
version_added: "0.1.0"
author: umprov contributors (@umprov)
options:
  agent:
    description:
      - Path on the target of the agent zipapp (C(agent.pyz)). The C(umprov.gpu.gpu_agent) role
        finds it on the controller (the collection ships it in that role's C(files/)) and the
        C(umprov.gpu.gpu_verify) role copies it here before it calls this module; used alone,
        copy it first (see EXAMPLES).
    type: path
    required: true
  container:
    description:
      - Name or ID of a running container to run the agent in; its image needs Python and
        torch. Empty runs the agent on the host with I(python).
    type: str
    default: umprov
  python:
    description: The host's Python that runs the agent when I(container) is empty.
    type: path
    default: /usr/bin/python3
  args:
    description:
      - Options for the agent, as C(umprov verify) passes them, each word an element.
      - C(--quick) runs the fast subset (seconds); C(--passive) only reads (GPU count, driver,
        ECC and row remapping, clock slowdowns, Xids, NVLink links; no torch, safe beside a
        running job).
      - C(--expected-gpus N) fails with fewer GPUs than N; C(--profile NAME) uses this GPU
        profile instead of detecting one; C(--profile-file F) reads profile overrides (JSON or
        YAML) from F, a path where the agent runs (in the container when I(container) is set).
      - C(--timeout S) gives each check S seconds (default 120; keep I(timeout) above about
        three times it); C(--duration T) loads every GPU at once for T (V(90s), V(10m), V(1h))
        after the checks (burn-in); C(--exclusive) fails, not warns, when another process uses
        a GPU.
      - The module passes C(--quiet) and C(--json) itself.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds the whole run may take before it is ended and reported as a failure.
    type: int
    default: 900
  docker:
    description: The docker command on the target.
    type: path
    default: docker
  host:
    description:
      - The name the report gives the host (the inventory's, as C(umprov verify) does); the
        name the agent saw (the container's hostname) is kept in its facts. Empty keeps it.
    type: str
    default: ""
notes:
  - The verdicts, checks and hints are those of C(umprov verify); see C(docs/verify-checks.md)
    (in the collection and in umprov's repository).
"""

EXAMPLES = r"""
- name: Find the agent on the controller (sets gpu_agent_path)
  ansible.builtin.include_role:
    name: umprov.gpu.gpu_agent

- name: Copy the agent to the host
  ansible.builtin.copy:
    src: "{{ gpu_agent_path }}"
    dest: /var/tmp/umprov/agent.pyz
    mode: "0644"

- name: Verify the GPUs in the deployed container
  umprov.gpu.gpu_verify:
    agent: /var/tmp/umprov/agent.pyz
    args: [--quick, --expected-gpus, "8"]
  register: verify

- name: Verify with the host's own Python and torch
  umprov.gpu.gpu_verify:
    agent: /var/tmp/umprov/agent.pyz
    container: ""
    python: /opt/torch/bin/python3
"""

RETURN = r"""
report:
  description: The agent's host report (schema umprov.verify.host), as umprov verify keeps it.
  returned: always
  type: dict
verdict:
  description: The host's verdict, C(pass), C(warn) or C(fail).
  returned: always
  type: str
  sample: fail
failed_checks:
  description: The failing checks, one line each (the check, its target, the detail, the hint).
  returned: always
  type: list
  elements: str
  sample: ["gpu.count on host: no NVIDIA GPU visible (hint: driver)"]
warned_checks:
  description: The checks that warned, in the same form.
  returned: always
  type: list
  elements: str
exit_code:
  description:
    - The agent's exit code (0 pass, 12 warn, 13 fail); null when it was ended. Not named C(rc),
      which Ansible would take for a failed task.
  returned: always
  type: int
"""

import json
import os
import secrets
import shlex

from ansible.module_utils.basic import AnsibleModule

RUN_MARK = "UMPROV_VERIFY_RUN"
AGENT_NAME = "agent.pyz"
MISSING_AGENT = (
    "no verifier agent at %s on this host: the umprov.gpu.gpu_agent role finds it on the "
    "controller (the collection ships it) and the umprov.gpu.gpu_verify role copies it here; "
    "run that role, or copy the gpu_agent role's files/agent.pyz to this path first"
)


def run_script(run_id, workdir, python, args, timeout):
    """Shell that runs the agent in ``workdir`` under ``timeout`` with every process marked."""
    interpreter = (
        'PY=$(command -v python3 || command -v python) || { echo "no python"; exit 98; }; '
        if python is None else "PY=%s; " % shlex.quote(python)
    )
    return (
        "export %s=%s TMPDIR=%s; cd %s || exit 97; %s"
        "T=''; command -v timeout >/dev/null 2>&1 && T='timeout -k 10 %d'; "
        '$T "$PY" %s --quiet --json report.json %s'
        % (RUN_MARK, run_id, workdir, workdir, interpreter, timeout, AGENT_NAME,
           " ".join(shlex.quote(a) for a in args))
    )


def end_script(run_id, workdir):
    """Shell that kills every process of the run (they carry its mark) and removes its folder."""
    return (
        "pids=$(grep -lsz -e '^%s=%s$' /proc/[0-9]*/environ | cut -d/ -f3); "
        '[ -n "$pids" ] && kill -9 $pids 2>/dev/null; rm -rf %s; true'
        % (RUN_MARK, run_id, workdir)
    )


def summarize(report):
    """(verdict, failed checks, warned checks) of a host report."""
    lines = {"fail": [], "warn": []}
    for rec in report.get("records") or []:
        verdict = rec.get("verdict")
        if verdict in lines:
            hint = " (hint: %s)" % rec["hint"] if rec.get("hint") else ""
            what = (rec.get("check"), rec.get("target"), rec.get("detail") or verdict, hint)
            lines[verdict].append("%s on %s: %s%s" % what)
    return report.get("verdict", "fail"), lines["fail"], lines["warn"]


class Runner:
    """Where the agent runs: a container (docker exec) or the host (a shell)."""

    def __init__(self, module):
        self.module = module
        self.container = module.params["container"]
        self.docker = module.params["docker"]

    def sh(self, script, timeout=None):
        argv = ([self.docker, "exec", self.container, "sh", "-c", script] if self.container
                else ["sh", "-c", script])
        if timeout:
            argv = ["timeout", "-k", "10", str(timeout)] + argv
        return self.module.run_command(argv)

    def put(self, source, workdir):
        if self.container:
            return self.module.run_command(
                [self.docker, "cp", source, "%s:%s/%s" % (self.container, workdir, AGENT_NAME)])
        return self.module.run_command(["cp", source, "%s/%s" % (workdir, AGENT_NAME)])


def verify(module):
    params = module.params
    if not os.path.isfile(params["agent"]):
        module.fail_json(msg=MISSING_AGENT % params["agent"])
    runner = Runner(module)
    run_id = secrets.token_hex(4)
    workdir = "/tmp/umprov-verify-%s" % run_id  # noqa: S108 (the target's, removed after)
    rc, _out, err = runner.sh("mkdir -p -m 0700 %s" % workdir)
    if rc != 0:
        module.fail_json(msg="cannot make %s%s: %s" % (
            workdir, " in container " + runner.container if runner.container else "",
            err.strip() or _out.strip()))
    try:
        rc, out, err = runner.put(params["agent"], workdir)
        if rc != 0:
            module.fail_json(msg="cannot copy the agent: %s" % (err.strip() or out.strip()))
        python = None if runner.container else params["python"]
        script = run_script(run_id, workdir, python, params["args"], params["timeout"])
        rc, out, err = runner.sh(script, timeout=params["timeout"] + 30)
        if rc == 98:
            module.fail_json(msg="no python3 or python in container %s" % runner.container)
        read_rc, text, _err = runner.sh("cat %s/report.json" % workdir)
        if read_rc != 0:
            tail = " | ".join((out + err).strip().splitlines()[-3:])
            module.fail_json(msg="the agent exited with code %s and wrote no report: %s"
                             % (rc, tail[:300]), exit_code=rc)
    finally:
        runner.sh(end_script(run_id, workdir))
    try:
        report = json.loads(text)
    except ValueError as exc:
        module.fail_json(msg="the agent's report is not JSON: %s" % exc, exit_code=rc)
    if params["host"]:
        report.setdefault("facts", {})["container_hostname"] = report.get("host")
        report["host"] = params["host"]
    verdict, failed, warned = summarize(report)
    module.exit_json(changed=False, report=report, verdict=verdict, failed_checks=failed,
                     warned_checks=warned, exit_code=rc if rc in (0, 12, 13) else None)


def main():
    module = AnsibleModule(
        argument_spec={
            "agent": {"type": "path", "required": True},
            "container": {"type": "str", "default": "umprov"},
            "python": {"type": "path", "default": "/usr/bin/python3"},
            "args": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 900},
            "docker": {"type": "path", "default": "docker"},
            "host": {"type": "str", "default": ""},
        },
        supports_check_mode=False,
    )
    if module.params["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds, not %s"
                         % module.params["timeout"])
    verify(module)


if __name__ == "__main__":
    main()
