"""`deploy --pull`: the host's engine pulls, umprov reports its bytes and its errors."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from umprov.deploy.pull import pull_image
from umprov.errors import DeployFailed


class FakeAPI:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.calls: list[tuple[str, str]] = []

    def pull(self, repository: str, tag: str, stream: bool, decode: bool) -> Iterator[dict]:
        assert stream and decode
        self.calls.append((repository, tag))
        yield from self.events


def client(events: list[dict[str, Any]]) -> Any:
    return SimpleNamespace(api=FakeAPI(events),
                           images=SimpleNamespace(get=lambda ref: SimpleNamespace(id="sha256:ab")))


def downloading(layer: str, current: int, total: int) -> dict[str, Any]:
    return {"status": "Downloading", "id": layer,
            "progressDetail": {"current": current, "total": total}}


def test_pull_reports_bytes_and_returns_the_image_id() -> None:
    events = [
        {"status": "Pulling from umprov/pytorch-cuda", "id": "v1"},
        downloading("a", 1_000_000, 4_000_000),
        downloading("b", 2_000_000, 2_000_000),
        {"status": "Download complete", "id": "b"},
        downloading("a", 4_000_000, 4_000_000),
        {"status": "Pull complete", "id": "a"},
        {"status": "Digest: sha256:12"},
    ]
    c = client(events)
    said: list[str] = []
    assert pull_image(c, "registry.example.com:5000/umprov/pytorch-cuda:v1", said.append,
                      every=0.0) == "sha256:ab"
    # The port stays part of the repository; the tag is passed apart.
    assert c.api.calls == [("registry.example.com:5000/umprov/pytorch-cuda", "v1")]
    assert said[-1] == "pulling: 6 MB of 6 MB (compressed) from 2 layer(s)"
    assert "pulling: 1 MB of 4 MB (compressed) from 1 layer(s)" in said


def test_pull_without_a_tag_asks_for_latest() -> None:
    c = client([])
    pull_image(c, "umprov/pytorch-cuda", lambda _m: None)
    assert c.api.calls == [("umprov/pytorch-cuda", "latest")]


def test_pull_error_is_one_line_naming_the_image() -> None:
    events = [{"error": "x", "errorDetail": {"message": (
        "Get \"https://reg:5000/v2/\": tls: failed to verify certificate:\n"
        "x509: certificate signed by unknown authority")}}]
    with pytest.raises(DeployFailed) as info:
        pull_image(client(events), "reg:5000/umprov/pytorch-cuda:v1", lambda _m: None)
    text = str(info.value)
    assert text.startswith("pulling reg:5000/umprov/pytorch-cuda:v1 failed: Get ")
    assert "\n" not in text and "certificate signed by unknown authority" in text
