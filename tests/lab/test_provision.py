"""`umprov provision` against lab hosts: converge, idempotence, check mode, faults, reboots.

Two labs: `pytest-prov` (3 hosts, converged once and shared) and `pytest-faults` (3 hosts that the
fault tests break on purpose). Host state is read back over real SSH with the lab's pinned host
keys, never through Ansible.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from tests.lab.conftest import clear_lab, cli, lab_name, ssh_command

pytestmark = [pytest.mark.lab, pytest.mark.cost(1200)]

PROV = lab_name("pytest-prov")
FAULTS = lab_name("pytest-faults")

DRIVER_BRANCH = "580"
DRIVER_VERSION = "580.95.05"  # the newest 580 driver in the lab's stand-in CUDA repository
TOOLKIT_VERSION = "1.17.8-1"  # nvidia_container_toolkit_version's default
DRIVER_PACKAGES = ("nvidia-open", f"nvidia-driver-pinning-{DRIVER_BRANCH}")
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
PLANTED = {"log-opts": {"max-size": "10m"}}
PID1_START = "cut -d' ' -f22 /proc/1/stat"


@dataclass
class Provisioned:
    """One `umprov provision --json` run: exit code, per-host results, the raw CLI result."""

    exit_code: int
    hosts: dict[str, dict[str, Any]]
    data: dict[str, Any]
    result: Result

    def explain(self) -> str:
        return f"exit {self.exit_code}\nstderr:\n{self.result.stderr[-3000:]}"


def provision(lab: str, *args: str) -> Provisioned:
    result = cli("provision", f"lab/{lab}", "--json", *args)
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return Provisioned(
        result.exit_code, {h["host"]: h for h in data.get("hosts", [])}, data, result
    )


@dataclass
class Host:
    """A tiny testinfra: commands on a lab host over SSH with strict host key checking."""

    name: str
    container: str
    port: int
    key: Path
    known_hosts: Path

    def run(self, command: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ssh_command(self.key, self.known_hosts, self.port), command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def check(self, command: str) -> str:
        out = self.run(command)
        assert out.returncode == 0, f"{self.name}: {command!r} failed: {out.stderr or out.stdout}"
        return out.stdout

    def sudo(self, command: str) -> str:
        return self.check(f"sudo -n sh -c {shlex.quote(command)}")

    def read(self, path: str) -> str:
        return self.sudo(f"cat {shlex.quote(path)}")

    def exists(self, path: str) -> bool:
        return self.run(f"test -e {shlex.quote(path)}").returncode == 0

    def package_version(self, name: str) -> str | None:
        out = self.run(f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Version}}' {name}")
        fields = out.stdout.split()
        # "ii" installed, "hi" installed and held
        installed = out.returncode == 0 and len(fields) == 2 and fields[0][1:2] == "i"
        return fields[1] if installed else None

    def holds(self) -> set[str]:
        return set(self.check("apt-mark showhold").split())

    def pid1_start(self) -> str:
        return self.check(PID1_START).strip()


@dataclass
class Lab:
    name: str
    inventory: Path
    directory: Path
    hosts: list[Host]


def lab_up(name: str, count: int) -> Lab:
    up = cli("lab", "up", "--hosts", str(count), "--name", name, "--json")
    assert up.exit_code == 0, up.stderr
    data = json.loads(up.stdout)
    key, known = Path(data["key_file"]), Path(data["known_hosts"])
    hosts = [
        Host(h["name"], f"umprov-lab-{name}-{i}", h["port"], key, known)
        for i, h in enumerate(data["hosts"], start=1)
    ]
    return Lab(name, Path(data["inventory"]), key.parent, hosts)


def wait_for_ssh(host: Host, timeout: float = 180) -> None:
    """SSH answers and the boot has finished. On a busy 2-core machine the boot after a
    reboot can outlast one ``--wait``: ask again until the deadline."""
    deadline = time.monotonic() + timeout
    last = ""
    while (left := deadline - time.monotonic()) > 0:
        try:
            out = host.run("systemctl is-system-running --wait || true", timeout=min(left, 60))
        except subprocess.TimeoutExpired:
            last = "the boot had not finished"
            continue
        if out.returncode == 0:
            return
        last = out.stderr
        time.sleep(1)
    pytest.fail(f"{host.name} did not answer SSH within {timeout:.0f} s: {last}")


@pytest.fixture(scope="module")
def prov_lab() -> Iterator[Lab]:
    clear_lab(PROV)
    lab = lab_up(PROV, 3)
    yield lab
    cli("lab", "down", "--name", PROV)


@pytest.fixture(scope="module")
def faults_lab() -> Iterator[Lab]:
    clear_lab(FAULTS)  # not in lab_up: a test calls that to start a stopped host again
    lab = lab_up(FAULTS, 4)
    yield lab
    cli("lab", "down", "--name", FAULTS)


# ---------------------------------------------------------------------------------------------
# Converge three fresh hosts, then check what is on them


@pytest.fixture(scope="module")
def first_run(prov_lab: Lab) -> Provisioned:
    for host in prov_lab.hosts:
        assert host.package_version("nvidia-open") is None, f"{host.name} is not fresh"
        host.sudo(
            f"mkdir -p /etc/docker && echo {shlex.quote(json.dumps(PLANTED))} > /etc/docker/daemon.json"
        )
    return provision(PROV)


def test_first_run_converges_every_host(prov_lab: Lab, first_run: Provisioned) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    assert sorted(first_run.hosts) == sorted(h.name for h in prov_lab.hosts)
    for name, host in first_run.hosts.items():
        assert host["status"] == "changed", (name, host)
        assert (host["failed"], host["unreachable"], host["failure"]) == (0, 0, None)
        driver = host["roles"]["nvidia_driver_status"]
        assert (driver["action"], driver["version"], driver["kernel_module"]) == (
            "installed",
            DRIVER_VERSION,
            "open",
        )
        assert host["roles"]["nvidia_container_toolkit_status"]["runtime_configured"] in (
            True,
            "True",
            "true",
        )
        assert any("runtime configured" in note for note in host["notes"]), host["notes"]


def test_driver_and_toolkit_packages_pinned_and_held(prov_lab: Lab, first_run: Provisioned) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    for host in prov_lab.hosts:
        assert (host.package_version("nvidia-open") or "").startswith(f"{DRIVER_VERSION}-")
        assert host.package_version(f"nvidia-driver-pinning-{DRIVER_BRANCH}") is not None
        for pkg in TOOLKIT_PACKAGES:
            assert host.package_version(pkg) == TOOLKIT_VERSION, (host.name, pkg)
        held = host.holds()
        missing = (set(DRIVER_PACKAGES) | set(TOOLKIT_PACKAGES)) - held
        assert not missing, f"{host.name}: not held: {sorted(missing)}"


def test_unattended_upgrades_and_nouveau_blacklists(prov_lab: Lab, first_run: Provisioned) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    for host in prov_lab.hosts:
        uu = host.read("/etc/apt/apt.conf.d/51umprov-nvidia-driver")
        assert "Unattended-Upgrade::Package-Blacklist {" in uu
        for pattern in ("nvidia-", "libnvidia-", "cuda-"):
            assert f'"{pattern}";' in uu, (host.name, pattern)
        nouveau = host.read("/etc/modprobe.d/blacklist-nouveau.conf").splitlines()
        assert "blacklist nouveau" in nouveau and "options nouveau modeset=0" in nouveau


def test_daemon_json_has_runtime_and_keeps_planted_key(
    prov_lab: Lab, first_run: Provisioned
) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    for host in prov_lab.hosts:
        daemon = json.loads(host.read("/etc/docker/daemon.json"))
        assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
        assert daemon["log-opts"] == PLANTED["log-opts"], daemon
        assert host.check("systemctl is-active docker").strip() == "active"
        # The running engine loaded the file: the runtime is live, not only on disk.
        runtimes = host.sudo("docker info --format '{{json .Runtimes}}'")
        assert "nvidia" in json.loads(runtimes)


def test_sources_are_deb822_with_signed_by(prov_lab: Lab, first_run: Provisioned) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    for host in prov_lab.hosts:
        for name, keyring in (
            ("umprov-nvidia-cuda", "/etc/apt/keyrings/umprov-nvidia-cuda.asc"),
            (
                "umprov-nvidia-container-toolkit",
                "/etc/apt/keyrings/umprov-nvidia-container-toolkit.asc",
            ),
        ):
            source = host.read(f"/etc/apt/sources.list.d/{name}.sources")
            assert f"Signed-By: {keyring}" in source, source
            assert "Types: deb" in source
            assert "BEGIN PGP PUBLIC KEY BLOCK" in host.read(keyring)


def test_second_run_changes_nothing(prov_lab: Lab, first_run: Provisioned) -> None:
    assert first_run.exit_code == 0, first_run.explain()
    again = provision(PROV)
    assert again.exit_code == 0, again.explain()
    for name, host in again.hosts.items():
        assert host["changed"] == 0, (name, host["changed_tasks"])
        assert host["status"] == "ok"
        assert host["roles"]["nvidia_driver_status"]["action"] == "installed"


def test_drift_on_a_converged_host_is_found_and_repaired(
    prov_lab: Lab, first_run: Provisioned
) -> None:
    """A converged host skips its repository, file and unit steps in one task each (the probe
    reads their state): a source, a config file, a rule or a unit changed by hand must still be
    found, shown by check mode, put back, and then left alone."""
    assert first_run.exit_code == 0, first_run.explain()
    host = prov_lab.hosts[0]
    cuda = "/etc/apt/sources.list.d/umprov-nvidia-cuda.sources"
    nouveau = "/etc/modprobe.d/blacklist-nouveau.conf"
    rule = "/etc/udev/rules.d/71-umprov-nvidia-dev-char.rules"
    wanted = {path: host.read(path) for path in (cuda, nouveau)}
    host.sudo(f"sed -i 's/^Enabled: yes/Enabled: no/' {cuda} && echo '# mine' >> {nouveau}"
              f" && chmod 0600 {rule} && systemctl disable --quiet nvidia-persistenced")

    check = provision(PROV, "--check", "--limit", host.name)
    assert check.exit_code == 0, check.explain()
    assert check.hosts[host.name]["changed"] >= 4, check.hosts[host.name]["changed_tasks"]
    assert "Enabled: no" in host.read(cuda)

    fixed = provision(PROV, "--limit", host.name)
    assert fixed.exit_code == 0, fixed.explain()
    changed = " | ".join(fixed.hosts[host.name]["changed_tasks"])
    for step in ("repository source", "Blacklist nouveau", "udev rule", "persistence daemon"):
        assert step in changed, changed
    assert {path: host.read(path) for path in (cuda, nouveau)} == wanted
    assert host.check(f"stat -c %a {rule}").strip() == "644"
    assert host.check("systemctl is-enabled nvidia-persistenced").strip() == "enabled"

    again = provision(PROV, "--limit", host.name)
    assert again.exit_code == 0, again.explain()
    assert again.hosts[host.name]["changed"] == 0, again.hosts[host.name]["changed_tasks"]


# ---------------------------------------------------------------------------------------------
# Check mode and faults, on their own lab


def test_check_mode_on_a_fresh_host_reports_changes_and_changes_nothing(
    faults_lab: Lab,
) -> None:
    host = faults_lab.hosts[2]
    before = host.check("ls /etc/apt/sources.list.d; dpkg -l | wc -l")
    run = provision(FAULTS, "--check", "--limit", host.name)
    assert run.exit_code == 0, run.explain()
    result = run.hosts[host.name]
    assert result["failed"] == 0 and result["failure"] is None, result
    assert result["changed"] > 0, result
    assert run.data["check"] is True
    assert host.check("ls /etc/apt/sources.list.d; dpkg -l | wc -l") == before


def test_unsupported_os_stops_in_preflight(faults_lab: Lab) -> None:
    host = faults_lab.hosts[2]
    fedora = 'NAME="Fedora Linux"\nID=fedora\nVERSION_ID=40\nPRETTY_NAME="Fedora Linux 40"\n'
    host.sudo("cp --remove-destination /usr/lib/os-release /root/os-release.orig")
    host.sudo(f"rm -f /etc/os-release && printf %s {shlex.quote(fedora)} > /etc/os-release")
    try:
        before = host.check("ls -A /etc/apt/sources.list.d /etc/apt/keyrings; dpkg -l | wc -l")
        run = provision(FAULTS, "--limit", host.name)
        after = host.check("ls -A /etc/apt/sources.list.d /etc/apt/keyrings; dpkg -l | wc -l")
    finally:
        host.sudo("rm -f /etc/os-release && ln -s ../usr/lib/os-release /etc/os-release")
    assert run.exit_code == 10, run.explain()
    result = run.hosts[host.name]
    assert result["status"] == "failed"
    assert "Fedora" in result["failure"], result["failure"]
    assert "Unsupported OS" in result["failure"] and "Nothing was changed" in result["failure"]
    assert result["changed"] == 0 and after == before


def _stop_after(container: str, seconds: float) -> threading.Thread:
    def stop() -> None:
        time.sleep(seconds)
        subprocess.run(["docker", "stop", "-t", "5", container], capture_output=True, timeout=60)

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread


def test_host_stopped_mid_run_is_named_and_others_converge(faults_lab: Lab) -> None:
    one, two = faults_lab.hosts[0], faults_lab.hosts[1]
    stopper = _stop_after(two.container, 12)
    run = provision(FAULTS, "--limit", f"{one.name},{two.name}")
    stopper.join(timeout=60)
    assert run.exit_code in (10, 11), run.explain()
    stopped = run.hosts[two.name]
    assert stopped["status"] in ("unreachable", "failed"), stopped
    assert stopped["failure"], stopped
    assert run.exit_code == (11 if stopped["status"] == "unreachable" else 10)
    assert two.name in run.result.stderr  # the summary table names it
    survivor = run.hosts[one.name]
    assert (survivor["status"], survivor["failed"], survivor["unreachable"]) == ("changed", 0, 0)
    assert one.package_version("nvidia-container-toolkit") == TOOLKIT_VERSION


def test_rerun_completes_stopped_host_waiting_for_the_apt_lock(faults_lab: Lab) -> None:
    one, two = faults_lab.hosts[0], faults_lab.hosts[1]
    lab_up(FAULTS, len(faults_lab.hosts))  # starts the stopped container again
    wait_for_ssh(two)
    # Another apt client: holds dpkg's frontend lock the way apt does (fcntl), for 20 s.
    holder = (
        "import fcntl, time\n"
        "f = open('/var/lib/dpkg/lock-frontend', 'w')\n"
        "fcntl.lockf(f, fcntl.LOCK_EX)\n"
        "open('/run/lock-taken', 'w').write(str(time.time()))\n"
        "time.sleep(20)\n"
        "open('/run/lock-released', 'w').write(str(time.time()))\n"
    )
    two.sudo("rm -f /run/lock-taken /run/lock-released")
    two.sudo(f"systemd-run --unit umprov-test-lock --collect python3 -c {shlex.quote(holder)}")
    deadline = time.monotonic() + 30
    while not two.exists("/run/lock-taken"):
        assert time.monotonic() < deadline, "the lock holder did not take the dpkg lock"
        time.sleep(0.5)
    log_lines = int(two.sudo("touch /var/log/dpkg.log && wc -l < /var/log/dpkg.log"))
    run = provision(FAULTS, "--limit", f"{one.name},{two.name}")
    assert run.exit_code == 0, run.explain()
    assert run.hosts[two.name]["status"] == "changed"
    assert run.hosts[one.name]["changed"] == 0, run.hosts[one.name]["changed_tasks"]
    released = float(two.sudo("cat /run/lock-released"))
    # dpkg ran on the host during this run, and only after the other process let go of the lock.
    first_dpkg = two.sudo(
        f"tail -n +{log_lines + 1} /var/log/dpkg.log | head -1 | cut -d' ' -f1-2"
    ).strip()
    assert first_dpkg, "dpkg did not run on the restarted host"
    first_epoch = int(two.check(f"date -d {shlex.quote(first_dpkg)} +%s"))
    assert first_epoch >= int(released), (first_dpkg, released)
    assert two.package_version("nvidia-container-toolkit") == TOOLKIT_VERSION
    assert "nvidia" in json.loads(two.sudo("docker info --format '{{json .Runtimes}}'"))


# ---------------------------------------------------------------------------------------------
# Debian's own driver packages, with an allowed reboot (slow: real packages from deb.debian.org)


# Debian's own 535 driver, with a reboot allowed when the driver changed.
DISTRIBUTION_DRIVER = (
    "--only", "driver",
    "-e", "nvidia_driver_source=distribution",
    "-e", "nvidia_driver_branch=535",
    "-e", "nvidia_driver_allow_reboot=true",
    "-e", "nvidia_driver_reboot_when=changed",
)


@pytest.fixture(scope="module")
def distribution_run(faults_lab: Lab) -> tuple[Provisioned, str, str]:
    host = faults_lab.hosts[2]
    before = host.pid1_start()
    run = provision(FAULTS, "--limit", host.name, *DISTRIBUTION_DRIVER)
    wait_for_ssh(host)
    return run, before, host.pid1_start()


def test_distribution_driver_installs_and_reboots(
    faults_lab: Lab, distribution_run: tuple[Provisioned, str, str]
) -> None:
    run, before, after = distribution_run
    host = faults_lab.hosts[2]
    assert run.exit_code == 0, run.explain()
    result = run.hosts[host.name]
    driver = result["roles"]["nvidia_driver_status"]
    assert driver["source"] == "distribution" and driver["version"].startswith("535.")
    assert driver["rebooted"] in (True, "True", "true"), driver
    assert "Reboot the host into the new NVIDIA driver" in result["changed_tasks"]
    assert before != after, "PID 1 of the host container did not restart"
    assert (host.package_version("nvidia-driver") or "").startswith(driver["version"])
    assert "nvidia-driver" in host.holds()
    # DKMS knows the module; with no headers for this kernel it has built nothing.
    assert "nvidia-current" in host.sudo("dkms status 2>&1 || true")
    source = host.read("/etc/apt/sources.list.d/umprov-debian-non-free.sources")
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in source


def test_distribution_driver_second_run_changes_nothing(
    faults_lab: Lab, distribution_run: tuple[Provisioned, str, str]
) -> None:
    host = faults_lab.hosts[2]
    assert distribution_run[0].exit_code == 0, distribution_run[0].explain()
    before = host.pid1_start()
    again = provision(FAULTS, "--limit", host.name, *DISTRIBUTION_DRIVER)
    assert again.exit_code == 0, again.explain()
    assert again.hosts[host.name]["changed"] == 0, again.hosts[host.name]["changed_tasks"]
    assert host.pid1_start() == before, "rebooted although nothing changed"


@pytest.fixture(scope="module")
def wrong_key_url(faults_lab: Lab) -> str:
    """A key that did not sign the lab repository, served next to it."""
    with tempfile.TemporaryDirectory() as home:
        gpg = ["gpg", "--batch", "--homedir", home, "--pinentry-mode", "loopback"]
        subprocess.run(
            [
                *gpg,
                "--passphrase",
                "",
                "--quick-gen-key",
                "Not the lab <x@example.invalid>",
                "ed25519",
                "sign",
                "never",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        armored = subprocess.run(
            [*gpg, "--armor", "--export"], check=True, capture_output=True, timeout=30
        ).stdout
    (faults_lab.directory / "repo" / "wrong-key.asc").write_bytes(armored)
    return f"http://umprov-lab-{FAULTS}-repo:8080/wrong-key.asc"


def test_a_signing_key_with_another_fingerprint_never_reaches_apt(
    faults_lab: Lab, wrong_key_url: str
) -> None:
    """The roles check the key they download against the fingerprints its vendor publishes (the
    lab inventory names its own key's): a swapped key is removed, naming it and the variable."""
    host = faults_lab.hosts[2]
    keyring = "/etc/apt/keyrings/umprov-nvidia-container-toolkit.asc"
    run = provision(FAULTS, "--limit", host.name, "--only", "toolkit",
                    "-e", f"nvidia_container_toolkit_repo_key_url={wrong_key_url}")
    assert run.exit_code == 10, run.explain()
    failure = run.hosts[host.name]["failure"] or ""
    assert "nvidia_container_toolkit_repo_key_fingerprints" in failure, failure
    assert "wrong-key.asc has fingerprint" in failure, failure
    assert not host.exists(keyring)
    assert host.package_version("nvidia-container-toolkit") is None


def test_repository_signed_by_another_key_fails_naming_it(
    faults_lab: Lab, wrong_key_url: str
) -> None:
    # Last on this host: its toolkit source stays broken afterwards, and a broken source fails
    # every later apt update on the host, whichever role runs it. The fingerprint check is
    # turned off, so that the wrong key reaches apt: apt itself must refuse the repository.
    host = faults_lab.hosts[2]
    run = provision(
        FAULTS,
        "--limit",
        host.name,
        "--only",
        "toolkit",
        "-e",
        f"nvidia_container_toolkit_repo_key_url={wrong_key_url}",
        "-e",
        "nvidia_container_toolkit_repo_key_fingerprints=[]",
    )
    assert run.exit_code == 10, run.explain()
    result = run.hosts[host.name]
    assert result["status"] == "failed"
    failure = result["failure"] or ""
    assert "libnvidia-container" in failure, failure
    assert "NO_PUBKEY" in failure or "not signed" in failure or "GPG" in failure, failure
    assert host.package_version("nvidia-container-toolkit") is None


def test_run_with_the_key_fixed_repairs_the_broken_source(
    faults_lab: Lab, wrong_key_url: str
) -> None:
    # The host keeps the toolkit source signed by the wrong key from the test above, so a full
    # apt-get update fails on it. The whole site.yml must still get through the driver and Docker
    # roles (which fetch only their own sources) to the toolkit role, which fixes the key.
    host = faults_lab.hosts[2]
    assert host.package_version("nvidia-container-toolkit") is None
    full_update = host.sudo("apt-get update -q >/dev/null 2>&1; echo $?").strip()
    assert full_update != "0", "the planted broken source should fail a full apt-get update"
    run = provision(
        FAULTS, "--limit", host.name,
        "-e", "nvidia_driver_source=distribution", "-e", "nvidia_driver_branch=535",
    )
    assert run.exit_code == 0, run.explain()
    assert host.package_version("nvidia-container-toolkit") == TOOLKIT_VERSION
    assert host.sudo("apt-get update -q >/dev/null 2>&1; echo $?").strip() == "0"


# ---------------------------------------------------------------------------------------------
# A repository already configured by hand under another name and keyring


def test_a_second_source_with_another_key_is_taken_back_naming_it(faults_lab: Lab) -> None:
    """Hosts set up from a vendor's guide (cuda-keyring, Docker's docs) already name the
    repository with their own keyring: adding the role's source beside it would make apt refuse
    every source. The role takes its source back and names the other one; apt keeps working."""
    from umprov_lab.inventory import lab_role_vars

    host = faults_lab.hosts[3]
    url = lab_role_vars(FAULTS)["nvidia_container_toolkit_repo_url"]
    key = (faults_lab.directory / "repo" / "umprov-lab.asc").read_text()
    host.sudo(f"printf '%s' {shlex.quote(key)} > /usr/share/keyrings/by-hand.asc")
    host.sudo(f"echo 'deb [signed-by=/usr/share/keyrings/by-hand.asc] {url} /' "
              "> /etc/apt/sources.list.d/by-hand.list")
    assert host.run("apt-cache policy >/dev/null").returncode == 0  # one source: fine
    run = provision(FAULTS, "--limit", host.name, "--only", "toolkit")
    assert run.exit_code == 10, run.explain()
    failure = run.hosts[host.name]["failure"] or ""
    assert "/etc/apt/sources.list.d/by-hand.list" in failure, failure
    assert "Conflicting values set for option Signed-By" in failure, failure
    assert not host.exists("/etc/apt/sources.list.d/umprov-nvidia-container-toolkit.sources")
    assert host.run("apt-cache policy >/dev/null").returncode == 0, "apt left unable to read"
    # With the hand-made source gone the role configures its own and goes on.
    host.sudo("rm /etc/apt/sources.list.d/by-hand.list")
    again = provision(FAULTS, "--limit", host.name, "--only", "toolkit")
    assert again.exit_code == 0, again.explain()
    assert host.package_version("nvidia-container-toolkit") == TOOLKIT_VERSION



def test_debian_driver_and_module_without_a_common_version_stop_before_installing(
    faults_lab: Lab,
) -> None:
    """A real Debian 12 host has bookworm-security, which updates nvidia-driver but not the open
    kernel module package (contrib): pinned to one version they cannot both be installed. The
    role stops naming both and the way out; the proprietary module follows the updates."""
    host = faults_lab.hosts[3]
    host.sudo("echo 'deb http://deb.debian.org/debian-security bookworm-security main contrib "
              "non-free non-free-firmware' > /etc/apt/sources.list.d/security.list")
    host.sudo("apt-get update -qq")  # as on a real host: the security lists are read
    debian = ("--only", "driver", "-e", "nvidia_driver_source=distribution",
              "-e", "nvidia_driver_branch=535")
    run = provision(FAULTS, "--limit", host.name, *debian)
    assert run.exit_code == 10, run.explain()
    failure = run.hosts[host.name]["failure"] or ""
    assert "has no matching nvidia-open-kernel-dkms (apt has 535.261.03-1" in failure, failure
    assert "nvidia_driver_kernel_module: proprietary" in failure, failure
    assert host.package_version("nvidia-driver") is None
    again = provision(FAULTS, "--limit", host.name, *debian,
                      "-e", "nvidia_driver_kernel_module=proprietary")
    assert again.exit_code == 0, again.explain()
    driver = host.package_version("nvidia-driver") or ""
    assert driver.startswith("535.") and host.package_version("nvidia-kernel-dkms") == driver
