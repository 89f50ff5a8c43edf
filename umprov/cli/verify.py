"""`umprov verify`: managed-memory, NCCL and health checks on every GPU, with reports."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from umprov.cli.options import (
    FiniteFloatRange,
    fan_out_width,
    forks_option,
    inventory_options,
    json_option,
    limit_option,
    not_blank,
)
from umprov.errors import ConfigError
from umprov.output import emit_json, say, say_untrusted

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest


@click.command()
@inventory_options()
@click.option("--local", is_flag=True, help="Verify this machine (runs the agent here).")
@click.option("--quick", is_flag=True, help="The fast subset: seconds, no bandwidth verdicts.")
@click.option("--passive", is_flag=True, help="Reads only, safe beside a running job: GPU count, "
              "driver, ECC and row remapping, clock slowdowns, Xids, NVLink links (no CUDA).")
@limit_option("--hosts")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write a JUnit XML report.")
@click.option("--prometheus", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Also write DIR/umprov_verify.prom for node_exporter's textfile collector.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="Also write the report as one self-contained HTML page.")
@click.option("--profile-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              metavar="F", help="Profile overrides (YAML): expected figures, ratios, limits.")
@click.option("--profile", "profile_name", metavar="NAME",
              help="Judge with this profile instead of detecting it from the GPU name.")
@click.option("--expected-gpus", type=click.IntRange(min=0), metavar="N",
              help="GPUs each host must have (default: the host's umprov_expected_gpus).")
@click.option("--timeout", type=FiniteFloatRange(min=1), default=120.0, show_default=True,
              metavar="S", help="Deadline of each test process; a hung GPU fails at it "
              "(--multi-node: of each stage, the rendezvous join included).")
@click.option("--duration", default="0", show_default=True, metavar="T",
              help="Burn-in: after the checks, load every GPU at once for T (90s, 10m, 1h), "
              "sampling clocks, temperature, power and throttling; 0: none.")
@click.option("--exclusive", is_flag=True,
              help="Fail, not warn, when another process uses a GPU (a scheduler prolog).")
@click.option("--image", metavar="IMAGE",
              help="Run the agent in a fresh container of IMAGE instead of the deployed one.")
@click.option("--python", "python", metavar="PATH",
              help="With --local: the Python that has torch (default: this one).")
@click.option("--trust-new-hosts", is_flag=True,
              help="Record the host keys of hosts never seen before (first contact only).")
@click.option("--multi-node", "multi_node", is_flag=True,
              help="One job across the hosts: torchrun per host, c10d rendezvous on the first.")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default="nccl", show_default=True,
              help="With --multi-node: gloo runs the same path on CPU (no GPU needed).")
@click.option("--rendezvous", metavar="HOST:PORT",
              help="With --multi-node: the rendezvous endpoint (default: the first host's "
              "address and umprov_rendezvous_port).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), metavar="N",
              help="With --multi-node: ranks per host (default: its GPUs; gloo: 1).")
@click.option("--launcher", type=click.Choice(["ssh", "slurm"]), default="ssh",
              show_default=True, help="With --multi-node: who starts torchrun on each host: "
              "umprov over SSH, or one srun on a Slurm submit host (docs/slurm.md).")
@click.option("--slurm-submit-host", metavar="HOST", callback=not_blank,
              help="With --launcher slurm: the inventory host srun runs on (default: the first "
              "host of group slurm_controller).")
@click.option("--slurm-partition", metavar="NAME", help="With --launcher slurm: srun's "
              "--partition.")
@click.option("--slurm-account", metavar="NAME", help="With --launcher slurm: srun's --account.")
@click.option("--events", type=click.Path(file_okay=False, exists=True, path_type=Path),
              metavar="DIR", help="With --multi-node: judge the folder a job submitted with "
              "docs/examples/multinode.sbatch left (no host is contacted).")
@click.option("--all-rows/--problems-only", default=True, show_default=True,
              help="Table rows for every check, or only warnings and failures.")
@forks_option
@json_option
def verify(
    inventory: InventoryRequest,
    local: bool,
    quick: bool,
    passive: bool,
    limit: str | None,
    junit: Path | None,
    prometheus: Path | None,
    html_path: Path | None,
    profile_file: Path | None,
    profile_name: str | None,
    expected_gpus: int | None,
    timeout: float,
    duration: str,
    exclusive: bool,
    image: str | None,
    python: str | None,
    trust_new_hosts: bool,
    multi_node: bool,
    backend: str,
    rendezvous: str | None,
    nproc_per_node: int | None,
    launcher: str,
    slurm_submit_host: str | None,
    slurm_partition: str | None,
    slurm_account: str | None,
    events: Path | None,
    all_rows: bool,
    forks: int | None,
    as_json: bool,
) -> int:
    """Prove every GPU healthy: health, GEMM, bandwidth, managed memory, NCCL.

    Exit code 0 when every check passes, 12 with warnings only, 13 with a failing check
    (no GPU visible is a failure, never a pass), 11 when the only failures are hosts that
    could not be reached.

    \b
    umprov verify --local                       this machine
    umprov verify inventory/hosts.yml --quick   every host's deployed container, in parallel
    umprov verify hosts --passive               reads only, beside running jobs (seconds)
    umprov verify hosts --image nvcr.io/nvidia/pytorch:25.01-py3 --junit verify.xml
    umprov verify hosts --prometheus /var/lib/node_exporter/textfile
    umprov verify hosts --html verify.html      a page to look at; umprov report: trends
    umprov verify hosts --multi-node            one torchrun job over every host's GPUs
    umprov verify hosts --multi-node --launcher slurm   the same job, started by srun
    umprov verify --multi-node --events umprov-mn-4242  judge a job run with sbatch
    umprov verify --local --duration 10m        a ten-minute burn-in after the checks
    """
    from umprov.verify.agent.burnin import parse_duration

    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None
    check_combinations(inventory, click.get_current_context().params, seconds)
    check_report_paths(junit=junit, prometheus=prometheus, html_path=html_path)
    slurm = {"submit_host": slurm_submit_host, "partition": slurm_partition,
             "account": slurm_account}
    overrides = profile_overrides(profile_file, profile_name)
    started = time.monotonic()
    if events:
        from umprov.verify.multinode_files import judge_job_dir

        docs = judge_job_dir(events)
    elif multi_node:
        docs = run_multinode(inventory, limit=limit, backend=backend, rendezvous=rendezvous,
                             timeout=timeout, nproc_per_node=nproc_per_node,
                             trust_new=trust_new_hosts,
                             slurm=slurm if launcher == "slurm" else None)
    elif local:
        from umprov.verify.local import run_local

        docs = [run_local(quick=quick, timeout=timeout, expected_gpus=expected_gpus,
                          overrides=overrides, python=python, duration=seconds,
                          exclusive=exclusive, passive=passive)]
    else:
        docs = run_inventory(inventory, limit=limit, quick=quick, timeout=timeout,
                             expected_gpus=expected_gpus, overrides=overrides, image=image,
                             trust_new=trust_new_hosts, duration=seconds, exclusive=exclusive,
                             passive=passive, forks=forks)
    return write_reports(docs, time.monotonic() - started, junit=junit, prometheus=prometheus,
                         html_path=html_path, as_json=as_json, all_rows=all_rows)


def check_combinations(inventory: InventoryRequest, p: dict[str, Any], seconds: float) -> None:
    """Options that do not go together stop here, before any host is touched; ``p``: the
    command's parameters by name (Click's), ``seconds``: --duration read."""
    if p["local"] and inventory.sources:
        raise ConfigError("give an INVENTORY or --local, not both")
    if p["local"] and p["image"]:
        raise ConfigError("--image runs the agent in containers on inventory hosts, not --local")
    if p["image"] is not None:
        from umprov.deploy.options import check_image

        check_image(p["image"])
    if p["passive"] and (p["quick"] or seconds or p["exclusive"] or p["multi_node"]):
        raise ConfigError("--passive reads only: --quick, --duration, --exclusive and "
                          "--multi-node do not apply")
    if p["python"] and not p["local"]:
        raise ConfigError("--python applies to --local only")
    if p["forks"] and (p["local"] or p["multi_node"] or p["events"]):
        raise ConfigError("--forks applies to per-host runs over an inventory, not --local, "
                          "--multi-node or --events")
    if not p["multi_node"] and (p["rendezvous"] or p["nproc_per_node"] or p["backend"] != "nccl"
                                or p["launcher"] != "ssh"):
        raise ConfigError("--backend, --rendezvous, --nproc-per-node and --launcher apply to "
                          "--multi-node")
    if p["events"] and (not p["multi_node"] or inventory.sources or p["launcher"] != "ssh"
                        or p["rendezvous"]):
        raise ConfigError("--events judges a finished job: with --multi-node, without an "
                          "INVENTORY, --launcher or --rendezvous")
    if p["launcher"] != "slurm" and any(p[k] for k in ("slurm_submit_host", "slurm_partition",
                                                      "slurm_account")):
        raise ConfigError("--slurm-submit-host, --slurm-partition and --slurm-account apply to "
                          "--launcher slurm")
    if p["multi_node"] and (p["local"] or p["image"] or p["quick"] or p["profile_file"]
                            or p["profile_name"] or p["expected_gpus"] is not None or seconds
                            or p["exclusive"]):
        raise ConfigError("--multi-node runs in the deployed containers' image; --local, "
                          "--image, --quick, --profile*, --expected-gpus, --duration and "
                          "--exclusive do not apply")


def check_report_paths(*, junit: Path | None, prometheus: Path | None,
                       html_path: Path | None) -> None:
    """A report file that could not be written stops here, before any host is touched."""
    from umprov.cli.outputs import check_writable
    from umprov.verify.report import PROM_FILE

    check_writable("--junit", junit)
    check_writable("--prometheus", prometheus, prometheus and prometheus / PROM_FILE)
    check_writable("--html", html_path)


def profile_overrides(profile_file: Path | None, profile_name: str | None) -> dict[str, Any]:
    """The --profile-file overrides, with --profile's name checked against the known ones."""
    from umprov.verify.profiles import load_overrides, resolve

    overrides = load_overrides(profile_file) if profile_file else {}
    if profile_name:
        known = resolve(overrides)
        if profile_name not in known:
            raise ConfigError(f"profile {profile_name!r} does not exist "
                              f"(known: {', '.join(sorted(known))})")
        overrides = {**overrides, "profile": profile_name}
    return overrides


def write_reports(docs: list[dict], elapsed: float, *, junit: Path | None,
                  prometheus: Path | None, html_path: Path | None, as_json: bool,
                  all_rows: bool) -> int:
    """The history, the JSON on stdout and the table on stderr, then the files asked for (one
    that cannot be written is a ConfigError once the verdict is out); the run's exit code."""
    from umprov.cli.outputs import ReportFile, write_files
    from umprov.verify import html, report

    keep_history(docs)
    run_doc = report.run_document(docs, elapsed)
    if as_json:
        emit_json(run_doc)
    report.print_report(docs, all_rows=all_rows)
    say_untrusted([report.outcome(d) for d in docs])
    code = int(run_doc["exit_code"])
    write_files([
        ReportFile("--junit", junit, "JUnit", lambda p: report.write_junit(p, docs)),
        ReportFile("--prometheus", prometheus, "Prometheus",
                   lambda p: report.write_prometheus(p, docs)),
        ReportFile("--html", html_path, "HTML", lambda p: html.write(p, docs, seconds=elapsed)),
    ], verdict=code)
    return code


def keep_history(docs: list[dict]) -> None:
    """Every run adds its host reports to the history (umprov report); a history that cannot
    be written costs a line, never the run's verdict."""
    from umprov.errors import UmprovError
    from umprov.verify import history

    try:
        history.save(docs)
    except (OSError, UmprovError) as exc:
        say(f"umprov: the run was not added to the history: {exc}")


def run_inventory(inventory: InventoryRequest, *, limit: str | None, quick: bool, timeout: float,
                  expected_gpus: int | None, overrides: dict[str, Any], image: str | None,
                  trust_new: bool, duration: float = 0.0, exclusive: bool = False,
                  passive: bool = False, forks: int | None = None) -> list[dict]:
    from umprov.cli._progress import HostProgress
    from umprov.inventory import load_inventory
    from umprov.verify.profiles import check_host_profiles
    from umprov.verify.remote import VerifyOptions, verify_hosts

    hosts = list(load_inventory(inventory).select(limit))
    check_host_profiles(hosts, overrides)
    opts = VerifyOptions(quick=quick, timeout=timeout, expected_gpus=expected_gpus, image=image,
                         profile=overrides or None, trust_new=trust_new, duration=duration,
                         exclusive=exclusive, passive=passive)
    with HostProgress([h.name for h in hosts]) as progress:
        return verify_hosts(hosts, opts, progress=progress,
                            forks=fan_out_width(forks, len(hosts)))


def run_multinode(inventory: InventoryRequest, *, limit: str | None, backend: str,
                  rendezvous: str | None, timeout: float, nproc_per_node: int | None,
                  trust_new: bool, slurm: dict[str, str | None] | None = None) -> list[dict]:
    """The multi-node job; ``slurm`` (submit_host, partition, account): Slurm launches it."""
    from umprov.cli._progress import HostProgress
    from umprov.inventory import load_inventory
    from umprov.verify.multinode import verify_multinode
    from umprov.verify.multinode_plan import MultiNodeOptions, parse_endpoint

    if rendezvous:
        parse_endpoint(rendezvous)  # a bad value fails before any host is touched
    inv = load_inventory(inventory)
    hosts = list(inv.select(limit))
    launcher = None
    if slurm is not None:
        from umprov.verify import slurm_launch as sl

        hosts = sl.compute_hosts(hosts, limited=limit is not None)
        submit = sl.pick_submit_host(inv.hosts, slurm["submit_host"], inv.source)
        launcher = sl.SlurmLauncher(submit, sl.SlurmOptions(slurm["partition"], slurm["account"]),
                                    trust_new=trust_new)
    opts = MultiNodeOptions(backend=backend, rendezvous=rendezvous, timeout=timeout,
                            nproc_per_node=nproc_per_node, trust_new=trust_new)
    names = [h.name for h in hosts] + ([launcher.submit.name] if launcher else [])
    with HostProgress(list(dict.fromkeys(names))) as progress:
        return verify_multinode(hosts, opts, progress=progress, launcher=launcher)
