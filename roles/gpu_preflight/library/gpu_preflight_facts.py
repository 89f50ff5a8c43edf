#!/usr/bin/python
# Copyright: umprov contributors
# Apache License 2.0 (see pyproject.toml)
"""Read-only GPU host facts for umprov's preflight play."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_preflight_facts
short_description: Gather NVIDIA GPU host facts without changing anything
description:
  - Reads NVIDIA GPUs and NVSwitches from sysfs (C(/sys/bus/pci/devices), no pciutils needed),
    the Secure Boot state (mokutil when present, else EFI variables; no EFI means disabled),
    the running and installed kernels and their headers, and the installed NVIDIA driver
    (asking nvidia-smi and C(/proc/driver/nvidia/version), and dpkg for who installed it).
  - Gathers the minimal facts (as C(setup) with C(gather_subset=min)) in the same call and
    returns them as C(ansible_facts), for the OS checks and for the roles after it.
  - Changes nothing; supports check mode.
options:
  gpu_models:
    description:
      - PCI device ID (four lowercase hex digits) to a dict with C(model) and C(generation).
    type: dict
    default: {}
  nvidia_smi_paths:
    description: Extra places to look for nvidia-smi besides PATH (for example a read-only mount).
    type: list
    elements: path
    default: []
  driver_packages:
    description: dpkg package name patterns that count as an NVIDIA driver installation.
    type: list
    elements: str
    default: []
  command_timeout:
    description: Seconds nvidia-smi and mokutil may take before they count as not answering.
    type: int
    default: 30
  supported_os:
    description:
      - Distribution (as Ansible names it) to the versions umprov supports; a version matches the
        distribution's version or its major version.
    type: dict
    default: {}
  host:
    description: The inventory name of the host, for the messages.
    type: str
    default: ""
  fail_on_unsupported_os:
    description: Fail (before gathering anything) on an unsupported OS; otherwise warn.
    type: bool
    default: true
  unknown_variables:
    description: Inventory variables with a role prefix that no role defines (typos).
    type: list
    elements: str
    default: []
  known_variables:
    description:
      - The variables the roles define, to suggest the one an unknown variable misspells (the
        suggestion C(umprov inventory check) makes).
    type: list
    elements: str
    default: []
  fail_on_unknown_variables:
    description: Fail on unknown variables; otherwise warn.
    type: bool
    default: true
  ansible_version:
    description: The controller's ansible-core version (C(ansible_version.full)).
    type: str
    default: ""
  ansible_minimum:
    description:
      - The oldest ansible-core the roles work with; an older I(ansible_version) fails the
        host before anything is read or changed.
    type: str
    default: ""
  value_rules:
    description:
      - The role's files/value_rules.yml (C(formats) and C(variables)), the rules that
        C(umprov inventory check) applies too.
    type: dict
    default: {}
  values:
    description: The host's values of the variables named in I(value_rules), templated.
    type: dict
    default: {}
author: umprov contributors (@umprov)
"""

EXAMPLES = r"""
- name: Gather GPU host facts (changes nothing)
  umprov.gpu.gpu_preflight_facts:
    gpu_models:
      "2335": {model: H200 SXM 141GB, generation: hopper}
    command_timeout: 30
  register: gpu_facts
"""

RETURN = r"""
gpus:
  description: NVIDIA display/3D controllers on the PCI bus.
  type: list
  returned: always
nvswitches:
  description: NVSwitch devices (PCI bridges of NVIDIA, or nvidia-nvswitch devices in /proc).
  type: list
  returned: always
secure_boot:
  description: enabled (bool), method (mokutil, efivars, no_efi, unknown), detail.
  type: dict
  returned: always
kernel:
  description: running release, installed kernel releases, headers state per release.
  type: dict
  returned: always
driver:
  description: installed NVIDIA driver, whether it answers, and who manages it.
  type: dict
  returned: always
os:
  description: >-
    The host's OS as the checks saw it: name ("Debian 12"), family, supported (a release umprov
    supports), family_supported (a family with apt).
  type: dict
  returned: always
ansible_facts:
  description: The minimal facts, as C(setup) with C(gather_subset=min) returns them.
  type: dict
  returned: always
summary:
  description: >-
    What the roles after the preflight read: gpu_count, gpu_present, gpu_generations,
    open_module (none, supported, required, unsupported, conflict), kernel_headers_missing.
  type: dict
  returned: always
"""

import difflib
import glob
import math
import os
import re
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts import ansible_collector, default_collectors
from ansible.module_utils.facts.namespace import PrefixFactNamespace

NVIDIA_VENDOR = "0x10de"
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# Turing (TU102, 0x1e02) is the first generation with open kernel module support; NVIDIA's
# device IDs grow with the generation, so a device below this is Volta or older.
FIRST_TURING_DEVICE = 0x1E00
OPEN_REQUIRED = {"blackwell", "grace-hopper", "grace-blackwell"}
OPEN_UNSUPPORTED = {"kepler", "maxwell", "pascal", "volta"}


def _read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def _run(module, argv, timeout, env=None):
    """Run a read-only probe; return (rc, stdout, stderr); rc None when it cannot run."""
    try:
        proc = subprocess.run(  # noqa: S603
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def pci_devices(gpu_models):
    gpus, switches = [], []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if _read(os.path.join(dev, "vendor")).lower() != NVIDIA_VENDOR:
            continue
        device = _read(os.path.join(dev, "device")).lower()
        pci_class = _read(os.path.join(dev, "class")).lower()
        device_id = device[2:] if device.startswith("0x") else device
        entry = {
            "address": os.path.basename(dev),
            "device_id": device_id,
            "class": pci_class,
            "subsystem_device": _read(os.path.join(dev, "subsystem_device")).lower(),
            "driver": os.path.basename(os.path.realpath(os.path.join(dev, "driver")))
            if os.path.exists(os.path.join(dev, "driver"))
            else "",
        }
        if pci_class.startswith("0x03"):
            known = gpu_models.get(device_id) or {}
            generation = str(known.get("generation", "")).lower()
            try:
                number = int(device_id, 16)
            except ValueError:
                number = 0
            if generation in OPEN_REQUIRED:
                open_module = "required"
            elif generation in OPEN_UNSUPPORTED:
                open_module = "unsupported"
            elif generation:
                open_module = "supported"
            else:
                open_module = "supported" if number >= FIRST_TURING_DEVICE else "unsupported"
            entry.update(
                model=known.get("model", "NVIDIA device 0x%s" % device_id),
                generation=generation or "unknown",
                open_module=open_module,
            )
            gpus.append(entry)
        elif pci_class.startswith("0x0680"):
            switches.append(entry)
    proc_switches = (
        sorted(os.listdir("/proc/driver/nvidia-nvswitch/devices"))
        if os.path.isdir("/proc/driver/nvidia-nvswitch/devices")
        else []
    )
    return gpus, switches, proc_switches


def secure_boot(module, timeout):
    mokutil = shutil.which("mokutil")
    if mokutil:
        rc, out, err = _run(module, [mokutil, "--sb-state"], timeout)
        text = (out + err).lower()
        if "secureboot enabled" in text:
            return {"enabled": True, "method": "mokutil", "detail": out.strip()}
        if "secureboot disabled" in text:
            return {"enabled": False, "method": "mokutil", "detail": out.strip()}
        if "not supported" in text or "efi variables are not supported" in text:
            return {"enabled": False, "method": "mokutil", "detail": (out + err).strip()}
    if not os.path.isdir("/sys/firmware/efi"):
        return {
            "enabled": False,
            "method": "no_efi",
            "detail": "no /sys/firmware/efi: legacy BIOS or no EFI",
        }
    var = os.path.join("/sys/firmware/efi/efivars", SECURE_BOOT_VAR)
    try:
        with open(var, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return {
            "enabled": False,
            "method": "unknown",
            "detail": "EFI present, %s unreadable: %s" % (var, exc),
        }
    # efivarfs: 4 bytes of attributes, then the value (one byte, 1 = enabled).
    enabled = len(data) >= 5 and data[4] == 1
    return {
        "enabled": enabled,
        "method": "efivars",
        "detail": "SecureBoot=%d" % (data[4] if len(data) >= 5 else -1),
    }


def _release_key(release):
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-+~]", release)]


def dpkg_status(module, names, timeout):
    """name -> (version, installed?) for the given names or patterns; {} without dpkg."""
    dpkg_query = shutil.which("dpkg-query")
    if not dpkg_query or not names:
        return {}
    rc, out, _err = _run(
        module,
        [dpkg_query, "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", *names],
        timeout,
    )
    result = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            result[parts[0]] = {
                "version": parts[1],
                "installed": parts[2].strip()[:2] in ("ii", "hi"),
            }
    return result


def kernel_facts(module, timeout):
    running = os.uname().release
    installed = set()
    for path in glob.glob("/boot/vmlinuz-*"):
        installed.add(os.path.basename(path)[len("vmlinuz-") :])
    for path in glob.glob("/lib/modules/*/modules.dep"):
        installed.add(os.path.basename(os.path.dirname(path)))
    releases = sorted(installed | {running}, key=_release_key)
    newest = releases[-1] if releases else running
    headers = {}
    status = dpkg_status(module, ["linux-headers-%s" % r for r in releases], timeout)
    for release in releases:
        pkg = "linux-headers-%s" % release
        present = os.path.isdir("/lib/modules/%s/build" % release) or os.path.isdir(
            "/usr/src/%s" % pkg
        )
        candidate = "" if present else apt_candidate(module, pkg, timeout)
        headers[release] = {
            "package": pkg,
            "installed": present or bool(status.get(pkg, {}).get("installed")),
            "candidate": candidate,
            "installable": bool(candidate),
        }
    flavour = running.split("-")[-1] if "-" in running else ""
    images = dpkg_status(module, ["linux-image-*"], timeout)
    header_metas = {}
    for meta in header_meta_packages(n for n, info in images.items() if info["installed"]):
        installed = bool(dpkg_status(module, [meta], timeout).get(meta, {}).get("installed"))
        candidate = "" if installed else apt_candidate(module, meta, timeout)
        header_metas[meta] = {"installed": installed, "candidate": candidate}
    return {
        "running": running,
        "newest": newest,
        "installed": releases,
        "headers": headers,
        "flavour": flavour,
        "header_metas": header_metas,
    }


def apt_candidate(module, name, timeout):
    """The version apt would install of ``name``; "" when none (or no apt)."""
    apt_cache = shutil.which("apt-cache")
    if not apt_cache:
        return ""
    _rc, out, _err = _run(module, [apt_cache, "policy", name], timeout)
    match = re.search(r"Candidate:\s*(\S+)", out)
    return match.group(1) if match and match.group(1) != "(none)" else ""


def header_meta_packages(image_packages):
    """The headers meta packages that follow the installed kernel meta packages: without one, a
    kernel update arrives without the headers DKMS needs to build the module for it
    (linux-image-amd64 -> linux-headers-amd64, linux-image-generic-hwe-24.04 ->
    linux-headers-generic-hwe-24.04). Versioned images (linux-image-6.1.0-28-amd64,
    linux-image-unsigned-6.8.0-48-generic) and debug symbols are not meta packages."""
    metas = []
    for name in sorted(image_packages):
        rest = name[len("linux-image-"):]
        if not name.startswith("linux-image-") or not rest:
            continue
        if re.match(r"(unsigned-|uc-)?[0-9]", rest) or rest.endswith(("-dbg", "-dbgsym")):
            continue
        metas.append("linux-headers-" + rest)
    return metas


def kernel_headers_missing(kernel):
    """Headers packages DKMS needs and does not have: the running kernel's (the module must
    build now) and the newest installed kernel's (the next boot). Older kernels left installed
    are not counted: Debian's archive keeps only the current ABI's headers."""
    wanted = []
    for release in (kernel["running"], kernel["newest"]):
        info = kernel["headers"].get(release)
        if info and not info["installed"] and info["package"] not in wanted:
            wanted.append(info["package"])
    return wanted


def _nvidia_smi_candidates(extra):
    seen, found = set(), []
    for path in [shutil.which("nvidia-smi") or "", *extra]:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                found.append(path)
    return found


def _loaded_module():
    """The loaded kernel module's version and flavour (open or proprietary), or ""."""
    proc_version = _read("/proc/driver/nvidia/version")
    match = re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", proc_version)
    if not match:
        return "", ""
    return match.group(1), "open" if "open kernel module" in proc_version.lower() else "proprietary"


def _ask_nvidia_smi(module, extra_paths, timeout):
    """The first nvidia-smi that answers: its path, driver version, rc and, where none
    answered, the last one's first line."""
    smi_path, smi_version, smi_rc, smi_message = "", "", None, ""
    for candidate in _nvidia_smi_candidates(extra_paths):
        bindir = os.path.dirname(os.path.realpath(candidate))
        root = os.path.dirname(bindir)
        env = dict(os.environ)
        libdirs = [
            d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib")) if os.path.isdir(d)
        ]
        if libdirs and not root.startswith("/usr"):
            env["LD_LIBRARY_PATH"] = ":".join(libdirs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(
                ":"
            )
        rc, out, err = _run(
            module,
            [candidate, "--query-gpu=driver_version", "--format=csv,noheader"],
            timeout,
            env=env,
        )
        smi_path, smi_rc = candidate, rc
        if rc == 0 and out.strip():
            return candidate, out.strip().splitlines()[0].strip(), rc, ""
        smi_message = (out + err).strip().splitlines()[0] if (out + err).strip() else "rc=%s" % rc
    return smi_path, smi_version, smi_rc, smi_message


def _package_owner(module, smi_path, timeout):
    """The Debian package that installed nvidia-smi ("" when none did, or no dpkg)."""
    if not smi_path or not shutil.which("dpkg"):
        return ""
    rc, out, _err = _run(module, ["dpkg", "-S", os.path.realpath(smi_path)], timeout)
    if rc != 0:
        rc, out, _err = _run(module, ["dpkg", "-S", smi_path], timeout)
    return out.split(":", 1)[0].strip() if rc == 0 else ""


def driver_facts(module, extra_paths, patterns, timeout):
    loaded_version, loaded_flavour = _loaded_module()
    smi_path, smi_version, smi_rc, smi_message = _ask_nvidia_smi(module, extra_paths, timeout)
    packages = dpkg_status(module, patterns, timeout)
    installed_pkgs = {name: info["version"] for name, info in packages.items() if info["installed"]}
    owner = _package_owner(module, smi_path, timeout)
    answers = bool(smi_version)
    present = bool(smi_path or loaded_version or installed_pkgs)
    if not present:
        managed_by = "none"
    elif owner or (installed_pkgs and not smi_path):
        managed_by = "dpkg"
    else:
        managed_by = "foreign"
    version = smi_version or loaded_version
    # NVSwitch systems need fabric manager at the driver's version, however the driver came.
    fm_paths = ("/usr/bin/nv-fabricmanager", "/usr/sbin/nv-fabricmanager")
    fabricmanager = shutil.which("nv-fabricmanager") or next(
        (p for p in fm_paths if os.path.exists(p)), ""
    )
    return {
        "fabricmanager": fabricmanager,
        "present": present,
        "answers": answers,
        "version": version,
        "branch": version.split(".")[0] if version else "",
        "loaded_version": loaded_version,
        "kernel_module": loaded_flavour,
        "nvidia_smi": smi_path,
        "nvidia_smi_rc": smi_rc,
        "nvidia_smi_message": smi_message,
        "nvidia_smi_owner": owner,
        "managed_by": managed_by,
        "packages": installed_pkgs,
        "mismatch": bool(smi_version and loaded_version and smi_version != loaded_version),
    }


def open_module_mode(gpus):
    """One kernel module flavour for every GPU of the host, or 'conflict'."""
    modes = {gpu["open_module"] for gpu in gpus}
    if not modes:
        return "none"
    if "required" in modes and "unsupported" in modes:
        return "conflict"
    for mode in ("required", "unsupported"):
        if mode in modes:
            return mode
    return "supported"


def _version_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", str(text))[:3])


def ansible_too_old(version, minimum):
    """What to say when the controller's ansible-core is older than the roles need, or None."""
    if not version or not minimum or _version_tuple(version) >= _version_tuple(minimum):
        return None
    return (
        "ansible-core %s runs this playbook; umprov's roles need %s or newer (their tasks use "
        "options older releases refuse, halfway through a run). Nothing was changed on this "
        "host. pip install 'ansible-core>=%s', or run umprov provision, which brings its own."
        % (version, minimum, minimum)
    )


# What setup's gather_subset=min collects (ansible-core's setup module names the same set).
MINIMAL_FACTS = frozenset(["apparmor", "caps", "cmdline", "date_time", "distribution", "dns",
                           "env", "fips", "local", "lsb", "pkg_mgr", "platform", "python",
                           "selinux", "service_mgr", "ssh_pub_keys", "user"])


def minimal_facts(module):
    """The facts setup's gather_subset=min returns, with its collectors, in this call."""
    collector = ansible_collector.get_ansible_collector(
        all_collector_classes=default_collectors.collectors,
        namespace=PrefixFactNamespace(namespace_name="ansible", prefix="ansible_"),
        filter_spec=[], gather_subset=["!all", "min"], gather_timeout=10,
        minimal_gather_subset=MINIMAL_FACTS)
    return collector.collect(module=module)


def os_check(facts, supported, host):
    """The host's OS against the supported releases (a version matches the distribution's
    version or its major version: Ubuntu 22.04, Debian 12 for 12.x) and the apt family."""
    name = facts.get("ansible_distribution", "") or "unknown"
    version = str(facts.get("ansible_distribution_version", ""))
    major = str(facts.get("ansible_distribution_major_version", ""))
    release = facts.get("ansible_distribution_release", "")
    family = facts.get("ansible_os_family", "")
    versions = [str(v) for v in supported.get(name, [])]
    listed = ", ".join("%s %s" % (n, "/".join(str(v) for v in vs)) for n, vs in supported.items())
    message = "Unsupported OS on %s: %s %s%s. umprov supports %s." % (
        host, name, version, " (%s)" % release if release else "", listed)
    return {"name": ("%s %s" % (name, version)).strip(), "family": family,
            "supported": name in supported and (version in versions or major in versions),
            "family_supported": family == "Debian", "message": message}


def did_you_mean(name, known):
    """' (did you mean 'X'?)' for the known name closest to a misspelt one, else ''. The one
    home of the suggestion: umprov inventory check uses this function too."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return " (did you mean '%s'?)" % close[0] if close else ""


def check_inputs(module, os_state):
    """Stop (or warn) on an unsupported OS or misspelt role variables, before any probe."""
    params = module.params
    problems = []
    old = ansible_too_old(params["ansible_version"], params["ansible_minimum"])
    if old:
        problems.append(old)
    if not os_state["family_supported"]:
        # Not a release umprov has not tried but a family it has no tasks for: no flag lets it on.
        problems.append(
            "%s Nothing was changed on this host: umprov's roles install with apt (the Debian "
            "family) only." % os_state["message"]
        )
    elif not os_state["supported"]:
        text = os_state["message"]
        if params["fail_on_unsupported_os"]:
            problems.append(
                "%s Nothing was changed on this host. "
                "(gpu_preflight_fail_on_unsupported_os=false turns this into a warning.)" % text
            )
        else:
            module.warn(
                "%s Continuing because gpu_preflight_fail_on_unsupported_os is false." % text
            )
    unknown = sorted(set(params["unknown_variables"]))
    if unknown:
        text = (
            "Unknown variable(s): %s. They carry a umprov role prefix but no role defines them"
            % ", ".join(u + did_you_mean(u, params["known_variables"]) for u in unknown)
        )
        if params["fail_on_unknown_variables"]:
            problems.append(
                "%s (see docs/roles.md, in umprov's repository and the umprov.gpu collection); "
                "gpu_preflight_fail_on_unknown_variables=false turns this into a warning." % text
            )
        else:
            module.warn(text + ".")
    bad = value_problems(params["value_rules"], params["values"])
    if bad:
        problems.append("Bad value(s): %s." % "; ".join(bad))
    if problems:
        module.fail_json(msg=" ".join(problems))


def _format_allows(fmt, value):
    """One format of value_rules.yml (pattern, min, max) against a value, as text."""
    text = str(value).strip()
    if fmt.get("pattern") is not None and not re.fullmatch(fmt["pattern"], text):
        return False
    if fmt.get("min") is None and fmt.get("max") is None:
        return True
    try:
        number = float(text)
    except (ValueError, OverflowError):
        return False
    if not math.isfinite(number):
        return False
    return not ((fmt.get("min") is not None and number < fmt["min"])
                or (fmt.get("max") is not None and number > fmt["max"]))


def value_problems(rules, values):
    """'NAME is VALUE, expected ...' for each value its format refuses."""
    formats = rules.get("formats") or {}
    found = []
    for name in sorted(values):
        fmt = formats.get((rules.get("variables") or {}).get(name))
        if fmt is not None and not _format_allows(fmt, values[name]):
            found.append("%s is %r, expected %s" % (name, str(values[name])[:40], fmt["expected"]))
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpu_models=dict(type="dict", default={}),
            nvidia_smi_paths=dict(type="list", elements="path", default=[]),
            driver_packages=dict(type="list", elements="str", default=[]),
            command_timeout=dict(type="int", default=30),
            supported_os=dict(type="dict", default={}),
            host=dict(type="str", default=""),
            fail_on_unsupported_os=dict(type="bool", default=True),
            unknown_variables=dict(type="list", elements="str", default=[]),
            known_variables=dict(type="list", elements="str", default=[]),
            fail_on_unknown_variables=dict(type="bool", default=True),
            value_rules=dict(type="dict", default={}),
            values=dict(type="dict", default={}),
            ansible_version=dict(type="str", default=""),
            ansible_minimum=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    facts = minimal_facts(module)
    os_state = os_check(facts, module.params["supported_os"], module.params["host"])
    check_inputs(module, os_state)
    timeout = module.params["command_timeout"]
    models = {str(k).lower().replace("0x", ""): v for k, v in module.params["gpu_models"].items()}
    gpus, switches, proc_switches = pci_devices(models)
    nvswitch = {
        "present": bool(switches or proc_switches),
        "pci": switches,
        "proc_devices": proc_switches,
    }
    kernel = kernel_facts(module, timeout)
    generations = []
    for gpu in gpus:
        if gpu["generation"] not in generations:
            generations.append(gpu["generation"])
    module.exit_json(
        changed=False,
        ansible_facts=facts,
        os={k: v for k, v in os_state.items() if k != "message"},
        gpus=gpus,
        nvswitch=nvswitch,
        secure_boot=secure_boot(module, timeout),
        kernel=kernel,
        driver=driver_facts(
            module, module.params["nvidia_smi_paths"], module.params["driver_packages"], timeout
        ),
        summary={
            "gpu_count": len(gpus),
            "gpu_present": bool(gpus),
            "gpu_generations": generations,
            "open_module": open_module_mode(gpus),
            "kernel_headers_missing": kernel_headers_missing(kernel),
        },
    )


if __name__ == "__main__":
    main()
