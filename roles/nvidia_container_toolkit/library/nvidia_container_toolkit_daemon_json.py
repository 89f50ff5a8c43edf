#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Merge the nvidia runtime into Docker's daemon.json, keeping every other key."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_container_toolkit_daemon_json
short_description: Merge the nvidia runtime into /etc/docker/daemon.json
description:
  - Reads daemon.json (missing or empty counts as an empty object), merges the given options and
    the runtime into it recursively, and writes it atomically only when the data changes. Keys
    that someone else put there are kept; formatting alone never causes a rewrite.
  - Also asks the running engine (C(docker info)) whether it has loaded the runtime, so that a
    run which wrote the file but never restarted Docker is caught by the next run.
  - Supports check mode and diff mode.
options:
  path:
    description: daemon.json's path.
    type: path
    required: true
  runtime_name:
    description: Name of the runtime in daemon.json's C(runtimes).
    type: str
    required: true
  runtime_path:
    description: Path (or name on PATH) of the runtime binary.
    type: str
    required: true
  set_default:
    description: Also make the runtime Docker's C(default-runtime).
    type: bool
    default: false
  options:
    description: More daemon.json keys, merged recursively before the runtime.
    type: dict
    default: {}
  dockerd_paths:
    description: Where dockerd may be installed; none present means Docker is not installed.
    type: list
    elements: path
    default: [/usr/bin/dockerd, /usr/sbin/dockerd]
  check_engine:
    description: Ask the running engine which runtimes it has loaded.
    type: bool
    default: true
author: umprov contributors (@umprov)
"""

EXAMPLES = r"""
- name: Add the nvidia runtime to Docker's daemon.json, keeping its other keys
  umprov.gpu.nvidia_container_toolkit_daemon_json:
    path: /etc/docker/daemon.json
    runtime_name: nvidia
    runtime_path: nvidia-container-runtime
    set_default: false
  notify: Restart docker
"""

RETURN = r"""
file_changed:
  description: Whether daemon.json was (or in check mode would be) rewritten.
  type: bool
  returned: always
docker_installed:
  description: Whether a dockerd binary was found.
  type: bool
  returned: always
engine_runtime_loaded:
  description: True or false when the engine answered, null when it could not be asked.
  type: bool
  returned: always
daemon:
  description: The merged configuration.
  type: dict
  returned: always
"""

import json
import os
import shutil
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule


def merge(base, extra):
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def render(data):
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def engine_runtimes(timeout=30):
    docker = shutil.which("docker")
    if not docker:
        return None
    try:
        proc = subprocess.run(  # noqa: S603
            [docker, "info", "--format", "{{json .Runtimes}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        runtimes = json.loads(proc.stdout.strip() or "null")
    except ValueError:
        return None
    return runtimes if isinstance(runtimes, dict) else None


def read_existing(module, path):
    """The file's text and its JSON object ("" and {} where there is none); a file that is
    not a JSON object fails the task: it is the admin's to fix, never overwritten."""
    if not os.path.exists(path):
        return "", {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        module.fail_json(msg="%s cannot be read: %s" % (path, exc))
    if not text.strip():
        return text, {}
    try:
        existing = json.loads(text)
    except ValueError as exc:
        module.fail_json(msg="%s is not valid JSON (%s); fix it by hand first." % (path, exc))
    if not isinstance(existing, dict):
        module.fail_json(msg="%s is not a JSON object; fix it by hand first." % path)
    return text, existing


def write_atomic(module, path, text):
    """The file replaced whole (a temporary file beside it, synced, then renamed)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".daemon.json.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        module.fail_json(msg="writing %s failed: %s" % (path, exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            runtime_name=dict(type="str", required=True),
            runtime_path=dict(type="str", required=True),
            set_default=dict(type="bool", default=False),
            options=dict(type="dict", default={}),
            dockerd_paths=dict(
                type="list", elements="path", default=["/usr/bin/dockerd", "/usr/sbin/dockerd"]
            ),
            check_engine=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    before_text, existing = read_existing(module, path)
    wanted = merge(existing, p["options"])
    wanted = merge(
        wanted, {"runtimes": {p["runtime_name"]: {"path": p["runtime_path"], "args": []}}}
    )
    if p["set_default"]:
        wanted["default-runtime"] = p["runtime_name"]
    file_changed = wanted != existing or not os.path.exists(path)
    after_text = render(wanted)

    if file_changed and not module.check_mode:
        write_atomic(module, path, after_text)

    docker_installed = any(os.path.exists(d) for d in p["dockerd_paths"])
    loaded = None
    if p["check_engine"] and docker_installed:
        runtimes = engine_runtimes()
        if runtimes is not None:
            loaded = p["runtime_name"] in runtimes

    result = dict(
        changed=file_changed,
        file_changed=file_changed,
        docker_installed=docker_installed,
        engine_runtime_loaded=loaded,
        daemon=wanted,
    )
    if module._diff and file_changed:
        result["diff"] = {
            "before": before_text,
            "after": after_text,
            "before_header": path,
            "after_header": path,
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
