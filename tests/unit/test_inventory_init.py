"""`umprov inventory init`: the example inventory written where a user starts (a pipx install
has no clone to copy it from), checked by `inventory check` as written, never over a file."""

from __future__ import annotations

from tests.conftest import REPO


def test_init_writes_the_example_and_check_reads_it(umprov_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = umprov_cli("inventory", "init", "site")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "site" / "hosts.yml").read_text() == (
        REPO / "inventory" / "hosts.yml").read_text()
    assert (tmp_path / "site" / "group_vars" / "all.yml").read_text() == (
        REPO / "inventory" / "group_vars" / "all.yml").read_text()
    assert "umprov inventory check site" in result.stderr
    check = umprov_cli("inventory", "check", "site", "--json")
    assert check.exit_code == 0, check.stderr


def test_init_overwrites_nothing(umprov_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inventory" / "group_vars").mkdir(parents=True)
    mine = tmp_path / "inventory" / "group_vars" / "all.yml"
    mine.write_text("mine: true\n")
    result = umprov_cli("inventory", "init")
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        f"umprov: error: {mine.relative_to(tmp_path)}: already exists; umprov inventory init "
        "overwrites nothing (choose another folder)"]
    assert mine.read_text() == "mine: true\n"
    assert not (tmp_path / "inventory" / "hosts.yml").exists()


def test_init_where_it_cannot_write_leaves_nothing_and_says_where(umprov_cli, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "group_vars").write_text("a file where the folder goes\n")
    result = umprov_cli("inventory", "init", "site")
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        "umprov: error: site/group_vars: cannot write the example inventory there (File exists)"]
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["group_vars"]  # as it was
    result = umprov_cli("inventory", "init", "fresh/deeper/site")  # nothing in its way: fine
    assert result.exit_code == 0, result.stderr
