"""Verdicts: ratio thresholds, warn-only metrics, host verdicts, exit codes, pair records."""

from __future__ import annotations

import pytest

from umprov.errors import ExitCode
from umprov.verify import report
from umprov.verify.agent.pairs import pair_records
from umprov.verify.agent.profiles import BUILTIN_PROFILES, judge
from umprov.verify.agent.schema import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_USAGE,
    EXIT_WARN,
    exit_code_for,
    figure,
    record,
    validate_record,
    worst,
)

H200 = BUILTIN_PROFILES["h200-sxm"]


@pytest.mark.parametrize(
    ("measured", "verdict"),
    [(4270, "pass"), (4270 * 0.85, "pass"), (4270 * 0.84, "warn"), (4270 * 0.70, "warn"),
     (4270 * 0.69, "fail"), (0.0, "fail")],
)
def test_ratio_thresholds(measured, verdict):
    got, limit, expected, _why = judge(measured, "hbm_copy_gbps", H200)
    assert got == verdict
    assert expected == 4270 and limit == pytest.approx(4270 * 0.85)


def test_warn_only_metrics_never_fail():
    verdict, _limit, _exp, why = judge(0.01, "managed_fault_gbps", H200)
    assert verdict == "warn" and "warn-only" in why


def test_no_expected_value_is_informational():
    verdict, limit, expected, why = judge(123.0, "hbm_copy_gbps", BUILTIN_PROFILES["generic"])
    assert (verdict, limit, expected) == ("pass", None, None)
    assert "no expected value" in why


def test_missing_measurement_fails():
    assert judge(None, "hbm_copy_gbps", H200)[0] == "fail"
    assert judge(float("nan"), "hbm_copy_gbps", H200)[0] == "fail"


def test_not_judged_figures_pass_without_limit():
    verdict, limit, expected, _ = judge(1.0, "nccl_busbw_1g_gbps", H200, judged=False)
    assert (verdict, limit, expected) == ("pass", None, 327)


def test_figure_record_carries_measured_limit_and_verdict_side_by_side():
    rec = figure("gpu", "gpu3", "gpu.hbm_copy", 1000.0, "hbm_copy_gbps", H200, hint="reset")
    assert rec["gpu"] == 3 and rec["peer"] is None and rec["unit"] == "GB/s"
    assert rec["verdict"] == "fail" and rec["hint"] == "reset"
    assert rec["measured"] == 1000.0 and rec["limit"] == pytest.approx(3629.5)
    assert validate_record(rec) == []


def test_record_parses_pair_targets_and_drops_hints_on_pass():
    rec = record("pair", "gpu2-gpu7", "nccl.send_recv", "pass", hint="reseat")
    assert (rec["gpu"], rec["peer"], rec["hint"]) == (2, 7, None)
    with pytest.raises(ValueError):
        record("host", "host", "x", "maybe")


def test_host_verdict_is_the_worst_and_skips_do_not_count():
    assert worst(["pass", "skip", "warn"]) == "warn"
    assert worst(["pass", "fail", "warn"]) == "fail"
    assert worst(["pass", "skip"]) == "pass"
    assert worst([]) == "fail"  # nothing checked is never a pass
    assert worst(["skip"]) == "fail"


def test_exit_codes_match_the_cli_contract():
    assert (exit_code_for("pass"), exit_code_for("warn"), exit_code_for("fail")) == (
        EXIT_PASS, EXIT_WARN, EXIT_FAIL)
    assert report.exit_code("pass") == ExitCode.OK == EXIT_PASS
    assert report.exit_code("warn") == ExitCode.VERIFY_WARN == EXIT_WARN
    assert report.exit_code("fail") == ExitCode.VERIFY_FAIL == EXIT_FAIL
    assert report.exit_code("skip") == ExitCode.VERIFY_FAIL  # nothing judged is no pass
    # The agent's plain integers are umprov's documented codes (README, "Exit codes").
    assert EXIT_USAGE == ExitCode.USAGE


def _dir(src, dst, gbps, wrong=0, quick=False):
    return {"ev": "pair", "src": src, "dst": dst, "gbps": gbps, "wrong": wrong,
            "bytes": 256 << 20, "quick": quick}


def test_pair_records_one_per_pair_with_the_slower_direction():
    (rec,) = pair_records([_dir(0, 1, 353.0), _dir(1, 0, 342.0)], H200, 2)
    assert rec["target"] == "gpu0-gpu1" and rec["measured"] == 342.0
    assert rec["verdict"] == "pass" and "0->1 353.0" in rec["detail"]


def test_a_bad_link_shows_as_its_pair():
    events = []
    for a in range(4):
        for b in range(4):
            if a != b:
                slow = {a, b} == {1, 3}
                events.append(_dir(a, b, 120.0 if slow else 350.0))
    recs = {r["target"]: r for r in pair_records(events, H200, 4)}
    assert len(recs) == 6
    assert recs["gpu1-gpu3"]["verdict"] == "fail"
    assert all(r["verdict"] == "pass" for t, r in recs.items() if t != "gpu1-gpu3")


def test_a_pair_below_the_best_pair_warns_even_above_the_profile():
    profile = {**H200, "expect": {**H200["expect"], "p2p_gbps": 100}}
    events = [_dir(a, b, 200.0 if {a, b} == {0, 2} else 350.0)
              for a in range(3) for b in range(3) if a != b]
    recs = {r["target"]: r for r in pair_records(events, profile, 3)}
    assert recs["gpu0-gpu2"]["verdict"] == "warn" and "best pair" in recs["gpu0-gpu2"]["detail"]


def test_wrong_data_or_a_missing_direction_fails_the_pair():
    (wrong,) = pair_records([_dir(0, 1, 350, wrong=5), _dir(1, 0, 350)], H200, 2)
    assert wrong["verdict"] == "fail" and wrong["hint"] == "isolate"
    (half,) = pair_records([_dir(0, 1, 350)], H200, 2)
    assert half["verdict"] == "fail" and "did not report" in half["detail"]


def test_quick_pairs_are_not_judged_on_bandwidth():
    (rec,) = pair_records([_dir(0, 1, 10.0, quick=True), _dir(1, 0, 10.0, quick=True)], H200, 2)
    assert rec["verdict"] == "pass" and rec["limit"] is None
