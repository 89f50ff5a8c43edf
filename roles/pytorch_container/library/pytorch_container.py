#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Deploy umprov's PyTorch container on a host through umprov's own deploy library."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pytorch_container
short_description: Run the PyTorch-CUDA container with SSH and Jupyter, as umprov deploy does
description:
  - Deploys the container on one host with umprov's deploy library, the one C(umprov deploy)
    uses; the same container spec and hash (a re-run of the same spec changes nothing, a changed
    spec replaces the container), the same verified SSH host keys (no unknown host is
    trusted), the same Jupyter token and container key handling in umprov's state folder on the
    controller. Not a second Docker client.
  - Runs on the controller (a task delegated to localhost) with a Python that has the umprov
    package (the one that runs ansible-playbook, when umprov was installed with pipx).
  - The host's own settings (C(umprov_gpus), C(umprov_ssh_port), C(umprov_jupyter_port),
    C(umprov_bind), C(umprov_container_name), C(umprov_image), C(umprov_container_limits),
    C(umprov_managed_memory), C(umprov_env); docs/deploy-variables.md) come in I(variables), as
    umprov reads them from the inventory.
  - Not run in check mode.
version_added: "0.1.0"
author: umprov contributors (@umprov)
requirements:
  - the umprov Python package on the controller
options:
  host:
    description: The host's inventory name.
    type: str
    required: true
  address:
    description: The address SSH reaches the host at (C(ansible_host)).
    type: str
    required: true
  port:
    description: The host's SSH port.
    type: int
    default: 22
  user:
    description: The SSH user on the host (one in the docker group, or root).
    type: str
  private_key:
    description: The SSH private key file for the host.
    type: path
  known_hosts:
    description: A known_hosts file holding the host's key, besides umprov's own trust store.
    type: path
  variables:
    description: The host's C(umprov_*) inventory variables.
    type: dict
    default: {}
  image:
    description:
      - The image; empty uses the host's C(umprov_image), else the tag C(umprov image build)
        gives.
    type: str
    default: ""
  delivery:
    description:
      - How the image reaches the host; C(push) streams it from the controller's Docker engine
        over SSH, C(pull) has the host's engine pull it, C(none) expects it there.
    type: str
    choices: [none, pull, push]
    default: none
  authorized_key:
    description:
      - The public key allowed to log in to the container; empty uses the controller user's
        own.
    type: path
  force:
    description: Replace the container even when its spec is unchanged.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Deploy the container, the image pushed from the controller
  umprov.gpu.pytorch_container:
    host: "{{ inventory_hostname }}"
    address: "{{ ansible_host }}"
    user: "{{ ansible_user }}"
    image: umprov/pytorch-cuda:0.1.0
    delivery: push
  delegate_to: localhost
"""

RETURN = r"""
status:
  description:
    - What happened to the container, C(created), C(replaced), C(started) (a stopped one) or
      C(unchanged).
  returned: success
  type: str
  sample: unchanged
container_id:
  description: The container's ID.
  returned: success
  type: str
image_id:
  description: The image's ID on the host.
  returned: success
  type: str
ssh:
  description: Where the container's SSH listens (on the host), as C(address:port).
  returned: success
  type: str
jupyter:
  description: Where Jupyter listens (on the host); its token stays in umprov's state folder.
  returned: success
  type: str
pushed_bytes:
  description: Bytes of image streamed to the host (0 when it had the image).
  returned: success
  type: int
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from umprov.errors import UmprovError
except ImportError:
    UmprovError = None


def deploy_one(params):
    """The host's deploy outcome, through umprov's library (umprov.deploy.run.deploy)."""
    from pathlib import Path

    from umprov.deploy.options import DeployOptions, checked
    from umprov.deploy.run import deploy
    from umprov.inventory.model import Host

    opts = checked(DeployOptions(image=params["image"] or None, delivery=params["delivery"],
                                 force=params["force"]),
                   Path(params["authorized_key"]) if params["authorized_key"] else None)
    host = Host(name=params["host"], address=params["address"], port=params["port"],
                user=params["user"], key_file=params["private_key"],
                known_hosts=params["known_hosts"], vars=params["variables"])
    local_client = None
    if opts.delivery == "push":
        from umprov.hosts.engine import local_engine

        local_client = local_engine()
    (outcome,) = deploy([host], opts, local_client=local_client)
    return outcome


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "address": {"type": "str", "required": True},
            "port": {"type": "int", "default": 22},
            "user": {"type": "str"},
            "private_key": {"type": "path"},
            "known_hosts": {"type": "path"},
            "variables": {"type": "dict", "default": {}},
            "image": {"type": "str", "default": ""},
            "delivery": {"type": "str", "choices": ["none", "pull", "push"], "default": "none"},
            "authorized_key": {"type": "path"},
            "force": {"type": "bool", "default": False},
        },
        supports_check_mode=False,
    )
    if UmprovError is None:
        module.fail_json(msg=missing_required_lib("umprov (on the controller, in the Python "
                                                  "that runs this module)"))
    try:
        outcome = deploy_one(module.params)
    except UmprovError as exc:
        module.fail_json(msg=str(exc))
    data = outcome.data
    for warning in data.get("warnings") or []:  # e.g. managed memory on an image without it
        module.warn(warning)
    result = {key: data.get(key) for key in ("container_id", "image_id", "ssh", "jupyter",
                                             "pushed_bytes")}
    if not outcome.ok:
        module.fail_json(msg="%s: %s" % (outcome.state, outcome.detail), status=outcome.state,
                         **result)
    module.exit_json(changed=outcome.state != "unchanged", status=outcome.state, **result)


if __name__ == "__main__":
    main()
