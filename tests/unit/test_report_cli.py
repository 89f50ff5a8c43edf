"""`umprov report` and `umprov verify --html`, through the CLI's real error boundary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import fleet_docs
from umprov.errors import ExitCode
from umprov.verify import history, report

FAKES = Path(__file__).resolve().parent / "verify_fakes"
DAY = 86400.0


@pytest.fixture
def run_file(tmp_path) -> Path:
    docs = [fleet_docs.healthy_pair(), fleet_docs.failing_gpu_host(), fleet_docs.no_gpu_host()]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report.run_document(docs, 20.0)))
    return path


def plant(state: Path, *, last_scale: float = 0.88, runs: int = 5) -> float:
    """A host's healthy runs a day apart, then one with every GPU figure that much lower;
    returns when the last run was saved."""
    root, now = state / "verify-history", 1_800_000_000.0
    keep = history.Retention(3650, 1 << 30, 1000)
    for k in range(runs):
        history.save([fleet_docs.gpu_host("h200-a", gpus=2, seed=k)], root=root,
                     now=now - (runs - k) * DAY, retention=keep)
    history.save([fleet_docs.gpu_host("h200-a", gpus=2, seed=9, bad={"scale": last_scale})],
                 root=root, now=now, retention=keep)
    return now


def test_run_files_become_one_page(umprov_cli, run_file, tmp_path):
    out = tmp_path / "page.html"
    result = umprov_cli("report", str(run_file), "--html", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and f"HTML report: {out}" in result.stderr
    page = out.read_text()
    assert "h200-b" in page and "gpu5" in page and page.count("data-pair=") == 28 + 1


def test_run_files_as_json_and_a_single_host_document(umprov_cli, run_file, tmp_path):
    single = tmp_path / "host.json"
    single.write_text(json.dumps(fleet_docs.no_gpu_host("solo")))
    result = umprov_cli("report", str(run_file), str(single), "--json")
    assert result.exit_code == 0
    hosts = [d["host"] for d in json.loads(result.stdout)["hosts"]]
    assert hosts == ["h200-a", "h200-b", "build-01", "solo"]
    assert "h200-b" in result.stderr  # the problem table for people


@pytest.mark.parametrize(("content", "code", "words"), [
    (None, ExitCode.USAGE, "no such file"),
    ("{not json", ExitCode.CONFIG, "not JSON"),
    ('{"schema": "umprov.verify.run", "hosts": [{"host": "x"}]}', ExitCode.CONFIG,
     "not a verify report"),
    ('{"schema": "umprov.verify.run", "hosts": 3}', ExitCode.CONFIG, "not a list"),
    ("[1, 2]", ExitCode.CONFIG, "not a verify report"),
])
def test_a_missing_or_garbled_run_file_is_one_line_naming_it(umprov_cli, tmp_path, content,
                                                              code, words):
    path = tmp_path / "bad run.json"
    if content is not None:
        path.write_text(content)
    result = umprov_cli("report", str(path), "--html", str(tmp_path / "x.html"))
    assert result.exit_code == code
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"umprov: error: {path}: ") and words in line
    assert not (tmp_path / "x.html").exists()


def test_run_files_and_an_inventory_do_not_mix(umprov_cli, run_file):
    result = umprov_cli("report", str(run_file), "hosts")
    assert result.exit_code == ExitCode.USAGE and "not both" in result.stderr
    result = umprov_cli("report", str(run_file), "--since", "3d")
    assert result.exit_code == ExitCode.CONFIG and "--since" in result.stderr


def test_a_bad_age_is_a_bad_value(umprov_cli):
    result = umprov_cli("report", "--since", "soon")
    assert result.exit_code == ExitCode.CONFIG
    assert "'soon' is not an age" in result.stderr and len(result.stderr.splitlines()) == 1


def test_an_age_too_large_for_a_number_is_a_bad_value(umprov_cli):
    result = umprov_cli("report", "--since", "9" * 400 + "d")
    assert result.exit_code == ExitCode.CONFIG
    assert "is not an age" in result.stderr and len(result.stderr.splitlines()) == 1


def test_history_flags_a_regression_with_exit_12(umprov_cli, tmp_path):
    plant(tmp_path / "state")
    result = umprov_cli("report", "--json")
    assert result.exit_code == ExitCode.VERIFY_WARN
    data = json.loads(result.stdout)
    assert data["regressions"] > 0 and data["hosts"][0]["runs"] == 6
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("REGRESSION h200-a gpu1 "
                                                                       "gpu.hbm_copy")]
    assert len(lines) == 1 and "below its median" in lines[0]
    assert "▁" in result.stderr  # the trend, drawn


def test_history_without_a_regression_exits_0(umprov_cli, tmp_path):
    plant(tmp_path / "state", last_scale=1.0)
    assert umprov_cli("report").exit_code == 0


def test_since_leaves_older_runs_out(umprov_cli, tmp_path, monkeypatch):
    now = plant(tmp_path / "state")
    monkeypatch.setattr(history.time, "time", lambda: now)
    result = umprov_cli("report", "--since", "36h", "--json")
    data = json.loads(result.stdout)
    assert data["hosts"][0]["runs"] == 2  # the last two: too few to judge
    assert result.exit_code == 0 and data["regressions"] == 0


def test_history_of_an_inventory_as_a_page(umprov_cli, tmp_path):
    plant(tmp_path / "state")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    h200-a:\n    never-verified:\n")
    out = tmp_path / "trends.html"
    result = umprov_cli("report", str(inventory), "--html", str(out))
    assert result.exit_code == ExitCode.VERIFY_WARN, result.stderr
    assert "no history for never-verified" in result.stderr
    page = out.read_text()
    assert "REGRESSED" in page and "Trends: each host against its own history" in page


def test_history_of_a_vault_encrypted_inventory_given_as_every_command_takes_it(umprov_cli,
                                                                               tmp_path):
    """-i and the vault options, as in every other command: a host named only in an
    encrypted group_vars file is read with the password file."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    plant(tmp_path / "state")
    folder = tmp_path / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "hosts.yml").write_text("all:\n  hosts:\n    h200-a:\n")
    secret = VaultLib([("default", VaultSecret(b"pw"))])
    (folder / "group_vars" / "all.yml").write_bytes(secret.encrypt("umprov_expected_gpus: 2\n"))
    password = tmp_path / "pw.txt"
    password.write_text("pw\n")
    locked = umprov_cli("report", "-i", str(folder))
    assert locked.exit_code == ExitCode.INVENTORY and "all.yml" in locked.stderr
    result = umprov_cli("report", "-i", str(folder), "--vault-password-file", str(password))
    assert result.exit_code == ExitCode.VERIFY_WARN, result.stderr
    assert "REGRESSION h200-a" in result.stderr


def test_a_damaged_history_file_is_skipped_and_named_and_the_rest_reported(umprov_cli,
                                                                          tmp_path):
    import gzip

    plant(tmp_path / "state")
    path = sorted((tmp_path / "state" / "verify-history").glob("*/*.json.gz"))[0]
    head = {"schema": history.SCHEMA, "key": path.parent.name, "saved": "yesterday"}
    path.write_bytes(gzip.compress((json.dumps(head) + "\n{}\n").encode()))
    result = umprov_cli("report", "--json")
    assert result.exit_code in (ExitCode.OK, ExitCode.VERIFY_WARN), result.stderr
    assert json.loads(result.stdout)["hosts"][0]["runs"] == 5
    (line,) = [ln for ln in result.stderr.splitlines() if "skipped" in ln]
    assert line == f"umprov: skipped {path}: damaged (saved 'yesterday' is not a time)"


def test_no_history_says_where_it_looked(umprov_cli):
    result = umprov_cli("report")
    assert result.exit_code == 0 and "no verify history" in result.stderr


def test_verify_writes_the_page_and_keeps_the_run(umprov_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES / "cpu_torch"),
                                                      os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "verify.html"
    result = umprov_cli("verify", "--local", "--html", str(out))
    assert result.exit_code == ExitCode.VERIFY_FAIL
    assert "no NVIDIA GPU visible" in out.read_text() and f"HTML report: {out}" in result.stderr
    (entry,) = history.load(root=tmp_path / "state" / "verify-history")
    assert entry.doc()["records"][0]["check"] == "host.gpu_visible"


def test_a_history_without_figures_to_trend_says_what_is_on_record(umprov_cli, tmp_path):
    """The lab's hosts (no GPU) report no figure with a unit to trend: the report says how many
    runs it holds and why there is no trend, rather than nothing."""
    state = tmp_path / "state" / "verify-history"
    for k in range(2):
        history.save([report.failed_host_report("lab-demo-1", "host.gpu_visible", "no GPU")],
                     root=state, now=1_800_000_000.0 + k)
    result = umprov_cli("report")
    assert result.exit_code == 0
    assert "lab-demo-1: 2 runs on record, the last 2027-01-15T08:00:01Z" in result.stderr
    assert "no figure to trend" in result.stderr
