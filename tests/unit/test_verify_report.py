"""The report: JSON schema validation, terminal rows, JUnit XML and the Prometheus textfile."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import pytest

from umprov.verify import report
from umprov.verify.agent import schema
from umprov.verify.agent.schema import SCHEMA_VERSION, record, worst


def host_doc(host: str = "gpu-1", records: list[dict] | None = None) -> dict:
    records = records if records is not None else [
        record("host", "host", "host.gpu_count", "pass", measured=8, unit="GPUs", limit=8),
        record("gpu", "gpu0", "gpu.hbm_copy", "warn", measured=3500.0, unit="GB/s",
               limit=3629.5, expected=4270, hint="reset", detail='below "limit"'),
        record("pair", "gpu0-gpu1", "nccl.send_recv", "fail", measured=120.0, unit="GB/s",
               limit=297.5, hint="reseat", detail="slow link"),
        record("gpu", "gpu1", "gpu.gemm_bf16_rate", "fail", hint="reset", reason="timeout",
               detail="timeout: no result within 20 s"),
        record("host", "host", "host.fabric_manager", "skip", detail="no NVSwitch seen"),
    ]
    summary = dict.fromkeys(("pass", "warn", "fail", "skip"), 0)
    for r in records:
        summary[r["verdict"]] += 1
    verdict = worst(r["verdict"] for r in records)
    return {
        "schema": "umprov.verify.host", "schema_version": SCHEMA_VERSION,
        "agent_version": "0.1.0", "host": host, "started": "2026-11-30T12:00:00Z",
        "wall_s": 12.5, "mode": "full", "verdict": verdict,
        "exit_code": int(report.exit_code(verdict)), "profile": "h200-sxm",
        "summary": summary, "facts": {}, "records": records,
    }


def test_a_well_formed_document_validates():
    doc = host_doc()
    assert doc["verdict"] == "fail"
    assert report.validate(doc) == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("records"), "missing field records"),
        (lambda d: d.update(schema_version=2), "schema_version 2 is not 1"),
        (lambda d: d.update(schema="other"), "schema is 'other'"),
        (lambda d: d.update(verdict="pass"), "verdict does not match"),
        (lambda d: d.update(verdict="great"), "verdict 'great'"),
        (lambda d: d["records"][0].update(verdict="ok"), "records[0]: verdict 'ok'"),
        (lambda d: d["records"][1].update(hint="pray"), "records[1]: hint 'pray'"),
        (lambda d: d["records"][2].pop("limit"), "records[2]: missing field limit"),
        (lambda d: d["records"][0].update(scope="rack"), "scope 'rack'"),
        (lambda d: d.update(wall_s="fast"), "field wall_s has type str"),
    ],
)
def test_schema_violations_are_named(mutate, problem):
    doc = copy.deepcopy(host_doc())
    mutate(doc)
    assert any(problem in p for p in report.validate(doc)), report.validate(doc)


def test_checked_turns_an_invalid_report_into_a_failing_one():
    doc = report.checked({"schema": "nonsense"}, "gpu-9")
    assert report.validate(doc) == []
    assert doc["verdict"] == "fail" and doc["host"] == "gpu-9"
    assert "not valid" in doc["records"][0]["detail"]


def test_failed_host_report_is_valid_and_fails():
    doc = report.failed_host_report("gpu-2", "agent.connect", "host unreachable")
    assert report.validate(doc) == []
    assert doc["exit_code"] == 13 and doc["records"][0]["check"] == "agent.connect"


def test_every_host_document_has_one_shape():
    """The agent's run, a host it never ran on and a multi-node host: one builder, one shape."""
    from umprov.verify.multinode_judge import HostRun, host_reports

    failed = report.failed_host_report("gpu-2", "agent.connect", "host unreachable")
    (multi,) = host_reports([HostRun("gpu-3", error="unreachable: gpu-3")], backend="gloo",
                            endpoint=None, rdzv_id="r", timeout=1, wall_s=1.234)
    local = schema.host_report("gpu-4", [record("host", "host", "x", "pass")], mode="full",
                               profile="generic", children_wall_s={}, timeline={})
    keys = ["schema", "schema_version", "agent_version", "host", "started", "wall_s", "mode",
            "verdict", "exit_code", "profile", "summary", "facts", "records"]
    assert list(failed) == list(multi) == keys
    assert [k for k in local if k not in ("children_wall_s", "timeline")] == keys
    assert (multi["exit_code"], multi["wall_s"], local["exit_code"]) == (13, 1.23, 0)
    for doc in (failed, multi, local):
        assert report.validate(doc) == []


def test_run_document_verdict_and_exit_code():
    ok = host_doc("a", [record("host", "host", "x", "pass")])
    warn = host_doc("b", [record("host", "host", "x", "warn", hint="config")])
    assert report.run_document([ok], 1.0)["exit_code"] == 0
    assert report.run_document([ok, warn], 1.0)["exit_code"] == 12
    assert report.run_document([ok, warn, host_doc()], 1.0)["exit_code"] == 13
    assert report.run_document([], 1.0)["verdict"] == "fail"


def test_a_run_whose_only_failures_are_unreachable_hosts_exits_11():
    ok = host_doc("a", [record("host", "host", "x", "pass")])
    warn = host_doc("b", [record("host", "host", "x", "warn", hint="config")])
    lost = report.failed_host_report("c", "agent.connect", "unreachable: c: connection refused")
    no_container = report.failed_host_report("d", "agent.container", "no umprov container",
                                             hint="config")
    assert report.unreachable(lost) and not report.unreachable(no_container)
    assert report.run_document([ok, lost], 1.0)["exit_code"] == 11
    assert report.run_document([ok, warn, lost], 1.0)["exit_code"] == 11
    # One reachable host failing a check is what the run is about: 13.
    assert report.run_document([ok, lost, host_doc()], 1.0)["exit_code"] == 13
    assert report.run_document([lost, no_container], 1.0)["exit_code"] == 13
    assert report.run_document([lost], 1.0)["verdict"] == "fail"


def test_table_rows_show_measured_limit_and_verdict():
    rows = report.table_rows([host_doc()])
    hbm = next(r for r in rows if r[2] == "gpu.hbm_copy")
    assert hbm[:7] == ["gpu-1", "gpu0", "gpu.hbm_copy", "3500 GB/s", "3630", "WARN", "reset"]
    problems = report.table_rows([host_doc()], all_rows=False)
    assert {r[5] for r in problems} == {"WARN", "FAIL"}


def test_junit_counts_and_elements():
    xml = report.to_junit([host_doc("a"), host_doc("b")])
    root = ET.fromstring(xml)  # noqa: S314 (our own output)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"),
            root.get("skipped")) == ("10", "2", "2", "2")
    suite = root.find("testsuite")
    assert suite.get("name") == "umprov.verify.a" and suite.get("tests") == "5"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["nccl.send_recv"].find("failure") is not None
    assert cases["nccl.send_recv"].get("classname") == "a.gpu0-gpu1"
    timeout = cases["gpu.gemm_bf16_rate"].find("error")
    assert timeout is not None and timeout.get("type") == "timeout"
    assert cases["host.fabric_manager"].find("skipped") is not None
    assert cases["gpu.hbm_copy"].find("system-out").text.startswith("WARN")
    assert cases["host.gpu_count"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["schema_version"] == "1" and props["profile"] == "h200-sxm"


SAMPLE = re.compile(r'^[a-z_]+\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\} -?[0-9.e+-]+$')


def test_prometheus_textfile_format():
    text = report.to_prometheus([host_doc()], now=1700000000.0)
    assert text.endswith("\n")
    lines = text.splitlines()
    names = set()
    for line in lines:
        if line.startswith("# HELP "):
            names.add(line.split()[2])
        elif line.startswith("# TYPE "):
            assert line.endswith(" gauge")
        else:
            assert SAMPLE.match(line), line
    assert len(names) == len([ln for ln in lines if ln.startswith("# TYPE ")])
    assert 'umprov_verify_host_verdict{host="gpu-1",profile="h200-sxm",mode="full"} 2' in lines
    assert ('umprov_verify_measured{host="gpu-1",target="gpu0",check="gpu.hbm_copy",'
            'unit="GB/s"} 3500') in lines
    assert 'umprov_verify_checks{host="gpu-1",verdict="fail"} 2' in lines
    assert "umprov_verify_last_run_timestamp_seconds{host=\"gpu-1\"} 1700000000" in lines


def test_prometheus_escapes_label_values():
    doc = host_doc('we"ird\\host\nx', [record("host", "host", "x", "pass")])
    text = report.to_prometheus([doc])
    assert 'host="we\\"ird\\\\host\\nx"' in text
    assert all(SAMPLE.match(ln) for ln in text.splitlines() if not ln.startswith("#"))


def test_prometheus_file_is_written_atomically(tmp_path):
    path = report.write_prometheus(tmp_path / "textfile", [host_doc()])
    assert path.name == "umprov_verify.prom"
    assert path.read_text().startswith("# HELP")
    assert [p.name for p in path.parent.iterdir()] == ["umprov_verify.prom"]  # no temp file left
    report.write_prometheus(tmp_path / "textfile", [host_doc("other")])
    assert 'host="other"' in path.read_text() and 'host="gpu-1"' not in path.read_text()


def test_junit_file(tmp_path):
    path = tmp_path / "out" / "verify.xml"
    report.write_junit(path, [host_doc()])
    assert ET.parse(path).getroot().get("failures") == "1"  # noqa: S314


def sweep_doc() -> dict:
    recs = [record("host", "host", "nccl.allreduce_sweep", "pass", measured=bw, unit="GB/s",
                   size_bytes=size, detail="not judged")
            for size, bw in ((8 << 10, 0.4), (1 << 30, 327.0), (4 << 30, 345.0))]
    return host_doc(records=recs)


def test_a_sweep_point_carries_its_size_and_nothing_else_does():
    doc = sweep_doc()
    assert report.validate(doc) == []
    assert [r["size_bytes"] for r in doc["records"]] == [8192, 1 << 30, 4 << 30]
    assert "size_bytes" not in record("host", "host", "nccl.busbw_1g", "pass")
    bad = copy.deepcopy(doc)
    bad["records"][0]["size_bytes"] = "8 KiB"
    assert report.validate(bad) == ["records[0]: size_bytes '8 KiB'"]


def test_sweep_points_are_distinct_series_and_rows():
    lines = report.to_prometheus([sweep_doc()], now=1.0).splitlines()
    measured = [ln for ln in lines if ln.startswith("umprov_verify_measured{")]
    assert len(measured) == len({ln.rsplit(" ", 1)[0] for ln in measured}) == 3
    assert any('size_bytes="1073741824"' in ln and ln.endswith(" 327") for ln in measured)
    checks = [r[2] for r in report.table_rows([sweep_doc()])]
    assert checks == ["nccl.allreduce_sweep 8 KiB", "nccl.allreduce_sweep 1 GiB",
                      "nccl.allreduce_sweep 4 GiB"]
    cases = ET.fromstring(report.to_junit([sweep_doc()])).iter("testcase")  # noqa: S314
    assert [c.get("name") for c in cases] == checks


def test_samples_and_timings_ride_along_in_version_1():
    doc = schema.host_report("gpu-1", [record("host", "host", "host.xid", "pass")], mode="full",
                             profile="h200-sxm",
                             timings=[{"name": "gpu.init", "start_s": 0.1, "seconds": 2.5,
                                       "gpu": 0, "child": "gpu0"}],
                             samples=[{"t": 1.0, "gpu": 0, "temp_c": 40.0, "power_w": 120.5,
                                       "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0,
                                       "throttle": []}])
    assert doc["schema_version"] == 1 and report.validate(doc) == []
