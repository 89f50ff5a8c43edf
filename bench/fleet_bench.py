"""umprov's own cost per host at fleet size: hundreds of lightweight hosts, one sshd each.

    sudo .venv/bin/python bench/fleet_bench.py --hosts 16,64,256 [--forks 32] [--verify] [--deploy]

The hosts: a network namespace of this machine (``umprov-fleet``: nothing in it reaches
anything outside), one OpenSSH sshd per host on an address of its own (127.0.1.N:22, its own
host key, key-only root login), all sharing this machine's Docker engine through
``docker system dial-stdio`` (so ``umprov status`` finds an engine on every host). Needs
Debian's openssh-server (its service left off) and the docker CLI.

For each size, in the namespace, each command as users run it (a fresh state folder):
``umprov trust --yes`` (every host's key read and recorded), ``umprov status`` (SSH, the
driver probe, the engine over SSH), and the baseline measured in the same run: OpenSSH's
``ssh HOST true`` for every host, ``--forks`` at a time (xargs -P), the floor of one
handshake and one command per host. Sampled every 50 ms: the umprov process's resident
memory, threads and open files. Results: bench/results/fleet.json; curves in bench/README.md.

With --verify, also ``umprov verify --passive``: every host gets a container of its own on the
shared engine (``umprov_container_name`` fleet-N, ``sleep infinity`` in an image with python3,
by default the lab's host image), and the agent runs in each (no GPU here: every host fails its
GPU checks, as designed; the cost is the controller's: the connection, the engine session, the
agent's upload, its run and its report read back). Its baseline in the same run:
``ssh HOST docker exec fleet-N true`` for every host, --forks at a time.

With --deploy, also ``umprov deploy`` with nothing to change: one container of the PyTorch
image (``umprov lab image``) deployed once, which every host's settings name, so every host
keeps it. Its baseline in the same run: ``ssh HOST docker exec fleet-deploy
umprov-healthcheck`` (the health check deploy runs in a kept container), --forks at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import save  # noqa: E402

NS = "umprov-fleet"
REPO = HERE.parent
UMPROV = [sys.executable, "-m", "umprov"]


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def in_ns(argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", NS, *argv]


def address(i: int) -> str:
    return f"127.0.1.{i + 1}" if i < 250 else f"127.0.{2 + (i - 250) // 250}.{(i - 250) % 250 + 1}"


class Fleet:
    def __init__(self, work: Path, count: int, image: str | None = None) -> None:
        self.work, self.count, self.image = work, count, image
        self.procs: list[subprocess.Popen] = []
        self.key = work / "client_key"

    def up(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            sh("ip", "netns", "del", NS)
        sh("ip", "netns", "add", NS)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        sh(*in_ns(["ip", "link", "set", "lo", "up"]))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        auth = self.work / "authorized_keys"
        auth.write_text(Path(f"{self.key}.pub").read_text())
        auth.chmod(0o600)
        for i in range(self.count):
            d = self.work / f"h{i:04d}"
            d.mkdir()
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
            (d / "sshd_config").write_text(
                f"ListenAddress {address(i)}:22\nHostKey {d / 'host_key'}\n"
                f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {auth}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM yes\nStrictModes no\n"
                "MaxStartups 100:30:200\nMaxSessions 20\nLogLevel ERROR\n")
            self.procs.append(subprocess.Popen(in_ns(["/usr/sbin/sshd", "-D", "-e", "-f",
                                                      str(d / "sshd_config")]),
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            up = sh(*in_ns(["ss", "-Hltn"])).stdout.count(":22 ")
            if up >= self.count:
                return
            time.sleep(0.2)
        raise RuntimeError("the sshd processes did not all start")

    def containers(self) -> None:
        """One container per host for verify to find, on the shared engine, no network."""
        names = [f"fleet-{i}" for i in range(self.count)]
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
        for name in names:
            sh("docker", "run", "-d", "--name", name, "--network", "none",
               "--label", "umprov.bench=fleet", "--entrypoint", "sleep", str(self.image),
               "infinity")

    def inventory(self, name: str = "hosts.yml", **deployed: object) -> Path:
        """Every host, its container fleet-N; ``deployed``: the same variables for every host
        (the deploy bench's one shared container)."""
        path = self.work / name
        hosts = {f"h{i:04d}": {"ansible_host": address(i), "ansible_user": "root",
                               "ansible_ssh_private_key_file": str(self.key),
                               "umprov_container_name": f"fleet-{i}", **deployed}
                 for i in range(self.count)}
        path.write_text(json.dumps({"all": {"hosts": hosts}}))
        return path

    def down(self) -> None:
        if self.image:
            subprocess.run(["docker", "rm", "-f", *(f"fleet-{i}" for i in range(self.count))],
                           capture_output=True, check=False)
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            sh("ip", "netns", "del", NS)


class Sampler:
    """Peak resident memory, threads and open files of a process, every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = {"rss_mib": 0.0, "threads": 0, "open_files": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            with contextlib.suppress(OSError, ValueError, KeyError):  # KeyError: it has ended
                status = Path(f"/proc/{self.pid}/status").read_text()
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                rss = int(fields["VmRSS"].split()[0]) / 1024
                threads = int(fields["Threads"])
                files = len(os.listdir(f"/proc/{self.pid}/fd"))
                for key, value in (("rss_mib", rss), ("threads", threads),
                                   ("open_files", files)):
                    self.peak[key] = max(self.peak[key], value)

    def done(self) -> dict:
        self.stop.set()
        self.thread.join()
        return {k: round(v, 1) for k, v in self.peak.items()}


def run_umprov(args: list[str], env: dict, checkout: Path = REPO) -> dict:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(in_ns([*UMPROV, *args]), env={**env, "PYTHONPATH": str(checkout)},
                            cwd=checkout,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # ip netns exec execs the command: the pid is umprov's own
    sampler = Sampler(proc.pid)
    out, err = proc.communicate(timeout=1800)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {"seconds": round(seconds, 2), "rc": proc.returncode,
              "cpu_s": round(cpu, 2), **sampler.done()}
    if proc.returncode not in (0, 1, 6, 11, 12, 13):  # 13: verify without a GPU, as designed
        result["stderr"] = err[-500:]
    with contextlib.suppress(ValueError):
        doc = json.loads(out)
        states: dict[str, int] = {}
        for h in doc.get("hosts", []):
            if "verdict" in h:  # verify
                key = h["verdict"]
            elif "reachable" in h:  # status
                key = "reachable" if h["reachable"] else "unreachable"
            elif "container_id" in h:  # deploy
                key = h["status"]
            else:  # trust
                key = "recorded" if h.get("recorded") else "known"
            states[key] = states.get(key, 0) + 1
        result["hosts_by_state"] = states
    return result


def openssh_floor(fleet: Fleet, forks: int) -> float:
    """``ssh HOST true`` for every host, ``forks`` at a time: the floor per host."""
    known = fleet.work / "known_hosts_openssh"
    lines = [f"{address(i)} {(fleet.work / f'h{i:04d}' / 'host_key.pub').read_text()}"
             for i in range(fleet.count)]
    known.write_text("".join(lines))
    addrs = "\n".join(address(i) for i in range(fleet.count))
    cmd = (f"xargs -P {forks} -I{{}} ssh -q -o BatchMode=yes -o UserKnownHostsFile={known} "
           f"-o StrictHostKeyChecking=yes -i {fleet.key} root@{{}} true")
    started = time.perf_counter()
    subprocess.run(in_ns(["sh", "-c", cmd]), input=addrs, text=True, check=True)
    return round(time.perf_counter() - started, 2)


def docker_exec_floor(fleet: Fleet, forks: int, container: str | None = None,
                      command: str = "true") -> float:
    """``ssh HOST docker exec CONTAINER COMMAND`` for every host, ``forks`` at a time (the
    container: the host's fleet-N, or one for all): one handshake and one exec in the
    container, the floor of what verify and a deploy that changes nothing do per host."""
    known = fleet.work / "known_hosts_openssh"
    lines = "\n".join(f"{address(i)} {container or f'fleet-{i}'}" for i in range(fleet.count))
    cmd = (f"xargs -P {forks} -L1 sh -c 'ssh -q -o BatchMode=yes -o UserKnownHostsFile={known} "
           f"-o StrictHostKeyChecking=yes -i {fleet.key} root@$0 docker exec $1 {command}'")
    started = time.perf_counter()
    subprocess.run(in_ns(["sh", "-c", cmd]), input=lines, text=True, check=True)
    return round(time.perf_counter() - started, 2)


DEPLOYED = "fleet-deploy"  # the deploy bench's container, one for every host
HEALTHCHECK = "/usr/local/bin/umprov-healthcheck"


def deploy_rows(fleet: Fleet, forks: int, image: str, env: dict, old: Path | None) -> dict:
    """``umprov deploy`` that changes nothing, over every host. Every host's settings name
    the same container (one PyTorch container with sshd and Jupyter: 256 of their own would
    not fit this machine's memory), so each finds it as deployed and keeps it: per host the
    SSH connection, the engine session over it, the image and container looked up, the
    health check, the container's host key and token read, the host's files written."""
    pub = Path(f"{fleet.key}.pub")
    inv = str(fleet.inventory("deploy.yml", umprov_container_name=DEPLOYED, umprov_gpus="none",
                              umprov_ssh_port=42222, umprov_jupyter_port=48888,
                              umprov_container_limits=False))  # as the lab: no CAP_SYS_RESOURCE
    subprocess.run(["docker", "rm", "-f", DEPLOYED], capture_output=True, check=False)
    args = ["deploy", inv, "--image", image, "--authorized-key", str(pub), "--json"]
    seed = run_umprov([*args, "--limit", "h0000"], env)
    if seed["rc"] != 0:
        raise RuntimeError(f"the first deploy failed: {seed}")
    row: dict = {"docker_exec_healthcheck_s": docker_exec_floor(fleet, forks, DEPLOYED,
                                                                HEALTHCHECK)}
    row["deploy_unchanged"] = run_umprov([*args, "--forks", str(forks)], env)
    if old is not None:  # another checkout's deploy, same hosts, same run
        row["deploy_unchanged_old"] = run_umprov([*args, "--forks", str(forks)], env, old)
    row["deploy_vs_docker_exec"] = round(row["deploy_unchanged"]["seconds"]
                                         / row["docker_exec_healthcheck_s"], 2)
    row["deploy_cpu_per_host_ms"] = round(row["deploy_unchanged"]["cpu_s"] / fleet.count
                                          * 1000, 1)
    return row


def one_size(count: int, forks: int, image: str | None, deploy_image: str | None,
             old: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="umprov-fleet-") as tmp:
        work = Path(tmp)
        fleet = Fleet(work, count, image)
        try:
            fleet.up()
            inv = str(fleet.inventory())
            env = {**os.environ, "UMPROV_STATE_DIR": str(work / "state")}
            row: dict = {"hosts": count, "forks": forks}
            row["openssh_true_s"] = openssh_floor(fleet, forks)
            row["trust"] = run_umprov(["trust", "h*", "-i", inv, "--yes", "--forks",
                                       str(forks), "--json"], env)
            row["status"] = run_umprov(["status", inv, "--forks", str(forks), "--json"], env)
            row["status_per_host_ms"] = round(row["status"]["seconds"] / count * 1000, 1)
            row["status_cpu_per_host_ms"] = round(row["status"]["cpu_s"] / count * 1000, 1)
            row["status_vs_openssh"] = round(row["status"]["seconds"]
                                             / row["openssh_true_s"], 2)
            if image:
                fleet.containers()
                row["docker_exec_true_s"] = docker_exec_floor(fleet, forks)
                row["verify_passive"] = run_umprov(["verify", inv, "--passive", "--forks",
                                                    str(forks), "--json"], env)
                row["verify_per_host_ms"] = round(row["verify_passive"]["seconds"] / count
                                                  * 1000, 1)
                row["verify_cpu_per_host_ms"] = round(row["verify_passive"]["cpu_s"] / count
                                                      * 1000, 1)
                row["verify_vs_docker_exec"] = round(row["verify_passive"]["seconds"]
                                                     / row["docker_exec_true_s"], 2)
            if deploy_image:
                row.update(deploy_rows(fleet, forks, deploy_image, env, old))
            return row
        finally:
            fleet.down()
            if deploy_image:
                subprocess.run(["docker", "rm", "-f", DEPLOYED], capture_output=True,
                               check=False)


def process(d: dict) -> str:
    """An umprov run's peak memory, threads and open files, as a line shows them."""
    return f"peak {d['rss_mib']} MiB, {d['threads']} threads, {d['open_files']} files"


def say(row: dict, old: Path | None) -> None:
    """One size's figures, a line each, on stderr."""
    lines = [f"{row['hosts']:5} hosts: openssh {row['openssh_true_s']:6.2f} s  trust "
             f"{row['trust']['seconds']:6.2f} s  status {row['status']['seconds']:6.2f} s "
             f"({row['status_per_host_ms']} ms a host, umprov's CPU "
             f"{row['status_cpu_per_host_ms']} ms a host, {row['status_vs_openssh']}x openssh)  "
             + process(row["status"])]
    if "verify_passive" in row:
        v = row["verify_passive"]
        lines.append(f"verify --passive {v['seconds']:6.2f} s ({row['verify_per_host_ms']} ms a "
                     f"host, umprov's CPU {row['verify_cpu_per_host_ms']} ms a host)  "
                     + process(v))
    if "deploy_unchanged" in row:
        d = row["deploy_unchanged"]
        lines.append(f"deploy (unchanged) {d['seconds']:6.2f} s, {row['deploy_vs_docker_exec']}x"
                     f" ssh+docker exec {row['docker_exec_healthcheck_s']} s, umprov's CPU "
                     f"{row['deploy_cpu_per_host_ms']} ms a host, {process(d)}, "
                     f"{d.get('hosts_by_state')}")
    if "deploy_unchanged_old" in row:
        d = row["deploy_unchanged_old"]
        lines.append(f"the same, {old}: {d['seconds']:6.2f} s, {process(d)}, "
                     f"{d.get('hosts_by_state')}")
    print(f"\n{'':11} ".join(lines), file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="16,64,256")
    ap.add_argument("--forks", type=int, default=32)
    ap.add_argument("--verify", action="store_true", help="also umprov verify --passive")
    ap.add_argument("--image", help="image with python3 for the hosts' containers (--verify; "
                    "default: the newest umprov-lab-host image)")
    ap.add_argument("--deploy", action="store_true",
                    help="also umprov deploy with nothing to change (needs `umprov lab image`)")
    ap.add_argument("--old", type=Path, metavar="CHECKOUT",
                    help="--deploy: also that checkout's umprov deploy, in the same run")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("sshd", path="/usr/sbin:/usr/bin"):
        sys.exit("needs root and Debian's openssh-server (its service may stay off)")
    image = None
    if args.verify:
        image = args.image or sh("docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                                 "umprov-lab-host").stdout.split("\n")[0].strip()
        if not image:
            sys.exit("--verify needs an image with python3: --image, or `umprov lab up` once")
    deploy_image = None
    if args.deploy:
        from umprov_lab.image import LAB_TAG

        if sh("docker", "images", "-q", LAB_TAG).stdout.strip() == "":
            sys.exit(f"--deploy needs the image {LAB_TAG}: `umprov lab image` builds it")
        deploy_image = LAB_TAG
    rows = [one_size(int(n), args.forks, image, deploy_image, args.old)
            for n in args.hosts.split(",")]
    for row in rows:
        say(row, args.old)
    save("fleet", {"rows": rows})


if __name__ == "__main__":
    main()
