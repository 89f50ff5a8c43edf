"""Bad input, fuzzed (issue 7): generated inventories, option values, -e pairs and profile files.

The promise: whatever a user feeds umprov, it never prints a traceback and never reports an
internal error (exit 70); a failure is one line on stderr a problem (inventory check lists every
problem at once), each starting with "umprov: ", with a documented non-zero exit code. Only parsing and validation paths run here: no Docker, no
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
from umprov.deploy.options import check_bind, check_image, check_port, parse_gpus
from umprov.errors import ConfigError, ExitCode, UmprovError
from umprov.inventory import variable_specs
from umprov.provision import parse_extra_vars
from umprov.verify.profiles import LIMITS, METRICS, load_overrides, resolve

pytestmark = pytest.mark.cost(50)

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
    lines = result.stderr.splitlines()  # one line a problem (inventory check lists them all)
    assert lines and all(line.startswith("umprov: ") for line in lines), result.stderr
    assert len(lines) == len(set(lines)), result.stderr  # no problem said twice
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
        assert result.exit_code == ExitCode.CONFIG  # Click's types too: a bad value


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


@pytest.mark.parametrize(("args", "code"), [
    (["--ssh-port", "abc"], ExitCode.CONFIG),  # a value Click's type refuses: a bad value
    (["--ssh-prot", "22"], ExitCode.USAGE)])  # not an option: the command line
def test_click_errors_are_one_line(args, code):
    """Click's usage errors were three lines (usage, hint, error); now one, like the rest."""
    result = umprov("deploy", *args)
    assert result.exit_code == code
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("umprov: error: ")
    assert "--ssh-p" in result.stderr and "umprov deploy --help" in result.stderr


# ---------------------------------------------------------------------------------------------
# Issue 19: folders with group_vars (YAML errors, vault), templated values, comma lists and
# several sources, vault options, -e @FILE and deploy's newer options


VAULT_PASSWORD = "fuzz-vault-password"
# Templates from a small alphabet: expressions, filters, undefined names, syntax errors, but no
# function call (nothing like lookup('pipe', ...) can come out of it).
template_text = st.text(alphabet="abxyz019 +-*/|._[]~%", max_size=16)
templates = st.one_of(
    template_text.map(lambda t: "{{ " + t + " }}"),
    template_text.map(lambda t: "{% " + t + " %}"),
    st.sampled_from(["{{ inventory_hostname }}", "{{ 2200 + 22 }}", "{{ undefined_thing }}",
                     "{{ 1 / 0 }}", "{{ ansible_facts.distribution }}", "{{", "}}", "{{ }}",
                     "{{ '9' * 5000 }}", "{{ [1, 2] }}", "{{ {'a': 1} }}", "{{ -1 }}",
                     "{{ inventory_hostname }}.{{ domain }}", "{{ none }}"]),
)
templated_vars = st.dictionaries(
    st.sampled_from(["ansible_host", "ansible_port", "ansible_user",
                     "ansible_ssh_private_key_file", "umprov_ssh_port", "umprov_expected_gpus",
                     "umprov_image", "umprov_known_hosts", "nvidia_driver_branch",
                     "nvidia_driver_version", "docker_engine_users"]),
    templates | values, max_size=4,
)


def _vault_text(text: str, password: str = VAULT_PASSWORD) -> bytes:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib().encrypt(text, secret=VaultSecret(password.encode()))


@st.composite
def folder_inventories(draw: st.DrawFn) -> dict[str, str | bytes]:
    """A folder: hosts.yml, and group_vars/host_vars files that may be broken or encrypted."""
    files: dict[str, str | bytes] = {
        "hosts.yml": dump({"all": {"vars": {"domain": "example.com"},
                                   "hosts": {"gpu1": draw(st.none() | templated_vars)}}}),
    }
    for name in draw(st.lists(st.sampled_from(["group_vars/all.yml", "group_vars/all/vault.yml",
                                               "host_vars/gpu1.yml", "group_vars/all/x.json"]),
                              max_size=3, unique=True)):
        body = draw(yaml_texts() | templated_vars.map(dump))
        how = draw(st.sampled_from(["plain", "vault", "vault-wrong"]))
        if how == "plain":
            files[name] = body
        else:
            files[name] = _vault_text(body, VAULT_PASSWORD if how == "vault" else "other")
    return files


@pytest.fixture(scope="module")
def password_file(work: Path) -> Path:
    path = work / "vault-pass.txt"
    path.write_text(VAULT_PASSWORD + "\n")
    return path


@FUZZ
@given(files=folder_inventories(), give_password=st.booleans(), as_json=st.booleans())
@example(files={"hosts.yml": "all:\n  hosts:\n    gpu1:\n",
                "group_vars/all/vault.yml": _vault_text("a: 1\n")},
         give_password=False, as_json=False)
@example(files={"hosts.yml": "all:\n  hosts:\n    gpu1:\n", "group_vars/all.yml": "a: [\n"},
         give_password=False, as_json=True)
def test_folder_inventory_never_crashes(work, password_file, files, give_password, as_json):
    folder = work / f"site{next(_SEQ)}"
    for name, body in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, bytes):
            (folder / name).write_bytes(body)
        else:
            (folder / name).write_text(body, encoding="utf-8", errors="surrogatepass")
    args = ["inventory", "check", str(folder)]
    args += ["--vault-password-file", str(password_file)] if give_password else []
    result = umprov(*args, *(["--json"] if as_json else []))
    assert_clean(result, allowed={ExitCode.INVENTORY}, as_json=as_json)
    if result.exit_code and "vault" in result.stderr:
        assert str(folder) in result.stderr, result.stderr


@FUZZ
@given(host_vars=templated_vars)
@example(host_vars={"ansible_port": "{{ '9' * 5000 }}"})
@example(host_vars={"umprov_expected_gpus": "{{ -1 }}"})
def test_templated_values_are_accepted_or_named(work, host_vars):
    body = dump({"all": {"vars": {"domain": "example.com"}, "hosts": {"gpu1": host_vars}}})
    result = umprov("inventory", "check", str(write(work, ".yml", body)), "--json")
    assert_clean(result, allowed={ExitCode.INVENTORY}, as_json=True)


sources = st.one_of(
    st.text(alphabet="abg019,.-_ ~/", min_size=1, max_size=20),
    st.lists(st.sampled_from(["gpu1", "gpu2", "10.0.0.1", "[::1]", "h:22", "", " "]),
             min_size=1, max_size=4).map(",".join),
)


@FUZZ
@given(given_sources=st.lists(sources, min_size=1, max_size=3))
@example(given_sources=["gpu1,gpu2,"])
@example(given_sources=[",", "gpu1,gpu1,"])
def test_comma_lists_and_several_sources(given_sources):
    args = ["inventory", "check", "--json"]
    for source in given_sources:
        args += ["-i", source]
    assert_clean(umprov(*args), allowed={ExitCode.INVENTORY}, as_json=True)


vault_ids = st.one_of(
    st.text(max_size=20).filter(lambda t: "prompt" not in t),
    st.sampled_from(["default@", "@", "a@b@c", "prod@/nonexistent", "x@/dev/null", "@/etc",
                     "label"]),
)


@FUZZ
@given(ids=st.lists(vault_ids, max_size=2), contents=st.lists(st.binary(max_size=20),
                                                              max_size=2))
def test_vault_options_never_crash(work, ids, contents):
    """Odd --vault-id values and password files of any content (never executable: a script
    would be run)."""
    args = ["inventory", "check", "gpu1,"]
    for vault_id in ids:
        args += ["--vault-id", vault_id]
    for data in contents:
        args += ["--vault-password-file", str(write(work, ".pass", data))]
    assert_clean(umprov(*args), allowed={ExitCode.INVENTORY, ExitCode.CONFIG})


@FUZZ
@given(body=yaml_texts() | st.binary(max_size=40), encrypted=st.booleans())
def test_extra_vars_files(work, body, encrypted):
    """-e @FILE: read as ansible-playbook reads it, or one line naming the file (exit 4).
    Checked directly: through the CLI a good file would go on to run a playbook."""
    from umprov.inventory import Vault
    from umprov.inventory.ansible_io import load_vars_file
    from umprov.inventory.vault import VaultPassword
    from umprov.paths import Secret

    data = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
    path = write(work, ".yml", _vault_text(data.decode("utf-8", "replace")) if encrypted else data)
    vault = Vault((VaultPassword("default", secret=Secret(VAULT_PASSWORD)),))
    try:
        load_vars_file(path, vault)
    except ConfigError as exc:
        assert_one_line(exc)
        assert str(path) in str(exc)


@FUZZ
@given(shm=st.text(max_size=10) | st.sampled_from(["16g", "0", "1.5m", "1e9", "-1g", "16gb"]),
       name=st.none() | st.text(max_size=12), push=st.booleans(), pull=st.booleans())
def test_deploy_newer_options(work, shm, name, push, pull):
    key = work / "junk.pub"
    key.write_text("not a key\n")
    args = ["deploy", str(work / "no-such-inventory.yml"), "--authorized-key", str(key),
            f"--shm-size={shm}"]
    args += [f"--name={name}"] if name is not None else []
    args += (["--push"] if push else []) + (["--pull"] if pull else [])
    result = umprov(*args)
    assert_clean(result, allowed={ExitCode.USAGE, ExitCode.CONFIG})
    assert result.exit_code != 0
