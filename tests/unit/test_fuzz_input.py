"""Bad input, fuzzed (issue 7): generated inventories, option values, -e pairs and profile files.

The promise: whatever a user feeds umprov, it never prints a traceback and never reports an
internal error (exit 70); a failure is exactly one line on stderr, starting with "umprov: ",
with a documented non-zero exit code. Only parsing and validation paths run here: no Docker, no
SSH, no network (deploy and verify are stopped by a junk public key or a missing inventory
before they could touch a host). Each bug the fuzzing found has a plain regression test below.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tests.conftest import REPO, _Boundary
from umprov.deploy import check_bind, check_image, check_port, parse_gpus
from umprov.errors import ConfigError, ExitCode, UmprovError
from umprov.inventory import variable_specs
from umprov.provision import parse_extra_vars
from umprov.verify.profiles import LIMITS, METRICS, load_overrides, resolve

# UMPROV_FUZZ_EXAMPLES=5000 makes a long, randomised hunt; unset, CI runs the same 200 per test.
LONG_RUN = int(os.environ.get("UMPROV_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    deadline=None,
    max_examples=LONG_RUN or 200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not LONG_RUN,  # the same cases on every run: CI stays reproducible
    database=None,
)
DOCUMENTED = {int(c) for c in ExitCode} - {ExitCode.OK, ExitCode.INTERNAL}
HUGE = "9" * 5000  # an integer past Python's 4300-digit str() limit
RUNNER = CliRunner()
_SEQ = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _env(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("fuzz-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UMPROV_STATE_DIR", str(state))
        mp.setenv("UMPROV_PROJECT_DIR", str(REPO))
        mp.delenv("ANSIBLE_INVENTORY", raising=False)
        yield


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def umprov(*args: str) -> Result:
    return RUNNER.invoke(_Boundary("umprov"), list(args), catch_exceptions=False)


def write(work: Path, suffix: str, data: str | bytes) -> Path:
    path = work / f"case{next(_SEQ)}{suffix}"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    return path


def _event(name: str) -> None:
    """Count outcomes in --hypothesis-show-statistics (the figures in docs/reliability.md)."""
    if currently_in_test_context():
        event(name)


def assert_clean(result: Result, *, allowed: set[int], as_json: bool = False) -> None:
    """The promise, for one run of the CLI."""
    _event(f"exit {result.exit_code}")
    assert "Traceback" not in result.output, result.output
    assert result.exit_code != ExitCode.INTERNAL, result.stderr
    if result.exit_code == 0:
        if as_json:
            json.loads(result.stdout)
        return
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("umprov: "), result.stderr
    assert result.exit_code in DOCUMENTED & allowed, (result.exit_code, result.stderr)


def assert_one_line(exc: UmprovError) -> None:
    _event("refused")
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text


# ---------------------------------------------------------------------------------------------
# Strategies

SPECS = variable_specs(REPO / "roles")
VAR_NAMES = sorted(SPECS)
KNOWN_KEYS = [
    "ansible_host", "ansible_port", "ansible_ssh_port", "ansible_user",
    "ansible_ssh_private_key_file", *VAR_NAMES, "umprov_unknown_thing", "nvidia_driver_bogus",
]

text = st.text(max_size=30)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 22, 65535, 65536, -1, 2**63, 2**64 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.sampled_from(["HUGE_INT", "{{ other }}", "²", "١٢", "10.0.0.1", "a b", "all", "yes",
                     "0x16", "1e400", "", " ", "\t", "ñø✓", "🚀"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
host_names = st.one_of(
    st.sampled_from(["gpu01", "gpu02", "10.0.0.9", "ñø✓", "host with space", "h:1", "[h]"]),
    st.text(min_size=1, max_size=12),
)
host_vars = st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), text), values, max_size=5)
hosts = st.dictionaries(host_names, st.none() | host_vars, max_size=3)
group = st.fixed_dictionaries(
    {}, optional={"hosts": hosts | values, "vars": host_vars | values}
)
inventories = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "all": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "hosts": hosts,
                        "vars": host_vars,
                        "children": st.dictionaries(text, st.none() | group, max_size=2),
                    },
                ),
                values,
            ),
            "gpus": st.none() | group,
        },
    ),
    values,
)


def dump(data: object) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False).replace("HUGE_INT", HUGE)


def mangle(draw: st.DrawFn, textual: str) -> str:
    """Valid YAML made invalid: cut, or with bytes YAML trips on spliced in."""
    at = draw(st.integers(0, len(textual)))
    how = draw(st.sampled_from(["cut", "splice"]))
    if how == "cut":
        return textual[:at]
    junk = draw(st.sampled_from(["[", "{", ": :", "\t", "&a *b", "!!python/object:os.system",
                                 "%YAML 9", "'", '"', "\n  - x\n y: ", "? [a]\n: 1", "\x00"]))
    return textual[:at] + junk + textual[at:]


@st.composite
def yaml_texts(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["valid", "mangled", "random"]))
    if kind == "random":
        return draw(st.text(max_size=80))
    textual = dump(draw(inventories))
    return textual if kind == "valid" else mangle(draw, textual)


ini_tokens = st.one_of(
    st.sampled_from(["ansible_host=10.0.0.1", "ansible_port=22", "ansible_port=²",
                     f"ansible_port={HUGE}", "ansible_port=-1", "umprov_gpus=0,1",
                     "umprov_expected_gpus=x", "umprov_bogus=1", "umprov_container_limits=maybe", "=",
                     "a=b=c", "ansible_host=", '"unterminated', "umprov_ssh_port=1e3"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12),
)


@st.composite
def ini_texts(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["group", "host", "vars", "junk"]))
        if kind == "group":
            lines.append(f"[{draw(st.text(max_size=8))}]")
        elif kind == "vars":
            suffix = draw(st.sampled_from(["vars", "children", "x"]))
            lines.append(f"[{draw(st.text(max_size=6))}:{suffix}]")
        elif kind == "host":
            lines.append(" ".join([draw(host_names), *draw(st.lists(ini_tokens, max_size=3))]))
        else:
            lines.append(draw(st.text(max_size=20)))
    return "\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Inventories through `umprov inventory check`


@FUZZ
@given(body=yaml_texts(), as_json=st.booleans())
@example(body=f"all:\n  hosts:\n    h1:\n      ansible_port: {HUGE}\n", as_json=True)
@example(body="- " + HUGE + "\n", as_json=True)
def test_yaml_inventory_never_crashes(work, body, as_json):
    path = write(work, ".yml", body)
    args = ["inventory", "check", str(path)] + (["--json"] if as_json else [])
    assert_clean(umprov(*args), allowed={ExitCode.INVENTORY}, as_json=as_json)


@FUZZ
@given(body=ini_texts())
@example(body="[g]\nh1 ansible_port=²\n")
def test_ini_inventory_never_crashes(work, body):
    path = write(work, ".ini", body)
    assert_clean(umprov("inventory", "check", str(path), "--json"),
                 allowed={ExitCode.INVENTORY}, as_json=True)


@settings(FUZZ, max_examples=max(60, LONG_RUN // 4))
@given(data=st.binary(max_size=64))
def test_binary_inventory_never_crashes(work, data):
    path = write(work, ".yml", data)
    assert_clean(umprov("inventory", "check", str(path)), allowed={ExitCode.INVENTORY})


@FUZZ
@given(name=st.sampled_from(VAR_NAMES), value=values)
def test_typed_variable_is_accepted_or_named(work, name, value):
    """A role or umprov variable of any value: valid, or an error naming the variable."""
    body = dump({"all": {"hosts": {"gpu01": {"ansible_host": "10.0.0.1", name: value}}}})
    result = umprov("inventory", "check", str(write(work, ".yml", body)), "--json")
    assert_clean(result, allowed={ExitCode.INVENTORY}, as_json=True)
    if result.exit_code:
        assert name in result.stderr or "YAML" in result.stderr, result.stderr
    else:
        (host,) = json.loads(result.stdout)["hosts"]
        assert name in host["vars"]


# ---------------------------------------------------------------------------------------------
# Regressions: one plain test per bug the fuzzing found


def _check(work: Path, body: str, suffix: str = ".yml") -> Result:
    return umprov("inventory", "check", str(write(work, suffix, body)), "--json")


def test_unicode_digit_port_is_an_inventory_error(work):
    """'²'.isdigit() is True but int('²') fails: was an internal error (exit 70)."""
    for body, suffix in (("all:\n  hosts:\n    h1:\n      ansible_port: '²'\n", ".yml"),
                         ("[g]\nh1 ansible_port=²\n", ".ini")):
        result = _check(work, body, suffix)
        assert result.exit_code == ExitCode.INVENTORY
        assert "host 'h1' has port '²'" in result.stderr


def test_huge_integer_is_an_inventory_error(work):
    """An integer past 4300 digits broke str() and PyYAML: was an internal error."""
    for key in ("ansible_port", "umprov_expected_gpus", "umprov_image", "ansible_user"):
        result = _check(work, f"all:\n  hosts:\n    h1:\n      {key}: {HUGE}\n")
        assert result.exit_code == ExitCode.INVENTORY, result.stderr
        assert result.stderr.startswith("umprov: error: ")
    result = _check(work, f"- {HUGE}\n")  # Ansible refuses; our YAML re-read must not crash
    assert result.exit_code == ExitCode.INVENTORY
    big = _check(work, "all:\n  hosts:\n    h1:\n      umprov_expected_gpus: 1" + "0" * 25 + "\n")
    assert big.exit_code == ExitCode.INVENTORY
    assert "umprov_expected_gpus" in big.stderr and "too large" in big.stderr


@pytest.mark.parametrize("value", ["[a, b]", "{a: 1}", "true", '"a\\0b"', '"two words"'])
def test_address_must_be_a_host_name(work, value):
    """A list, mapping, boolean or control characters were accepted as the SSH address."""
    result = _check(work, f"all:\n  hosts:\n    h1:\n      ansible_host: {value}\n")
    assert result.exit_code == ExitCode.INVENTORY
    assert "host 'h1' has address" in result.stderr


@pytest.mark.parametrize("key", ["ansible_user", "ansible_ssh_private_key_file"])
def test_user_must_be_a_string(work, key):
    """A list or mapping was taken as its str()."""
    result = _check(work, f"all:\n  hosts:\n    h1:\n      {key}: [a, b]\n")
    assert result.exit_code == ExitCode.INVENTORY
    assert "host 'h1' has" in result.stderr


def test_non_finite_float_variable_is_refused(work):
    result = _check(work, "all:\n  hosts:\n    h1:\n      umprov_internode_busbw_gbps: .inf\n")
    assert result.exit_code == ExitCode.INVENTORY
    assert "umprov_internode_busbw_gbps" in result.stderr


def test_ansible_type_names_are_plain(work):
    result = _check(work, "- a\n- b\n")
    assert result.exit_code == ExitCode.INVENTORY
    assert "_AnsibleTagged" not in result.stderr and "got: list" in result.stderr


# ---------------------------------------------------------------------------------------------
# deploy options: validators directly, then the CLI (stopped by a junk key before any host)


def _validates(func, *args) -> bool:
    try:
        func(*args)
    except ConfigError as exc:
        assert_one_line(exc)
        return False
    return True


ports = st.one_of(st.integers(), st.floats(), st.text(max_size=8), st.booleans(), st.none(),
                  st.sampled_from(["²", "22", " 22 ", "0x16", HUGE, 10**5000, float("inf")]))


@FUZZ
@given(value=ports)
@example(value=float("inf"))
@example(value=10**5000)
@example(value="²")
def test_check_port(value):
    try:
        port = check_port(value, "--ssh-port")
    except ConfigError as exc:
        assert_one_line(exc)
        assert str(exc).startswith("--ssh-port")
    else:
        assert isinstance(port, int) and 1 <= port <= 65535


gpu_lists = st.one_of(
    st.text(max_size=16),
    st.lists(st.one_of(st.integers(0, 20).map(str), st.sampled_from(["GPU-3f2a", "MIG-1-2", "²",
             "all", "", " ", "-1", "GPU-", "ñ"])), max_size=4).map(",".join),
)


@FUZZ
@given(value=gpu_lists)
@example(value="²")
def test_parse_gpus(value):
    try:
        got = parse_gpus(value)
    except ConfigError as exc:
        assert_one_line(exc)
    else:
        assert got in ("all", "none") or all(
            (g.isascii() and g.isdigit()) or g.startswith(("GPU-", "MIG-")) for g in got
        )


images = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A([a-z0-9.-]{1,12}(:[0-9]{1,5})?/)?[a-z0-9]{1,8}([._-][a-z0-9]{1,5})?"
                  r"(:[A-Za-z0-9_.-]{1,10})?\Z"),
    st.sampled_from(["umprov/pytorch-cuda:0.1.0", "nvcr.io/nvidia/pytorch:25.01-py3", "Ubuntu",
                     "a:", ":tag", "a//b", "a b", "ubuntu@sha256:abc", "x" * 600, "ñ/ø"]),
)


@FUZZ
@given(value=images)
def test_check_image(value):
    try:
        got = check_image(value)
    except ConfigError as exc:
        assert_one_line(exc)
    else:
        assert got == value.strip() and got.isascii() and " " not in got


binds = st.one_of(st.ip_addresses().map(str), st.text(max_size=20),
                  st.sampled_from(["[::1]", "0.0.0.0", "localhost", "1.2.3.4.5",  # noqa: S104
                                   "fe80::1%eth0"]))


@FUZZ
@given(value=binds)
def test_check_bind(value):
    if _validates(check_bind, value):
        check_bind(value)  # twice: idempotent, no state


@FUZZ
@given(
    image=st.none() | images,
    gpus=st.none() | gpu_lists,
    ssh_port=st.none() | st.integers(-(10**6), 10**6).map(str) | st.text(max_size=6),
    jupyter_port=st.none() | st.integers(-10, 70000).map(str),
    bind=st.none() | binds,
)
def test_deploy_options_through_the_cli(work, image, gpus, ssh_port, jupyter_port, bind):
    """Bad values stop deploy with one line; good ones reach the (junk) key and stop there."""
    key = work / "junk.pub"
    key.write_text("not a key\n")
    args = ["deploy", str(work / "no-such-inventory.yml"), "--authorized-key", str(key)]
    for opt, val in (("--image", image), ("--gpus", gpus), ("--ssh-port", ssh_port),
                     ("--jupyter-port", jupyter_port), ("--bind", bind)):
        if val is not None:
            args.append(f"{opt}={val}")
    result = umprov(*args)
    assert_clean(result, allowed={ExitCode.USAGE, ExitCode.CONFIG})
    assert result.exit_code != 0

    def int_ok(v):
        try:
            click.INT.convert(v, None, None)
        except click.BadParameter:
            return False
        return True

    clicks = all(v is None or int_ok(v) for v in (ssh_port, jupyter_port))
    valid = clicks and all(
        v is None or _validates(f, v)
        for f, v in ((check_image, image), (parse_gpus, gpus), (check_bind, bind))
    ) and all(v is None or _validates(check_port, int(v), "p") for v in (ssh_port, jupyter_port))
    if valid:
        assert "is not an SSH public key" in result.stderr, result.stderr
    else:
        assert "SSH public key" not in result.stderr
        assert result.exit_code == (ExitCode.CONFIG if clicks else ExitCode.USAGE)


# ---------------------------------------------------------------------------------------------
# provision -e


pairs = st.one_of(
    st.text(max_size=30),
    st.tuples(st.one_of(st.from_regex(r"\A[a-z_][a-z0-9_]{0,10}\Z"), st.text(max_size=6)),
              st.one_of(st.text(max_size=20), st.sampled_from([HUGE, "[" * 2000, "!!python/name:os",
                        "{a: [1, 2]}", "{{ x }}", "&a [*a]"]))).map("=".join),
)


@FUZZ
@given(values=st.lists(pairs, max_size=4))
@example(values=[f"n={HUGE}", "deep=" + "[" * 2000 + "]" * 2000])
@example(values=["é=1"])
def test_parse_extra_vars(values):
    try:
        got = parse_extra_vars(values)
    except ConfigError as exc:
        assert_one_line(exc)
    else:
        assert all(k.isascii() and k.isidentifier() for k in got)


# ---------------------------------------------------------------------------------------------
# verify --profile-file

metric_keys = st.sampled_from([*METRICS, *LIMITS, "default", "bogus_gbps", "x"])
numbers = st.one_of(st.floats(), st.integers(-(10**30), 10**30), st.text(max_size=4),
                    st.none(), st.booleans(), st.lists(st.floats(-1, 3), max_size=3))
profile_specs = st.fixed_dictionaries({}, optional={
    "description": values,
    "match": st.one_of(st.text(max_size=10), st.lists(st.text(max_size=6), max_size=2), values,
                       st.sampled_from([["a{99999999999}"], ["("], ["(" * 200 + ")" * 200]])),
    "expect": st.dictionaries(metric_keys, numbers, max_size=3) | values,
    "limits": st.dictionaries(metric_keys, numbers, max_size=3) | values,
    "ratios": st.dictionaries(metric_keys, numbers, max_size=3) | values,
    "warn_only": st.lists(metric_keys | values, max_size=3) | values,
    "base": st.sampled_from(["generic", "h200-sxm", "nope"]) | values,
    "bogus": values,
})
profile_docs = st.one_of(
    st.fixed_dictionaries({}, optional={
        "profile": st.sampled_from(["generic", "h200-sxm", "nope"]) | values,
        "profiles": st.dictionaries(st.sampled_from(["h200-sxm", "generic", "l40s", "bad name",
                                                     "ñ"]) | text, st.none() | profile_specs,
                                    max_size=2) | values,
    }),
    st.dictionaries(st.one_of(text, st.integers(0, 3)), values, max_size=2),
    values,
)


@st.composite
def profile_texts(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["yaml", "json", "mangled", "random", "binary"]))
    if kind == "random":
        return draw(st.text(max_size=60))
    if kind == "binary":
        return draw(st.binary(max_size=40))
    doc = draw(profile_docs)
    if kind == "json":
        return json.dumps(doc, default=str)
    return dump(doc) if kind == "yaml" else mangle(draw, dump(doc))


@FUZZ
@given(body=profile_texts())
@example(body="profile: [1]\n")
@example(body="profiles: {x: {base: [1]}}\n")
@example(body="profiles: {x: {warn_only: [{}]}}\n")
@example(body="profiles: {x: {1: 2, a: 3}}\n")
@example(body="profiles: {x: {match: ['a{99999999999}']}}\n")
@example(body="profiles: {x: {expect: {bf16_tflops: .inf}}}\n")
@example(body=f"profiles: {{x: {{expect: {{bf16_tflops: {HUGE}}}}}}}\n")
@example(body=b"\xff\xfe junk")
def test_profile_file(work, body):
    path = write(work, ".yml", body)
    try:
        overrides = load_overrides(path)
    except ConfigError as exc:
        assert_one_line(exc)
        assert str(path) in str(exc)
        valid = False
    else:
        resolve(overrides)  # what verify does next
        valid = True
    # The CLI: a bad file stops with exit 4; a good one goes on to the (missing) inventory.
    result = umprov("verify", str(work / "no-such-inventory.yml"), "--profile-file", str(path))
    assert_clean(result, allowed={ExitCode.CONFIG, ExitCode.INVENTORY})
    assert result.exit_code == (ExitCode.INVENTORY if valid else ExitCode.CONFIG), result.stderr


@pytest.mark.parametrize("body", [
    "profile: [1]\n", "profiles: {x: {base: [1]}}\n", "profiles: {x: {warn_only: [{}]}}\n",
    "profiles: {x: {1: 2, a: 3}}\n", "1: a\nb: c\n", "profiles: {x: {match: ['a{99999999999}']}}\n",
    "profiles: {x: {expect: {bf16_tflops: .inf}}}\n", f"profile: {HUGE}\n",
])
def test_profile_file_regressions(work, body):
    """Each was a TypeError, OverflowError or ValueError traceback (exit 70), or inf accepted."""
    path = write(work, ".yml", body)
    with pytest.raises(ConfigError) as caught:
        load_overrides(path)
    assert_one_line(caught.value)
    assert umprov("verify", "hosts", "--profile-file", str(path)).exit_code == ExitCode.CONFIG


def test_binary_profile_file_is_a_config_error(work):
    path = write(work, ".yml", b"\xff\xfe junk")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_overrides(path)


def test_usage_error_is_one_line():
    """Click's usage errors were three lines (usage, hint, error); now one, like the rest."""
    result = umprov("deploy", "--ssh-port", "abc")
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("umprov: error: ")
    assert "--ssh-port" in result.stderr and "umprov deploy --help" in result.stderr
