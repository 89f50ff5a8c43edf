"""umprov.hosts.ssh: known_hosts handling, trust decisions and their messages (no network)."""

from __future__ import annotations

import socket
import stat
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

import umprov
from tests.unit.fakes import FakeHost as _FakeHost
from umprov.errors import ExitCode, TrustError, Unreachable
from umprov.hosts import ssh


def FakeHost(**fields: Any) -> _FakeHost:  # noqa: N802 - stands in for the class
    """A lab host: loopback, port 2222, user lab."""
    return _FakeHost(**{"address": "127.0.0.1", "port": 2222, "user": "lab", **fields})


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _key() -> paramiko.PKey:
    """A throwaway host key, made in memory (nothing left on disk)."""
    import io

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def test_host_pattern_matches_openssh():
    assert ssh.host_pattern("10.0.0.1", 22) == "10.0.0.1"
    assert ssh.host_pattern("127.0.0.1", 2222) == "[127.0.0.1]:2222"


def test_fingerprint_is_openssh_sha256():
    key = _key()
    fp = ssh.fingerprint(key)
    assert fp.startswith("SHA256:") and not fp.endswith("=")
    assert len(fp) == len("SHA256:") + 43


def test_known_hosts_files_order(tmp_path: Path):
    host = FakeHost(known_hosts=str(tmp_path / "lab_known_hosts"))
    files = ssh.known_hosts_files(host)
    assert files[0] == tmp_path / "lab_known_hosts"
    assert files[1] == Path.home() / ".ssh" / "known_hosts"
    assert files[2] == ssh.umprov_known_hosts()


def test_record_then_check_known_unknown_changed():
    key, other = _key(), _key()
    path = ssh.record_host_key("[127.0.0.1]:2222", key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    known = ssh.load_known_hosts([path])
    assert ssh.check_key(known, "[127.0.0.1]:2222", key).state == "known"
    assert ssh.check_key(known, "[127.0.0.1]:2223", key).state == "unknown"
    assert ssh.check_key(known, "[127.0.0.1]:2222", other).state == "changed"
    # recording again is a no-op; a different key is refused, never replaced
    ssh.record_host_key("[127.0.0.1]:2222", key)
    with pytest.raises(TrustError, match="different key"):
        ssh.record_host_key("[127.0.0.1]:2222", other)
    assert len(path.read_text().splitlines()) == 1


def test_pin_replaces_only_its_patterns():
    key, other = _key(), _key()
    ssh.record_host_key("[10.0.0.9]:22", other)
    line = f"{key.get_name()} {key.get_base64()} comment"
    path = ssh.pin_host_key(["umprov-gpu1"], line)
    path = ssh.pin_host_key(["umprov-gpu1"], f"{other.get_name()} {other.get_base64()}")
    text = path.read_text().splitlines()
    assert sum(1 for ln in text if ln.startswith("umprov-gpu1 ")) == 1
    assert any(ln.startswith("[10.0.0.9]:22 ") for ln in text)
    known = ssh.load_known_hosts([path])
    assert ssh.check_key(known, "umprov-gpu1", other).state == "known"


def test_pin_rejects_garbage():
    with pytest.raises(Exception, match="not an SSH public key"):
        ssh.pin_host_key(["x"], "hello")


def test_concurrent_pins_keep_every_entry():
    keys = [_key() for _ in range(8)]
    threads = [
        threading.Thread(
            target=ssh.pin_host_key, args=([f"umprov-h{i}"], f"{k.get_name()} {k.get_base64()}")
        )
        for i, k in enumerate(keys)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = ssh.umprov_known_hosts().read_text().splitlines()
    assert sorted(ln.split()[0] for ln in lines) == sorted(f"umprov-h{i}" for i in range(8))


def test_unknown_and_changed_messages_say_what_to_do(tmp_path: Path):
    key = _key()
    msg = ssh._unknown_message("[127.0.0.1]:2222", key, "gpu1")
    assert "host key for [127.0.0.1]:2222 is not known" in msg
    assert "umprov trust gpu1" in msg and "--trust-new-hosts" in msg
    path = ssh.record_host_key("[127.0.0.1]:2222", _key())
    check = ssh.check_key(ssh.load_known_hosts([path]), "[127.0.0.1]:2222", key)
    changed = ssh._changed_message("[127.0.0.1]:2222", key, check, [path])
    assert "HOST KEY CHANGED" in changed and str(path) in changed


def test_policy_refuses_unknown_unless_asked():
    key = _key()
    refuse = ssh._verifying_policy([], "gpu1", trust_new=False)
    with pytest.raises(TrustError) as err:
        refuse.missing_host_key(None, "[127.0.0.1]:2222", key)
    assert err.value.exit_code == ExitCode.TRUST
    assert not ssh.umprov_known_hosts().exists()
    accept = ssh._verifying_policy([], "gpu1", trust_new=True)
    accept.missing_host_key(None, "[127.0.0.1]:2222", key)
    assert "[127.0.0.1]:2222 ssh-ed25519" in ssh.umprov_known_hosts().read_text()


def test_no_auto_add_policy_anywhere():
    root = Path(umprov.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "AutoAddPolicy" not in text and "WarningPolicy" not in text, path


def test_connect_refused_port_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(Unreachable) as err:
        ssh.connect(FakeHost(port=port), timeout=2)
    assert err.value.exit_code == ExitCode.HOSTS_UNREACHABLE


def test_openssh_options_are_strict(tmp_path: Path):
    opts = ssh.openssh_options([tmp_path / "a", tmp_path / "b"], key_file="~/k")
    joined = " ".join(opts)
    assert f"UserKnownHostsFile={tmp_path / 'a'} {tmp_path / 'b'}" in joined
    assert "StrictHostKeyChecking=yes" in joined and "BatchMode=yes" in joined
    assert "IdentitiesOnly=yes" in joined


def test_presented_key_is_known_unknown_or_refused(monkeypatch: pytest.MonkeyPatch):
    """What `umprov trust` shows: a new key is offered, a recorded one is known, a changed one
    is refused before anyone is asked."""
    key, other = _key(), _key()
    host = FakeHost()
    monkeypatch.setattr(ssh, "scan_host_key", lambda address, port: key)
    shown = ssh.presented_key(host)
    assert shown.pattern == "[127.0.0.1]:2222" and not shown.known
    assert shown.label == f"ED25519 {ssh.fingerprint(key)}"
    ssh.record_host_key(shown.pattern, shown.key)
    assert ssh.presented_key(host).known
    monkeypatch.setattr(ssh, "scan_host_key", lambda address, port: other)
    with pytest.raises(TrustError, match="HOST KEY CHANGED for \\[127.0.0.1\\]:2222"):
        ssh.presented_key(host)


@pytest.mark.parametrize(("raw", "said"), [
    ("[Errno None] Unable to connect to port 2222 on 127.0.0.1",
     "Unable to connect to port 2222 on 127.0.0.1"),
    ("Task failed: EOF on stream; last 100 lines received: bash: line 1: python3: not found",
     "Task failed: the connection closed before the host answered; it said: bash: line 1: "
     "python3: not found"),
    ("EOF on stream", "the connection closed before the host answered"),
    ("[Errno 111] Connection refused", "[Errno 111] Connection refused"),  # a real errno stays
])
def test_the_transports_prefixes_do_not_reach_the_user(raw, said):
    from umprov.hosts.ssh import plain_reason

    assert plain_reason(raw) == said
