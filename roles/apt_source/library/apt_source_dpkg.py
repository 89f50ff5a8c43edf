#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Read what dpkg has installed and held of some packages, in one dpkg-query."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_source_dpkg
short_description: What dpkg has installed and held of the given packages, in one dpkg-query
description:
  - Runs one C(dpkg-query -W) for the packages, the prerequisites and the Python bindings that
    Ansible's apt modules import, and returns them parsed. Reads only; supports check mode.
  - A package dpkg has never heard of is simply absent from the results.
options:
  packages:
    description: The calling role's packages.
    type: list
    elements: str
    default: []
  prerequisites:
    description: Packages apt sources need; those not installed are returned in RV(missing).
    type: list
    elements: str
    default: []
  keyring:
    description:
      - A repository's keyring file; its SHA-256 and the stamp beside it (C(KEYRING.verified),
        written when its fingerprints were last checked) are returned.
    type: str
    default: ""
author: umprov contributors (@umprov)
"""

EXAMPLES = r"""
- name: Read what dpkg has of Docker's packages
  umprov.gpu.apt_source_dpkg:
    packages: [docker-ce, docker-ce-cli, containerd.io]
    prerequisites: [ca-certificates, gnupg]
  register: dpkg

- name: Say which prerequisites are missing
  ansible.builtin.debug:
    msg: "{{ dpkg.missing }}"
"""

RETURN = r"""
installed:
  description: Installed packages (selection install or hold) and their versions.
  type: dict
  returned: always
held:
  description: Packages whose dpkg selection is hold, installed or not.
  type: list
  returned: always
missing:
  description: The prerequisites that are not installed, in the order given.
  type: list
  returned: always
keyring_sha256:
  description: The SHA-256 of O(keyring); empty when it is absent or none was given.
  type: str
  returned: always
keyring_stamp:
  description: The first line of C(KEYRING.verified); empty when it is absent.
  type: str
  returned: always
blind:
  description: >-
    Check mode on a host without python3-apt or python3-debian: check mode cannot install
    them, and without them the apt modules cannot even look.
  type: bool
  returned: always
"""

import hashlib

from ansible.module_utils.basic import AnsibleModule

FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"
# What the apt and deb822_repository modules import on the host.
APT_BINDINGS = ("python3-apt", "python3-debian")


def parse(text: str) -> tuple[dict[str, str], list[str]]:
    """dpkg-query's lines in FORMAT: {installed name: version}, [held names].

    Status-Abbrev is the selection (i install, h hold, ...) then the state (i installed, ...).
    """
    installed: dict[str, str] = {}
    held: list[str] = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or not fields[0]:
            continue
        name, version, status = fields
        if status[:1] == "h" and name not in held:
            held.append(name)
        if status[:1] in ("i", "h") and status[1:2] == "i":
            installed[name] = version
    return installed, held


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "default": []},
            "prerequisites": {"type": "list", "elements": "str", "default": []},
            "keyring": {"type": "str", "default": "", "no_log": False},  # a path, no secret
        },
        supports_check_mode=True,
    )
    asked = module.params["packages"] + module.params["prerequisites"] + list(APT_BINDINGS)
    names = list(dict.fromkeys(asked))
    # rc 1: some name is unknown to dpkg, which is an answer, not an error.
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f=" + FORMAT, *names])
    if rc not in (0, 1):
        module.fail_json(msg=f"dpkg-query failed (rc {rc}): {err.strip()}", rc=rc)
    installed, held = parse(out)
    missing = [name for name in module.params["prerequisites"] if name not in installed]
    blind = module.check_mode and any(name not in installed for name in APT_BINDINGS)
    keyring = module.params["keyring"]
    module.exit_json(changed=False, installed=installed, held=held, missing=missing, blind=blind,
                     keyring_sha256=_sha256(keyring), keyring_stamp=_first_line(
                         f"{keyring}.verified" if keyring else ""))


def _sha256(path: str) -> str:
    if not path:
        return ""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 16), b""):
                digest.update(chunk)
    except OSError:
        return ""
    return digest.hexdigest()


def _first_line(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
