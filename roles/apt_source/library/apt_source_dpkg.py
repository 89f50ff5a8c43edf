#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Read what dpkg has installed and held of some packages, in one dpkg-query, and what a role's
converge decision needs besides: its keyring and source file, its own files and systemd units."""

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
  source:
    description:
      - A deb822 source file; its mode and its paragraphs (field to value) are returned, so the
        caller can tell whether deb822_repository would leave it as it is.
    type: str
    default: ""
  files:
    description:
      - Files the calling role writes whole; each one's SHA-256, mode, owner and group are returned,
        so the role can skip its copy tasks where they would change nothing.
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units the calling role enables; each one's C(systemctl is-enabled) state
        is returned.
    type: list
    elements: str
    default: []
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
source:
  description: >-
    O(source)'s mode (octal text) and paragraphs, each a dict of its fields (continuation
    lines joined with newlines); empty when it is absent, unreadable or none was given.
  type: dict
  returned: always
files:
  description: >-
    For each of O(files), "SHA256 MODE OWNER GROUP" (mode as octal text); empty when it is absent
    or unreadable.
  type: dict
  returned: always
units:
  description: >-
    For each of O(units), what C(systemctl is-enabled) printed; empty when it printed nothing.
  type: dict
  returned: always
blind:
  description: >-
    Check mode on a host without python3-apt or python3-debian: check mode cannot install
    them, and without them the apt modules cannot even look.
  type: bool
  returned: always
"""

import grp
import hashlib
import os
import pwd
import shutil
import stat

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
            "source": {"type": "str", "default": ""},
            "files": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
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
                         f"{keyring}.verified" if keyring else ""),
                     source=read_source(module.params["source"]),
                     files={path: file_state(path) for path in module.params["files"]},
                     units=unit_states(module, module.params["units"]))


def parse_deb822(text: str) -> list[dict[str, str]]:
    """A deb822 file's paragraphs: fields in the order met, continuation lines joined by a
    newline, comments dropped (apt reads it the same way)."""
    paragraphs: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                paragraphs.append(current)
            current, last = {}, ""
        elif line[:1] in (" ", "\t") and last:
            current[last] += "\n" + line.strip()
        elif ":" in line:
            name, value = line.split(":", 1)
            last = name.strip()
            current[last] = value.strip()
    if current:
        paragraphs.append(current)
    return paragraphs


def read_source(path: str) -> dict:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            mode = _mode(os.fstat(fh.fileno()))
            text = fh.read()
    except OSError:
        return {}
    return {"mode": mode, "paragraphs": parse_deb822(text)}


def file_state(path: str) -> str:
    """"SHA256 MODE OWNER GROUP" of a regular file, as copy would compare it; "" otherwise."""
    try:
        info = os.stat(path)
    except OSError:
        return ""
    sha = _sha256(path) if stat.S_ISREG(info.st_mode) else ""  # never read a fifo or a device
    if not sha:
        return ""
    return "%s %s %s %s" % (sha, _mode(info), _name(pwd.getpwuid, info.st_uid),
                            _name(grp.getgrgid, info.st_gid))


def _mode(info: os.stat_result) -> str:
    return "%04o" % stat.S_IMODE(info.st_mode)


def _name(lookup, ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def unit_states(module: AnsibleModule, units: list[str]) -> dict[str, str]:
    systemctl = shutil.which("systemctl")
    if not systemctl:
        return {unit: "" for unit in units}
    states = {}
    for unit in units:
        # rc 1 for disabled or unknown units: the printed state is the answer.
        _rc, out, _err = module.run_command([systemctl, "is-enabled", unit])
        states[unit] = out.strip().splitlines()[0] if out.strip() else ""
    return states


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
