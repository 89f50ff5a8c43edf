"""A real browser for the HTML report: Debian's chromium, headless.

Every run goes through a proxy at 127.0.0.1:9 (nothing listens there: no request leaves this
machine, whatever the page or the browser itself tries) and writes Chromium's NetLog. The
browser's own background requests (its updater, its account and time services) carry no
initiator ("not an origin"); a request the page makes carries the page's origin (a file://
page's is "null"). ``Run.page_requests`` are the latter: the URLs the page tried to load.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser")
TIMEOUT = 180


@dataclass
class Run:
    dom: str
    netlog: Path

    @property
    def page_requests(self) -> list[str]:
        return page_requests(self.netlog)


def page_requests(netlog: Path) -> list[str]:
    text = netlog.read_text().rstrip()
    try:
        data = json.loads(text)
    except ValueError:  # a browser that did not close its log: the events so far
        data = json.loads(text.rstrip(",") + "]}")
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in data["events"]
            if e.get("type") == start and "url" in e.get("params", {})
            and e["params"].get("initiator") != "not an origin"]


class Chromium:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.count = 0

    def _argv(self, *extra: str) -> tuple[list[str], Path]:
        self.count += 1
        netlog = self.workdir / f"netlog-{self.count}.json"
        argv = [self.binary, "--headless", "--disable-gpu", "--hide-scrollbars",
                f"--user-data-dir={self.workdir / f'profile-{self.count}'}",
                "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                f"--log-net-log={netlog}", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", *extra]
        if os.geteuid() == 0:  # chromium refuses to run as root inside its sandbox
            argv.insert(1, "--no-sandbox")
        return argv, netlog

    def run(self, page: Path, *extra: str) -> Run:
        argv, netlog = self._argv(*extra, "--dump-dom", page.resolve().as_uri())
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return Run(proc.stdout, netlog)

    def screenshot(self, page: Path, out: Path, *extra: str, size: str = "1280,2400") -> Run:
        argv, netlog = self._argv(*extra, f"--window-size={size}", f"--screenshot={out}",
                                  page.resolve().as_uri())
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
        return Run("", netlog)

    def pdf(self, page: Path, out: Path) -> Run:
        argv, netlog = self._argv("--no-pdf-header-footer", f"--print-to-pdf={out}",
                                  page.resolve().as_uri())
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
        return Run("", netlog)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Debian's chromium is not installed (apt-get install chromium; "
                "scripts/system-deps.sh installs it as root)")


@pytest.fixture
def chromium(chromium_binary: str, tmp_path: Path) -> Chromium:
    return Chromium(chromium_binary, tmp_path)
