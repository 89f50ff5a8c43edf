"""Where umprov finds what it runs (playbooks, roles, image files) and where it writes: a
project's own, else the installed wheel's, else the editable install's clone; never a silent
pass or a write into the installed package when something is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from umprov import paths
from umprov.errors import EnvironmentProblem, ExitCode


def content(folder: Path) -> Path:
    (folder / "playbooks").mkdir(parents=True)
    (folder / "playbooks" / "site.yml").write_text("---\n")
    (folder / "roles" / "gpu_preflight").mkdir(parents=True)
    (folder / "ansible.cfg").write_text("[defaults]\n")
    return folder


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """umprov as a wheel installs it: site-packages/umprov, nothing of a clone around it, run
    from a folder that is no project."""
    package = tmp_path / "site-packages" / "umprov"
    package.mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", package)
    monkeypatch.delenv("UMPROV_PROJECT_DIR", raising=False)
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return package


def test_a_wheel_runs_its_own_content_and_keeps_the_project_in_the_state_folder(installed,
                                                                                tmp_path):
    carried = content(installed / paths.CONTENT)
    assert paths.content_dir() == carried
    assert paths.project_dir() == tmp_path / "state"


def test_a_project_with_its_own_playbooks_is_used_from_any_folder_below_it(installed, tmp_path,
                                                                           monkeypatch):
    content(installed / paths.CONTENT)
    project = content(tmp_path / "site")
    (project / "inventory" / "group_vars").mkdir(parents=True)
    monkeypatch.chdir(project / "inventory" / "group_vars")
    assert paths.project_dir() == project and paths.content_dir() == project


def test_an_ansible_project_of_the_users_own_does_not_replace_umprovs_playbooks(
        installed, tmp_path, monkeypatch):
    """A team's own Ansible repository (ansible.cfg, playbooks/site.yml, other roles) is where
    its inventory names resolve, but umprov still runs its own playbooks."""
    carried = content(installed / paths.CONTENT)
    theirs = tmp_path / "infra"
    (theirs / "playbooks").mkdir(parents=True)
    (theirs / "playbooks" / "site.yml").write_text("---\n")
    (theirs / "roles" / "webserver").mkdir(parents=True)
    (theirs / "ansible.cfg").write_text("[defaults]\n")
    monkeypatch.chdir(theirs)
    assert paths.project_dir() == theirs and paths.content_dir() == carried


def test_a_project_named_by_umprov_project_dir_runs_its_own_playbooks(installed, tmp_path,
                                                                      monkeypatch):
    content(installed / paths.CONTENT)
    ours = tmp_path / "site"
    (ours / "playbooks").mkdir(parents=True)
    (ours / "playbooks" / "site.yml").write_text("---\n")
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(ours))
    assert paths.content_dir() == ours


def test_an_editable_install_reads_its_clone():
    assert paths.content_dir() == REPO == paths.PACKAGE_DIR.parent


def test_missing_content_is_a_missing_prerequisite_naming_where_it_looked(installed):
    with pytest.raises(EnvironmentProblem) as raised:
        paths.content_dir()
    assert str(installed / paths.CONTENT) in str(raised.value)
    assert raised.value.exit_code == ExitCode.ENVIRONMENT
    content(installed / paths.CONTENT)
    with pytest.raises(EnvironmentProblem, match="value_rules.yml: missing"):
        paths.content_file("roles", "gpu_preflight", "files", "value_rules.yml")


def test_inventory_check_without_the_roles_says_so_in_one_line(installed, umprov_cli, tmp_path,
                                                               monkeypatch):
    """A wheel that lost its value rules refuses, exit 5, rather than finding nothing wrong."""
    from umprov.inventory import rules, specs

    monkeypatch.delenv("UMPROV_PROJECT_DIR")
    rules.value_rules.cache_clear()
    specs.variable_specs.cache_clear()
    content(installed / paths.CONTENT)
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("all:\n  hosts:\n    gpu01:\n      docker_engine_source: bogus\n")
    try:
        result = umprov_cli("inventory", "check", str(hosts))
    finally:
        rules.value_rules.cache_clear()
        specs.variable_specs.cache_clear()
    assert result.exit_code == ExitCode.ENVIRONMENT, result.stderr
    assert "reinstall umprov" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_one_version_everywhere():
    """umprov/__init__.py holds the version: the distributions read it (pyproject's dynamic
    version, lab/setup.py, the collection's build); the agent, which imports nothing of umprov,
    carries a copy that must agree."""
    import umprov
    from umprov.verify.agent.schema import AGENT_VERSION

    assert umprov.__version__ == AGENT_VERSION
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()
    assert "dynamic = [\"version\"]" in (REPO / "lab" / "pyproject.toml").read_text()
    assert "version: 0.0.0" in (REPO / "collection" / "galaxy.yml").read_text()
