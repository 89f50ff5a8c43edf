"""Files holding secrets are 0600 in directories only their owner can enter."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from umprov import paths


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_private_creates_missing_parents_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "tokens" / "h.token"
    paths.write_private(target, "x\n")
    assert mode(target) == 0o600
    assert mode(target.parent) == 0o700


def test_private_dir_takes_group_and_other_bits_away(tmp_path: Path) -> None:
    loose = tmp_path / "tokens"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert paths.private_dir(loose) == loose
    assert mode(loose) == 0o700


def test_token_dir_is_private_even_when_an_older_umprov_made_it_0755(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from umprov.deploy.state import token_path

    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state" / "tokens").mkdir(parents=True)
    (tmp_path / "state" / "tokens").chmod(0o755)
    path = token_path("gpu1")
    paths.write_private(path, "token\n")
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert mode(tmp_path / "state") == 0o700


def test_pinned_keys_lists_the_keys_under_a_name(tmp_path: Path) -> None:
    from umprov.hosts.ssh import pinned_keys

    known = tmp_path / "known_hosts"
    assert pinned_keys("umprov-gpu1", known) == []
    known.write_text(
        "# comment\n"
        "umprov-gpu1,[10.0.0.1]:2222 ssh-ed25519 AAAAone\n"
        "umprov-gpu10 ssh-ed25519 AAAAten\n"
    )
    assert pinned_keys("umprov-gpu1", known) == ["ssh-ed25519 AAAAone"]
    assert pinned_keys("[10.0.0.1]:2222", known) == ["ssh-ed25519 AAAAone"]
    assert pinned_keys("umprov-gpu2", known) == []
