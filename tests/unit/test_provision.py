"""The ansible-runner wrapper: classification from stats, events, environment hygiene."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from umprov import provision
from umprov.errors import ConfigError, ExitCode
from umprov.provision import HostCounts, ProvisionResult, args, environment
from umprov.provision import results as run_results


def test_parse_extra_vars_types():
    assert provision.parse_extra_vars(["a=1", "b=true", "c=x y", "d=[1, 2]", "e="]) == {
        "a": 1, "b": True, "c": "x y", "d": [1, 2], "e": "",
    }


@pytest.mark.parametrize("bad", ["novalue", "=1", "not a name=1"])
def test_parse_extra_vars_rejects(bad):
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        provision.parse_extra_vars([bad])


def _result(*hosts: HostCounts) -> ProvisionResult:
    return ProvisionResult("playbooks/site.yml", "inv", False, [h.outcome() for h in hosts], 1.0,
                           "/tmp/x")


def test_exit_code_failed_beats_unreachable():
    assert _result(HostCounts("a", ok=3)).exit_code == ExitCode.OK
    assert _result(HostCounts("a"), HostCounts("b", unreachable=1)).exit_code == ExitCode.HOSTS_UNREACHABLE
    assert _result(HostCounts("a", failed=1), HostCounts("b", unreachable=1)).exit_code == ExitCode.HOSTS_FAILED


def test_status_words():
    assert HostCounts("a", ok=2).status == "ok"
    assert HostCounts("a", ok=2, changed=1).status == "changed"
    assert HostCounts("a", failed=1).status == "failed"
    assert HostCounts("a", unreachable=1, failed=1).status == "unreachable"


def event(kind, host=None, task="t", **data):
    return {"event": kind, "event_data": {"host": host, "task": task, **data}}


def test_consume_collects_changes_failures_and_notes():
    results: dict[str, HostCounts] = {}
    seen = []
    for ev in [
        event("playbook_on_task_start", task="Install driver"),
        event("runner_on_ok", "a", "Install driver", res={"changed": True}),
        event("runner_on_ok", "a", "Report", res={"ansible_facts": {"nvidia_driver_status": {"action": "installed", "version": "580.1", "kernel_module": "open", "reboot_required": "True"}}}),
        event("runner_on_failed", "b", "Install driver", res={"msg": "E: Unable to locate\npackage"}),
        event("runner_on_failed", "b", "Probe", res={"msg": "ignored"}, ignore_errors=True),
        event("runner_on_unreachable", "c", "Gather", res={"msg": "ssh: connect refused"}),
    ]:
        run_results.consume(ev, results, seen.append)
    assert results["a"].changed_tasks == ["Install driver"]
    assert results["a"].notes == ["driver 580.1 installed (open), REBOOT REQUIRED"]
    assert results["b"].failure == "Install driver: E: Unable to locate package"
    assert results["c"].failure == "unreachable: ssh: connect refused"
    assert [e.kind for e in seen] == ["task_start", "changed", "ok", "failed", "unreachable"]


def test_stats_decide_counts_and_hosts_that_never_ran():
    results = {"a": HostCounts("a"), "b": HostCounts("b")}
    runner = SimpleNamespace(stats={"ok": {"a": 5}, "changed": {"a": 2}, "failures": {}, "dark": {}, "skipped": {}})
    run_results.apply_stats(runner, results)
    assert (results["a"].ok, results["a"].changed, results["a"].failed) == (5, 2, 0)
    assert results["b"].failed == 1 and "did not run" in results["b"].failure


def test_child_environment_drops_secrets_and_keeps_ssh(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("GITHUB_TOKEN", "tok")
    monkeypatch.setenv("ANSIBLE_BECOME_PASS", "pw")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", "/etc/vault-pass")
    monkeypatch.setenv("ANSIBLE_FORKS", "7")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    env = environment.child_environment()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env
    assert "ANSIBLE_BECOME_PASS" not in env
    assert env["ANSIBLE_VAULT_PASSWORD_FILE"] == "/etc/vault-pass"
    assert env["ANSIBLE_FORKS"] == "7" and env["SSH_AUTH_SOCK"] == "/run/agent.sock"
    assert env["PATH"].split(":")[0].endswith("bin")


def test_runner_environment_is_restored(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "tok")
    with environment.runner_environment():
        import os

        assert "GITHUB_TOKEN" not in os.environ
    assert os.environ["GITHUB_TOKEN"] == "tok"


def test_scrub_artifacts_removes_env(tmp_path):
    (tmp_path / "command").write_text('{"command": ["ansible-playbook"], "env": {"X": "secret"}}')
    environment.scrub_artifacts(tmp_path)
    assert "secret" not in (tmp_path / "command").read_text()
    assert "ansible-playbook" in (tmp_path / "command").read_text()


def test_extra_vars_go_in_a_private_file_never_on_the_command_line(tmp_path):
    """-e may carry a password: ansible-playbook gets -e @FILE (0600), removed after the run."""
    import json

    from ansible_runner.config.runner import RunnerConfig

    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    (tmp_path / "project").mkdir()
    path = args.extra_vars_file(private, {"ansible_become_password": "s3cret-value"})
    assert oct((private / "extravars.json").stat().st_mode & 0o777) == "0o600"
    assert json.loads((private / "extravars.json").read_text())["ansible_become_password"]
    config = RunnerConfig(private_data_dir=str(private), project_dir=str(tmp_path / "project"),
                          playbook="site.yml", inventory="/dev/null", extravars=path,
                          suppress_env_files=True)
    config.prepare()
    assert config.command[config.command.index("-e") + 1] == f"@{path}"
    assert "s3cret-value" not in " ".join(config.command)
    artifacts = private / "artifacts" / "ident"
    artifacts.mkdir(parents=True)
    environment.scrub_artifacts(artifacts)
    assert not (private / "extravars.json").exists()
    assert args.extra_vars_file(private, {}) is None


def test_private_dir_is_0700_and_rotated(tmp_path, monkeypatch):
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path))
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(environment.KEEP_RUNS + 3):
        (runs / f"provision-2020010{i:02d}").mkdir()
    path = environment.private_dir()
    assert oct(path.stat().st_mode & 0o777) == "0o700"
    assert len(list(runs.iterdir())) == environment.KEEP_RUNS


def test_provision_bad_extra_var_exit_code(umprov_cli, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n")
    result = umprov_cli("provision", str(inv), "-e", "oops")
    assert result.exit_code == ExitCode.CONFIG
    assert "-e 'oops'" in result.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["-e", "umprov_sshport=3"], "-e: unknown umprov variable 'umprov_sshport' on host 'a'"),
    (["-e", "umprov_ssh_port=x"], "-e: variable 'umprov_ssh_port' on host 'a' must be of type int"),
    (["-e", "@VARS"], "-e @VARS: variable 'umprov_ssh_port' on host 'a' must be of type int"),
    (["-e", "umprov_env=TOKEN=hunter2"],  # a secret's value is never printed
     "-e: variable 'umprov_env' on host 'a' must be of type dict, not str (<hidden>)")])
def test_provision_checks_extra_vars_as_the_inventorys_before_any_host(
        umprov_cli, tmp_path, monkeypatch, extra, message):
    import umprov.provision

    monkeypatch.setattr(umprov.provision, "run_playbook", lambda *a, **k: pytest.fail("ran"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n")
    (tmp_path / "vars.yml").write_text("umprov_ssh_port: ten\n")
    extra = [str(tmp_path / "vars.yml") if e == "@VARS" else e for e in extra]
    extra = [f"@{e}" if e.endswith("vars.yml") else e for e in extra]
    result = umprov_cli("provision", str(inv), *extra)
    assert result.exit_code == ExitCode.INVENTORY, result.stderr
    assert message.replace("@VARS", f"@{tmp_path / 'vars.yml'}") in result.stderr


def test_an_extra_var_overrides_the_inventory_as_ansible_playbook_does(tmp_path):
    from umprov.inventory import load_inventory

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n"
                   "      umprov_ssh_port: 2222\n")
    (tmp_path / "vars.yml").write_text("umprov_ssh_port: 2200\nansible_port: 2022\n")
    host, = load_inventory(str(inv), extra=[{"umprov_ssh_port": 2300},
                                            tmp_path / "vars.yml"]).hosts
    assert host.vars["umprov_ssh_port"] == 2200 and host.port == 2022  # the later one wins
    with pytest.raises(ConfigError, match="not a file"):
        load_inventory(str(inv), extra=[tmp_path])


def test_extra_vars_are_templated_as_ansible_playbook_templates_them(tmp_path):
    from umprov.inventory import load_inventory

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars: {reg: registry.example.com:5000}\n  hosts:\n"
                   "    a: {ansible_host: 10.0.0.1}\n    b: {ansible_host: 10.0.0.2}\n")
    (tmp_path / "vars.yml").write_text('umprov_ssh_port: "{{ 2200 + 1 }}"\n')
    hosts = load_inventory(str(inv), extra=[
        {"umprov_image": "{{ reg }}/pytorch:1", "nvidia_driver_version": "{{ ansible_facts.x }}"},
        tmp_path / "vars.yml"]).hosts
    assert hosts[0].vars["umprov_image"] == "registry.example.com:5000/pytorch:1"
    assert hosts[0].vars["umprov_ssh_port"] == 2201


def test_an_extra_address_for_every_host_is_no_duplicate(tmp_path):
    """provision -l a -e ansible_host=X: ansible-playbook dials X for the one host it runs."""
    from umprov.inventory import load_inventory

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a: {ansible_host: 10.0.0.1}\n"
                   "    b: {ansible_host: 10.0.0.2}\n")
    hosts = load_inventory(str(inv), extra=[{"ansible_host": "10.9.9.9"}]).select("a")
    assert [(h.name, h.address) for h in hosts] == [("a", "10.9.9.9")]


def test_strategy_linear_is_plain():
    assert environment.resolve_strategy("linear") == ("linear", {"ANSIBLE_STRATEGY": "linear"})


def test_strategy_auto_falls_back_without_mitogen(monkeypatch):
    monkeypatch.setattr(environment, "mitogen_strategy_dir", lambda: None)
    assert environment.resolve_strategy("auto")[0] == "linear"
    with pytest.raises(ConfigError, match="--strategy mitogen: the mitogen package is not installed"):
        environment.resolve_strategy("mitogen")


def test_strategy_auto_uses_mitogen_when_present(monkeypatch, tmp_path):
    monkeypatch.setattr(environment, "mitogen_strategy_dir", lambda: tmp_path)
    name, env = environment.resolve_strategy("auto")
    assert name == "mitogen"
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert env["ANSIBLE_STRATEGY_PLUGINS"] == str(tmp_path)


def test_strategy_unknown():
    with pytest.raises(ConfigError, match="unknown strategy 'fast'"):
        environment.resolve_strategy("fast")


def test_a_failed_command_reports_what_it_printed_not_only_its_return_code() -> None:
    from umprov.provision.results import short_failure

    stderr = (
        "W: GPG error: http://repo.example.com/libnvidia-container/stable/deb/amd64  InRelease: "
        "The following signatures couldn't be verified: NO_PUBKEY 6ED91CA3AC1160CD\n"
        "E: The repository 'http://repo.example.com/libnvidia-container/stable/deb/amd64  "
        "InRelease' is not signed.\n"
    )
    failure = short_failure({"msg": "non-zero return code", "stderr": stderr, "rc": 100})
    assert failure.startswith("non-zero return code: E: The repository")
    assert "libnvidia-container" in failure and "not signed" in failure
    assert short_failure({"msg": "boom", "stderr": "ignored"}) == "boom"


@pytest.mark.parametrize(
    "result",
    [
        # Mitogen's bootstrap (bash on the host), as a lab host without /usr/bin/python3 said it.
        {"msg": "Task failed: EOF on stream; last 100 lines received: bash: line 1: "
                "/usr/bin/python3: No such file or directory"},
        # The linear strategy: dash runs the module's shebang line.
        {"msg": "The module failed to execute correctly, you probably need to set the interpreter.",
         "module_stderr": "/bin/sh: 1: /usr/bin/python3: not found\n", "rc": 127},
        # ... and gather_facts nests that result under failed_modules.
        {"msg": "The following modules failed to execute: ansible.legacy.setup.",
         "failed_modules": {"ansible.legacy.setup": {
             "module_stderr": "/bin/sh: 1: /usr/bin/python3: not found\n", "rc": 127}}},
    ],
)
def test_a_host_without_the_named_python_gets_a_hint_not_the_raw_text(result) -> None:
    from umprov.provision.results import short_failure

    assert short_failure(result) == (
        "no Python at /usr/bin/python3 on this host: install python3 there, or set "
        "ansible_python_interpreter for the host in the inventory"
    )


def test_a_hosts_json_record_keeps_its_shape():
    counts = HostCounts("a", ok=3, changed=1, changed_tasks=["Install"], notes=["docker from x"])
    host = _result(counts, HostCounts("b", failed=1, failure="Install: E: broken")).to_dict()
    assert host["exit_code"] == ExitCode.HOSTS_FAILED
    assert [list(h) for h in host["hosts"]] == [[
        "host", "status", "ok", "changed", "failed", "unreachable", "skipped", "changed_tasks",
        "failure", "notes", "roles"]] * 2
    assert host["hosts"][0]["failure"] is None and host["hosts"][0]["status"] == "changed"
    assert host["hosts"][1]["failure"] == "Install: E: broken"
