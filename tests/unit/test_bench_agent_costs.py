"""bench/agent_costs.py's arithmetic (its GPU runs: bench/README)."""

from __future__ import annotations

import sys

from tests.conftest import REPO

if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

import agent_costs  # noqa: E402


def test_each_window_position_gets_its_median_and_spread_over_the_bursts_that_reached_it():
    rates = [[800.0, 760.0, 700.0], [780.0, 740.0], [], [820.0, 750.0, 705.0]]
    assert agent_costs.spread(rates) == [
        {"window": 0, "median": 800.0, "max_over_min": round(820 / 780, 4)},
        {"window": 1, "median": 750.0, "max_over_min": round(760 / 740, 4)},
    ]  # a burst that failed (empty) is left out; the shortest one bounds the windows


def test_every_variant_keeps_nvlink_multicast_off():
    for env in agent_costs.VARIANTS.values():
        assert not {"NCCL_NVLS_ENABLE", *agent_costs.NVLS_OFF} & set(env)
    assert agent_costs.NVLS_OFF["NCCL_NVLS_ENABLE"] == "0"
