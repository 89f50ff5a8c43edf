"""The HTML report in a real browser: what a person sees, and that the page fetches nothing.

Reports are made the way users make them, `umprov report RUN.json --html`, from run files of
the shapes the agent writes (tests/fleet_docs.py): a healthy 2-GPU H200 host, a host with a
failing GPU, a host with no GPU (a recorded run), and forty hosts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests import fleet_docs
from tests.browser.conftest import png_size
from umprov.verify import report

pytestmark = pytest.mark.browser


def write_run(path: Path, docs: list[dict]) -> Path:
    path.write_text(json.dumps(report.run_document(docs, 30.0)))
    return path


@pytest.fixture
def make_page(umprov_cli, tmp_path):
    def make(name: str, docs: list[dict]) -> Path:
        run = write_run(tmp_path / f"{name}.json", docs)
        page = tmp_path / f"{name}.html"
        result = umprov_cli("report", str(run), "--html", str(page))
        assert result.exit_code == 0, result.stderr
        return page

    return make


@pytest.fixture
def three_hosts(make_page) -> Path:
    return make_page("three", [fleet_docs.healthy_pair(), fleet_docs.failing_gpu_host(),
                               fleet_docs.no_gpu_host()])


class Seen(HTMLParser):
    """What the dumped DOM shows: the items of the first list after a heading, pair cells,
    host sections and table bodies' first column."""

    def __init__(self) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.items: dict[str, list[str]] = {}
        self.pairs: list[tuple[str, str]] = []
        self.hosts: list[str] = []
        self.first_cells: dict[str, list[str]] = {}
        self._text: list[str] | None = None
        self._where = ""
        self._table = ""
        self._cell = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("h2", "li"):
            self._text = []
        if "data-pair" in a:
            self.pairs.append((a["data-pair"], a.get("class", "")))
        if tag == "details" and "host" in a.get("class", ""):
            self.hosts.append(a.get("id", ""))
        if tag == "table":
            self._table = a.get("class", "")
        if tag == "tr":
            self._cell = 0
        if tag == "td":
            self._cell += 1
            if self._cell == 1:
                self._text = []

    def handle_endtag(self, tag):
        text = " ".join("".join(self._text or []).split())
        if tag == "h2":
            self.h2.append(text)
            self._where = text
            self._text = None
        elif tag == "li" and self._text is not None:
            self.items.setdefault(self._where, []).append(text)
            self._text = None
        elif tag == "td" and self._cell == 1 and self._text is not None:
            self.first_cells.setdefault(self._table, []).append(text)
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def seen(dom: str) -> Seen:
    s = Seen()
    s.feed(dom)
    return s


def keep(path: Path) -> None:
    """UMPROV_TEST_SCREENSHOTS=DIR keeps the screenshots to look at."""
    folder = os.environ.get("UMPROV_TEST_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


def test_a_person_sees_the_failing_gpu_first_and_one_cell_per_pair(chromium, three_hosts,
                                                                    tmp_path):
    run = chromium.run(three_hosts)
    shown = seen(run.dom)
    assert shown.h2[:2] == ["Needs action", "Hosts"]
    items = shown.items["Needs action"]
    fails = [i for i in items if i.startswith("FAIL")]
    assert items[:len(fails)] == fails  # the failing first, then by host name
    (gpu,) = [i for i in fails if i.startswith("FAIL h200-b gpu5:")]
    assert "gpu.hbm_copy" in gpu
    assert "hint: reset, reset the GPU" in gpu and "hint: reseat, a PCIe or NVLink" in gpu
    assert fails[0].startswith("FAIL build-01 host:")
    docs = json.loads((tmp_path / "three.json").read_text())["hosts"]
    pairs = sorted(r["target"] for d in docs for r in d["records"] if r["scope"] == "pair")
    assert sorted(p for p, _cls in shown.pairs) == pairs  # 1 (h200-a) + 28 (h200-b)
    assert [p for p, cls in shown.pairs if "v-fail" in cls] == [
        t for t in pairs if t.endswith("gpu5") or t.startswith("gpu5-")]
    assert shown.hosts == ["host-0", "host-1", "host-2"]
    assert run.page_requests == []


def test_screenshots_light_and_dark(chromium, three_hosts, tmp_path):
    light, dark = tmp_path / "report-light.png", tmp_path / "report-dark.png"
    runs = [chromium.screenshot(three_hosts, light),
            chromium.screenshot(three_hosts, dark, "--force-dark-mode")]
    for shot in (light, dark):
        assert png_size(shot) == (1280, 2400) and shot.stat().st_size > 50_000
        keep(shot)
    assert light.read_bytes() != dark.read_bytes()
    assert all(r.page_requests == [] for r in runs)


def test_the_theme_follows_the_browser(chromium, three_hosts, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(three_hosts.read_text().replace(
        "</body>", "<script>document.body.dataset.bg = getComputedStyle(document.body)"
        ".backgroundColor;</script></body>"))
    light = chromium.run(probe).dom
    dark = chromium.run(probe, "--force-dark-mode").dom
    assert 'data-bg="rgb(255, 255, 255)"' in light
    assert 'data-bg="rgb(21, 25, 30)"' in dark


def test_tables_sort_when_a_header_is_clicked(chromium, three_hosts, tmp_path):
    probe = tmp_path / "sorted.html"
    probe.write_text(three_hosts.read_text().replace(
        "</body>", "<script>document.querySelector('table.hosts th:nth-child(10)').click();"
        "</script></body>"))  # wall s, ascending
    walls = [d["wall_s"] for d in json.loads((tmp_path / "three.json").read_text())["hosts"]]
    names = seen(chromium.run(probe).dom).first_cells["sortable hosts"]
    by_wall = [n for _w, n in sorted(zip(walls, ["h200-a", "h200-b", "build-01"],
                                         strict=True))]
    assert names == by_wall and names != ["h200-b", "build-01", "h200-a"]


def test_forty_hosts(chromium, make_page, tmp_path):
    docs = fleet_docs.fleet(40)
    page = make_page("forty", docs)
    run = chromium.run(page)
    shown = seen(run.dom)
    assert len(shown.hosts) == 40
    assert len(shown.pairs) == 40 * 28
    action = shown.items["Needs action"]
    assert action[0].startswith("FAIL gpu-017 gpu2:") and "gpu.hbm_copy" in action[0]
    assert any(i.startswith("WARN gpu-023 gpu6:") and "gpu.temperature" in i for i in action)
    assert any(i.startswith("WARN gpu-031 gpu4:") and "nccl.send_recv" in i for i in action)
    assert re.search(r">gpu-017 gpu2</text>", run.dom)  # named beside its dot in the strip
    shot = tmp_path / "report-forty.png"
    chromium.screenshot(page, shot, size="1280,3000")
    keep(shot)
    assert run.page_requests == []


def test_a_thousand_hosts_of_eight_gpus(chromium, make_page, tmp_path):
    """Issue 30's fleet: the report stays small (the passing hosts' sections on pages of their
    own), shows every failing check and every host, and each host's page opens from it."""
    docs = fleet_docs.fleet(1000)
    page = make_page("thousand", docs)
    assert page.stat().st_size < 8 << 20
    run = chromium.run(page)
    shown = seen(run.dom)
    assert len(shown.first_cells["sortable hosts"]) == 1000
    assert len(shown.hosts) == 3  # the failing and warning hosts, on the page itself
    action = shown.items["Needs action"]
    assert action[0].startswith("FAIL gpu-017 gpu2:") and "gpu.hbm_copy" in action[0]
    links = re.findall(r'href="(thousand\.hosts/[^"]+)"', run.dom)
    assert len(links) == 997 and all((tmp_path / link).is_file() for link in links)
    one = chromium.run(tmp_path / links[500])
    inside = seen(one.dom)
    assert len(inside.hosts) == 1 and len(inside.pairs) == 28
    assert run.page_requests == [] and one.page_requests == []


def test_it_prints(chromium, three_hosts, tmp_path):
    pdf = tmp_path / "report.pdf"
    run = chromium.pdf(three_hosts, pdf)
    pages = len(re.findall(rb"/Type\s*/Page\b", pdf.read_bytes()))
    assert pages >= 3 and run.page_requests == []


def test_the_network_check_catches_a_page_that_fetches(chromium, three_hosts, tmp_path):
    """The check above can fail: the same report, its policy taken out and two references to
    the network put in, is caught (the proxy at 127.0.0.1:9 keeps them from going out)."""
    leaky = tmp_path / "leaky.html"
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "",
                  three_hosts.read_text())
    leaky.write_text(text.replace(
        "</body>", '<img src="http://umprov-probe.invalid/pixel.png">'
        '<link rel="stylesheet" href="https://umprov-probe.invalid/style.css"></body>'))
    urls = chromium.run(leaky).page_requests
    assert "http://umprov-probe.invalid/pixel.png" in urls
    assert "https://umprov-probe.invalid/style.css" in urls
