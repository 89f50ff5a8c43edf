"""The Prometheus textfile: values exact, and every metric and label documented."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests import fleet_docs
from umprov.verify import report
from umprov.verify.agent.schema import host_report, record

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
LINE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>.*)\} (?P<value>\S+)$")


def samples(text: str) -> list[re.Match]:
    return [LINE.match(ln) for ln in text.splitlines() if not ln.startswith("#")]


def test_the_timestamp_keeps_every_digit():
    now = 1764636952.123456
    text = report.to_prometheus([fleet_docs.no_gpu_host()], now=now)
    (stamp,) = [m for m in samples(text) if m["name"].endswith("timestamp_seconds")]
    assert stamp["value"] == "1764636952.123456" and float(stamp["value"]) == now


def test_every_value_reads_back_as_the_one_written():
    big = 2**60 + 1  # bytes free on some day; a float would round it
    recs = [record("gpu", "gpu0", "managed.roundtrip_exact", "fail", measured=big,
                   unit="bytes free", limit=1 << 40),
            record("gpu", "gpu0", "x.ratio", "pass", measured=0.5, unit="x", limit=0.1 + 0.2),
            record("gpu", "gpu0", "x.flag", "pass", measured=True)]
    doc = host_report("h", recs, mode="full", profile="generic", wall_s=12345.678)
    text = report.to_prometheus([doc, fleet_docs.gpu_host("g", gpus=2)], now=1.5e9 + 0.25)
    values = {(m["name"], m["labels"]): m["value"] for m in samples(text)}
    assert values[("umprov_verify_measured",
                   'host="h",target="gpu0",check="managed.roundtrip_exact",unit="bytes free"')
                  ] == str(big)
    assert values[("umprov_verify_limit", 'host="h",target="gpu0",check="x.ratio",unit="x"')
                  ] == "0.30000000000000004"  # the record's limit, as the float it is
    assert values[("umprov_verify_measured", 'host="h",target="gpu0",check="x.flag",unit=""')
                  ] == "1"
    assert values[("umprov_verify_duration_seconds", 'host="h"')] == "12345.68"
    for m in samples(text):
        assert not re.search(r"e[+-]", m["value"]), m.group(0)  # no rounded exponent form


@pytest.mark.parametrize(("value", "text"), [(math.nan, "NaN"), (math.inf, "+Inf"),
                                             (-math.inf, "-Inf"), (3.0, "3"), (7, "7"),
                                             (False, "0"), (1e300, repr(1e300))])
def test_special_values(value, text):
    assert report.sample_value(value) == text


def test_every_metric_and_label_is_documented():
    doc = fleet_docs.failing_gpu_host()
    text = report.to_prometheus([doc, fleet_docs.no_gpu_host()])
    guide = DOCS.read_text()
    names = {m["name"] for m in samples(text)}
    labels = {re.match(r"(\w+)=", part)[1] for m in samples(text)
              for part in re.findall(r'\w+="(?:[^"\\]|\\.)*"', m["labels"])}
    assert len(names) == 7 and labels == {"host", "profile", "mode", "verdict", "target",
                                          "check", "hint", "unit"}
    for name in names:
        assert f"`{name}`" in guide, name
    for label in labels:
        assert f"`{label}`" in guide, label
    for help_line in re.findall(r"^# HELP (\S+) ", text, flags=re.M):
        assert help_line in names


def test_each_series_once_also_for_a_bandwidth_sweep():
    docs = [fleet_docs.healthy_pair(), fleet_docs.failing_gpu_host()]  # the first has a sweep
    series = [(m["name"], m["labels"]) for m in samples(report.to_prometheus(docs))]
    assert len(series) == len(set(series))
    sweep = [lb for name, lb in series if name == "umprov_verify_measured"
             and 'check="nccl.allreduce_sweep"' in lb]
    assert len(sweep) == 6 and 'size_bytes="1073741824"' in " ".join(sweep)
