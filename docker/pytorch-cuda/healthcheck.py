#!/usr/bin/env python3
"""Container health: sshd answers with an SSH banner and Jupyter's REST API answers.

GET /api needs no token (it returns only the server version), so the check never needs the
secret. Exit 0 when both answer, 1 otherwise (Docker's HEALTHCHECK contract).
"""

import os
import socket
import sys
import urllib.request


def sshd_ok(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        return sock.recv(64).startswith(b"SSH-")


def jupyter_ok(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/api"
    with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 (fixed local URL)
        return resp.status == 200


def main() -> int:
    try:
        ok = sshd_ok(int(os.environ.get("SSH_PORT", "22")))
        ok = jupyter_ok(int(os.environ.get("JUPYTER_PORT", "8888"))) and ok
    except OSError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
