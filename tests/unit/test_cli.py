"""The CLI frame: help, version, lazy imports, the error boundary and exit codes."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from umprov import __version__
from umprov.cli import COMMANDS, cli, run
from umprov.errors import ExitCode, UmprovError

HEAVY = ("ansible", "ansible_runner", "docker", "paramiko", "rich", "torch")


def test_help_lists_every_command(umprov_cli):
    result = umprov_cli("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_help(umprov_cli, command):
    result = umprov_cli(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout


def test_version_lists_the_stack(umprov_cli):
    result = umprov_cli("--version")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"umprov {__version__}"
    names = {line.split()[0] for line in lines}
    assert {"ansible-core", "ansible-runner", "docker", "paramiko", "python"} <= names


def test_help_imports_no_heavy_library():
    # A fresh interpreter: what `umprov --help` (and each command's help) loads.
    code = (
        "import sys\n"
        "from umprov.cli import run\n"
        "for args in (['--help'], *[[c, '--help'] for c in %r]):\n"
        "    try:\n"
        "        run(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    ) % (sorted(COMMANDS), HEAVY)
    out = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert out == "HEAVY=", f"--help imported: {out}"


def test_unknown_command_is_a_usage_error(umprov_cli):
    result = umprov_cli("frobnicate")
    assert result.exit_code == ExitCode.USAGE
    assert "No such command" in result.stderr and "Did you mean" not in result.stderr


@pytest.mark.parametrize(("typed", "meant"), [("provison", "provision"), ("verfy", "verify"),
                                              ("labb", "lab")])
def test_a_mistyped_command_gets_a_suggestion(umprov_cli, typed, meant):
    """Built-in commands load lazily and `lab` is a plugin: both are among the suggestions."""
    result = umprov_cli(typed)
    assert result.exit_code == ExitCode.USAGE
    assert f"No such command '{typed}'. Did you mean '{meant}'?" in result.stderr


@pytest.fixture
def extra_command():
    """Temporarily add commands that raise, to exercise the boundary."""
    added = []

    def add(name, exc):
        @cli.command(name)
        def _cmd():
            raise exc

        added.append(name)

    yield add
    for name in added:
        cli.commands.pop(name, None)


def test_domain_error_is_one_line_with_its_code(umprov_cli, extra_command):
    extra_command(
        "boom-domain", UmprovError("bad thing\nwith a second line", exit_code=ExitCode.CONFIG)
    )
    result = umprov_cli("boom-domain")
    assert result.exit_code == ExitCode.CONFIG
    assert result.stderr == "umprov: error: bad thing with a second line\n"
    assert "Traceback" not in result.output


def test_unexpected_error_logs_traceback(umprov_cli, extra_command, tmp_path):
    extra_command("boom-bug", ZeroDivisionError("division by zero"))
    result = umprov_cli("boom-bug")
    assert result.exit_code == ExitCode.INTERNAL
    assert len(result.stderr.strip().splitlines()) == 1
    assert "internal error: ZeroDivisionError" in result.stderr
    logs = list((tmp_path / "state" / "logs").glob("crash-*.log"))
    assert len(logs) == 1
    assert "Traceback" in logs[0].read_text()
    assert oct(logs[0].stat().st_mode & 0o777) == "0o600"


def test_ctrl_c_exits_130(umprov_cli, extra_command):
    extra_command("boom-int", KeyboardInterrupt())
    result = umprov_cli("boom-int")
    assert result.exit_code == ExitCode.INTERRUPTED == 130
    assert "interrupted" in result.stderr


def test_exit_codes_are_distinct():
    values = [code.value for code in ExitCode]
    assert len(values) == len(set(values))


def test_readme_documents_every_exit_code():
    from tests.conftest import REPO

    readme = (REPO / "README.md").read_text()
    for code in ExitCode:
        assert f"| {code.value} |" in readme, f"exit code {code.value} ({code.name}) undocumented"


def test_run_returns_command_result():
    @click.command()
    def ok():
        return 0

    cli.add_command(ok, "ok-test")
    try:
        assert run(["ok-test"]) == 0
    finally:
        cli.commands.pop("ok-test")


# ---------------------------------------------------------------------------------------------
# Commands from other distributions (entry point group umprov.commands)


@click.command()
@click.option("--name", default="world")
def plugin_hello(name: str) -> int:
    """Say hello from a plugin."""
    click.echo(f"hello {name}")
    return ExitCode.OK


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch):
    """Stand-in entry points of the group umprov.commands, from a distribution "plugin-test"."""
    from umprov.cli import plugins as found

    def use(**commands: str) -> None:
        declared = tuple(found.Plugin(name, value, "plugin-test") for name, value in commands.items())
        monkeypatch.setattr(found, "installed", lambda: declared)

    return use


def test_plugin_command_runs_with_its_options(umprov_cli, plugins):
    plugins(hello="tests.unit.test_cli:plugin_hello")
    result = umprov_cli("hello", "--name", "lab")
    assert result.exit_code == 0 and result.stdout == "hello lab\n"
    assert "Say hello from a plugin." in umprov_cli("hello", "--help").stdout


def test_plugin_is_listed_but_not_loaded_by_help(umprov_cli, plugins):
    plugins(ghost="no_such_module_anywhere:cmd")
    result = umprov_cli("--help")
    assert result.exit_code == 0
    line = next(ln for ln in result.stdout.splitlines() if ln.strip().startswith("ghost"))
    assert "umprov ghost --help" in line
    broken = umprov_cli("ghost")
    assert broken.exit_code == ExitCode.ENVIRONMENT
    assert broken.stderr.startswith("umprov: error: the command 'ghost' from ")
    assert len(broken.stderr.strip().splitlines()) == 1


def test_plugin_cannot_take_a_builtin_name(umprov_cli, plugins):
    plugins(deploy="tests.unit.test_cli:plugin_hello")
    assert "--push" in umprov_cli("deploy", "--help").stdout
    listed = [ln for ln in umprov_cli("--help").stdout.splitlines() if ln.startswith("  deploy ")]
    assert len(listed) == 1


def test_lab_is_not_built_in():
    assert "lab" not in COMMANDS  # it comes from the umprov-lab distribution


def test_the_demo_ends_with_a_login_command_that_runs_as_printed():
    """`umprov` is in .venv/bin after `make demo`, not on PATH: the last lines name it so."""
    import subprocess

    from tests.conftest import REPO

    said = subprocess.run(["make", "-n", "demo", "LAB=x"], cwd=REPO, capture_output=True,
                          text=True, timeout=60).stdout
    assert ".venv/bin/umprov status lab/x --connect lab-x-1" in said
    assert "source .venv/bin/activate" in said
    assert ".venv/bin/umprov status lab/demo --connect lab-demo-1" in (REPO / "README.md").read_text()
