"""Report files (--html, --junit, --prometheus) of `umprov verify` and `umprov report`: a path
that cannot be written stops the command before any host is touched, and one that fails after
the run costs neither the run's JSON nor its table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import fleet_docs
from umprov.errors import ExitCode
from umprov.paths import unwritable
from umprov.verify import history, report


@pytest.fixture
def fleet(monkeypatch) -> SimpleNamespace:
    """An inventory of two hosts that nothing contacts: the fan-out is a stand-in that
    records its calls and runs ``during`` (what happens on disk while the hosts run)."""
    import umprov.inventory
    import umprov.verify.remote as rem

    hosts = [SimpleNamespace(name=f"gpu-{i}", vars={}) for i in range(2)]
    monkeypatch.setattr(umprov.inventory, "load_inventory",
                        lambda source: SimpleNamespace(select=lambda limit: hosts))
    state = SimpleNamespace(calls=0, during=lambda: None, report=lambda name: (
        report.failed_host_report(name, "agent.connect", "unreachable")))

    def fake_verify(hs, opts, progress, forks=None):
        state.calls += 1
        state.during()
        return [state.report(h.name) for h in hs]

    monkeypatch.setattr(rem, "verify_hosts", fake_verify)
    return state


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_text("")
    return path


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--html", "{a_file}/x.html", "{a_file} is not a directory"),
    ("--junit", "{a_file}/sub/x.xml", "{a_file} is not a directory"),
    ("--prometheus", "{a_file}/sub", "{a_file} is not a directory"),
    ("--prometheus", "{tmp}/prom", "umprov_verify.prom is a directory"),
])
def test_an_unwritable_report_path_stops_verify_before_any_host(umprov_cli, fleet, tmp_path,
                                                                 a_file, option, value, words):
    (tmp_path / "prom" / "umprov_verify.prom").mkdir(parents=True)
    value, words = (s.format(a_file=a_file, tmp=tmp_path) for s in (value, words))
    result = umprov_cli("verify", "hosts.yml", "--json", option, value)
    assert result.exit_code == ExitCode.CONFIG
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"umprov: error: {option} {value}: cannot be written: ")
    assert words in line
    assert fleet.calls == 0 and result.stdout == ""
    assert not (tmp_path / "state" / "verify-history").exists()


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_made_in_is_found_by_trying(umprov_cli, fleet):
    """Permission bits do not tell: root may write anywhere but in /proc."""
    result = umprov_cli("verify", "hosts.yml", "--junit", "/proc/1/x.xml")
    assert result.exit_code == ExitCode.CONFIG and fleet.calls == 0
    assert "--junit /proc/1/x.xml: cannot be written: no file can be made in /proc/1" in (
        result.stderr)


def test_the_check_leaves_nothing_behind(tmp_path):
    assert unwritable(tmp_path / "new" / "deeper" / "x.html") is None
    assert unwritable(tmp_path / "x.html") is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verdict", ["fail", "pass"])
def test_a_file_that_fails_after_the_run_costs_neither_json_nor_table(umprov_cli, fleet,
                                                                      tmp_path, verdict):
    """The folder of the page becomes a file while the hosts run: the verdict is out, the
    other files are written, and the page's failure is one line; the exit code is the
    verdict's where it failed (what a scheduler acts on), else 4."""
    if verdict == "pass":
        fleet.report = lambda name: fleet_docs.gpu_host(name, gpus=1)
    page, junit = tmp_path / "out" / "v.html", tmp_path / "v.xml"
    fleet.during = lambda: (tmp_path / "out").write_text("")
    result = umprov_cli("verify", "hosts.yml", "--json", "--html", str(page),
                        "--junit", str(junit))
    assert result.exit_code == (ExitCode.CONFIG if verdict == "pass" else
                                json.loads(result.stdout)["exit_code"] or -1)
    run = json.loads(result.stdout)
    assert [d["host"] for d in run["hosts"]] == ["gpu-0", "gpu-1"]
    assert "gpu-1" in result.stderr and f"JUnit report: {junit}" in result.stderr
    assert junit.is_file() and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        f"umprov: error: --html {page}: not written: ")
    (entry, _other) = history.load(root=tmp_path / "state" / "verify-history")
    assert entry.host in ("gpu-0", "gpu-1")  # the run is in the history, too


@pytest.fixture
def run_file(tmp_path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report.run_document([fleet_docs.no_gpu_host()], 1.0)))
    return path


def test_report_checks_the_page_before_reading_anything(umprov_cli, run_file, a_file):
    for args in ([str(run_file)], []):
        result = umprov_cli("report", *args, "--json", "--html", f"{a_file}/x.html")
        assert result.exit_code == ExitCode.CONFIG and result.stdout == ""
        (line,) = result.stderr.splitlines()
        assert f"--html {a_file}/x.html: cannot be written: {a_file} is not a directory" in line


@pytest.mark.parametrize("source", ["run", "history"])
def test_report_prints_its_json_before_a_page_that_fails(umprov_cli, run_file, tmp_path,
                                                         monkeypatch, source):
    from umprov.verify import html

    def full_disk(path, docs, **kw):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(html, "write", full_disk)
    history.save([fleet_docs.no_gpu_host()], root=tmp_path / "state" / "verify-history")
    page = tmp_path / "p.html"
    args = [str(run_file)] if source == "run" else []
    result = umprov_cli("report", *args, "--json", "--html", str(page))
    assert result.exit_code == ExitCode.CONFIG
    assert json.loads(result.stdout)  # the run or the trends, whole
    assert result.stderr.splitlines()[-1] == (
        f"umprov: error: --html {page}: not written: No space left on device: {page}")
