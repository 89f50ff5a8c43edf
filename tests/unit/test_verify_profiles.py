"""Verifier profiles: built-ins, selection by GPU name, overrides and their validation."""

from __future__ import annotations

import json

import pytest

from umprov.errors import ConfigError, ExitCode
from umprov.verify.agent.profiles import (
    BUILTIN_PROFILES,
    LIMITS,
    METRICS,
    load_profile_file,
    merge_profiles,
    select_profile,
)
from umprov.verify.profiles import load_overrides, resolve, write_agent_profile


def test_builtin_profiles_are_complete_and_consistent():
    assert {"h200-sxm", "h100-sxm", "h100-pcie", "a100-sxm-80gb", "generic"} <= set(
        BUILTIN_PROFILES)
    for name, prof in BUILTIN_PROFILES.items():
        assert prof["name"] == name
        assert set(prof["expect"]) <= set(METRICS), name
        assert set(prof["limits"]) == set(LIMITS), name
        for key, (p, w) in prof["ratios"].items():
            assert key == "default" or key in METRICS
            assert 0 <= w <= p <= 2
        assert all(v > 0 for v in prof["expect"].values())
    assert BUILTIN_PROFILES["generic"]["expect"] == {}
    # the H200 figures are the measured ones (bench/README.md), not the spec sheet's
    h200 = BUILTIN_PROFILES["h200-sxm"]["expect"]
    assert h200["hbm_copy_gbps"] < 4800 and h200["nccl_busbw_4g_gbps"] == 345


@pytest.mark.parametrize(
    ("gpu", "profile"),
    [
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "generic"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-PCIE-40GB", "generic"),
        ("Tesla T4", "generic"),
        (None, "generic"),
    ],
)
def test_profile_is_chosen_by_gpu_name(gpu, profile):
    assert select_profile(BUILTIN_PROFILES, gpu, None)["name"] == profile


def test_a_forced_profile_wins_over_the_name():
    assert select_profile(BUILTIN_PROFILES, "Tesla T4", "h100-sxm")["name"] == "h100-sxm"


def test_overrides_merge_key_by_key_and_add_profiles():
    merged = merge_profiles(BUILTIN_PROFILES, {"profiles": {
        "h200-sxm": {"expect": {"hbm_copy_gbps": 4000, "p2p_gbps": None},
                     "ratios": {"default": [0.9, 0.8]}},
        "l40s": {"match": ["L40S"], "expect": {"bf16_tflops": 300}},
        "h200-strict": {"base": "h200-sxm", "ratios": {"nccl_busbw_1g_gbps": [0.98, 0.9]}},
    }})
    h200 = merged["h200-sxm"]
    assert h200["expect"]["hbm_copy_gbps"] == 4000
    assert h200["expect"]["p2p_gbps"] is None  # null removes an expectation
    assert h200["expect"]["nccl_busbw_4g_gbps"] == 345  # untouched keys stay
    assert h200["ratios"]["default"] == [0.9, 0.8]
    assert merged["l40s"]["expect"] == {"bf16_tflops": 300.0}
    assert merged["l40s"]["limits"] == BUILTIN_PROFILES["generic"]["limits"]
    assert merged["h200-strict"]["expect"]["hbm_copy_gbps"] == 4000  # base as overridden
    assert select_profile(merged, "NVIDIA L40S", None)["name"] == "l40s"
    # the built-ins themselves are not changed
    assert BUILTIN_PROFILES["h200-sxm"]["expect"]["hbm_copy_gbps"] == 4270


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"profiles": {"h200-sxm": {"expect": {"hbm_gbps": 1}}}},
         "unknown expect key 'hbm_gbps' (did you mean hbm_copy_gbps?)"),
        ({"profiles": {"h200-sxm": {"expect": {"hbm_copy_gbps": -1}}}}, "must be a number >= 0"),
        ({"profiles": {"h200-sxm": {"expect": {"hbm_copy_gbps": "fast"}}}}, "must be a number"),
        ({"profiles": {"h200-sxm": {"ratios": {"default": [0.5, 0.9]}}}}, "0 <= warn <= pass"),
        ({"profiles": {"h200-sxm": {"ratios": {"default": 0.9}}}}, "[pass, warn]"),
        ({"profiles": {"h200-sxm": {"limits": {"temp": 80}}}}, "unknown limits key"),
        ({"profiles": {"x": {"match": ["(unclosed"]}}}, "match '(unclosed'"),
        ({"profiles": {"x": {"base": "nope"}}}, "base profile 'nope' does not exist"),
        ({"profiles": {"x": {"colour": "red"}}}, "unknown key 'colour'"),
        ({"profiles": {"bad name": {}}}, "is not valid"),
        ({"profiles": ["h200"]}, "must be a mapping"),
        ({"profile": "h300"}, "profile 'h300' does not exist"),
        ({"profiles": {"h200-sxm": {"nvlink_links": "18"}}}, "nvlink_links must be a whole"),
        ({"profiles": {"h200-sxm": {"nvlink_links": 18.5}}}, "nvlink_links must be a whole"),
        ({"profiles": {"h200-sxm": {"nvlink_links": -1}}}, "nvlink_links must be a whole"),
        ({"profiles": {"h200-sxm": {"limits": {"nvlink_crc_growth": 1}}}},
         "unknown limits key 'nvlink_crc_growth' (did you mean nvlink_crc_growth_warn?)"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ValueError, match=None) as info:
        merge_profiles(BUILTIN_PROFILES, override)
    assert message in str(info.value)


def test_load_overrides_reads_yaml(tmp_path):
    path = tmp_path / "p.yml"
    path.write_text("profile: h200-sxm\nprofiles:\n  h200-sxm:\n    expect:\n"
                    "      nccl_busbw_1g_gbps: 300\n")
    data = load_overrides(path)
    assert data["profile"] == "h200-sxm"
    assert resolve(data)["h200-sxm"]["expect"]["nccl_busbw_1g_gbps"] == 300


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("profiles: [unclosed\n", "line"),
        ("- a\n- b\n", "must be a mapping"),
        ("profils: {}\n", "unknown key 'profils'"),
        ("profiles:\n  h200-sxm:\n    expect: {nccl_busbw: 3}\n", "unknown expect key"),
    ],
)
def test_load_overrides_raises_config_errors(tmp_path, text, message):
    path = tmp_path / "p.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_overrides(path)
    assert message in str(info.value)
    assert info.value.exit_code == ExitCode.CONFIG
    assert "\n" not in str(info.value)


def test_load_overrides_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        load_overrides(tmp_path / "nope.yml")


def test_empty_override_file_is_no_override(tmp_path):
    path = tmp_path / "p.yml"
    path.write_text("")
    assert load_overrides(path) == {}


def test_agent_profile_document_round_trips_through_the_agent(tmp_path):
    overrides = {"profiles": {"h200-sxm": {"expect": {"p2p_gbps": 200}}}}
    path = write_agent_profile(tmp_path / "agent.json", overrides, force="h200-sxm")
    doc = json.loads(path.read_text())
    assert doc["profile"] == "h200-sxm"
    assert load_profile_file(str(path)) == doc  # what the agent reads back, validated


def test_both_loaders_follow_one_set_of_rules(tmp_path):
    """The agent's loader accepted a top-level 'schema' key that umprov's refused; both refuse
    it now (the stricter rule: nothing writes one), with the same message."""
    doc = {"schema": "umprov.verify.profiles", "profiles": {}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as agent_side:
        load_profile_file(str(path))
    with pytest.raises(ConfigError) as control_side:
        load_overrides(path)
    message = "unknown key 'schema' (expected 'profiles' and/or 'profile')"
    assert message in str(agent_side.value) and message in str(control_side.value)
    path.write_text(json.dumps(["h200-sxm"]))
    with pytest.raises(ValueError, match="must be a mapping with 'profiles'"):
        load_profile_file(str(path))
    with pytest.raises(ConfigError, match="must be a mapping with 'profiles'"):
        load_overrides(path)


def test_agent_profile_document_refuses_unknown_forced_profile(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        write_agent_profile(tmp_path / "a.json", {}, force="h999")


def test_nvlink_link_counts_are_per_model_and_can_be_dropped():
    assert BUILTIN_PROFILES["h200-sxm"]["nvlink_links"] == 18
    assert "nvlink_links" not in BUILTIN_PROFILES["generic"]  # absent: not checked
    merged = merge_profiles(BUILTIN_PROFILES, {"profiles": {
        "h200-sxm": {"nvlink_links": None}, "hgx-b200": {"base": "h200-sxm", "nvlink_links": 18,
                                                         "match": ["B200"]}}})
    assert merged["h200-sxm"]["nvlink_links"] is None
    assert merged["hgx-b200"]["nvlink_links"] == 18
