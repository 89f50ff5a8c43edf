"""Incremental push: the docker-save tar rewrite (umprov.deploy.image_tar) and the push loop
that uses it (umprov.deploy.push), against small fake docker-save tarballs and fake engines."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from umprov.deploy.image_tar import (
    RewriteStats,
    chain_ids,
    graph_store_problem,
    host_chain_ids,
    legacy_v1_ids,
    rewrite_save_stream,
    rootfs_diff_ids,
    skip_plan,
)
from umprov.deploy.options import HostSettings
from umprov.deploy.outcome import HOST_FIELDS, HostState, new_outcome
from umprov.deploy.push import percent, push_image
from umprov.hosts.fanout import Parallel
from umprov.hosts.progress import size_text

# ---------------------------------------------------------------------------------------------
# Real data: `docker save` of a three-layer image on Docker 20.10.24 (Debian docker.io): the
# folder names (v1 IDs), each folder's json, and the image's RootFS diff IDs.

REAL_DIFF_IDS = [
    "sha256:2960bc3c608f3c34b8e4b34841a71c36f5351a7437a8e86a06b8f4c3c4bba491",
    "sha256:ad460752c5c48b0c8f21c5ab9cb47e9676b80a47a6ced78a17efb4475932d425",
    "sha256:653c869de18eb1c82fb2902dbbc0815fb3323ad37f087709813ff3815fa1b430",
]
# As found in the engine's layerdb (/var/lib/docker/image/overlay2/layerdb/sha256/<chain>).
REAL_CHAIN_IDS = [
    "sha256:2960bc3c608f3c34b8e4b34841a71c36f5351a7437a8e86a06b8f4c3c4bba491",
    "sha256:18b2f30271a613160904f5428c62c1628fc7dc26c79f6eb81e973b4a861f8521",
    "sha256:689fa08b5fe64720cd1bd207bddff5630f4fa748af7d682e6805f1d5bf3cd2d4",
]
_EMPTY_CONFIG = (
    '{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,'
    '"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,"Cmd":null,'
    '"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":null}'
)
_TOP_CONFIG = (
    '{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,'
    '"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":["container=docker",'
    '"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s,'
    '"Image":"sha256:47b921a9d51168d64c2d85b125878bd8c87f13b722d6ba5bbe1a5f9bb667d251",'
    '"Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,'
    '"Labels":{"umprov.lab.image":"host"}}'
)
REAL_FOLDERS = {
    "ec4cbb3d209c9edeea6188ab97bcb55e8afe5957583c6f9f102f18f5c01251d8": (
        '{"id":"ec4cbb3d209c9edeea6188ab97bcb55e8afe5957583c6f9f102f18f5c01251d8",'
        '"created":"1970-01-01T00:00:00Z","container_config":' + _EMPTY_CONFIG + ',"os":"linux"}'
    ),
    "bc61e9c99e249ef705375e0059f0b19a3aa95130b975a8c9409d2247a2227c71": (
        '{"id":"bc61e9c99e249ef705375e0059f0b19a3aa95130b975a8c9409d2247a2227c71",'
        '"parent":"ec4cbb3d209c9edeea6188ab97bcb55e8afe5957583c6f9f102f18f5c01251d8",'
        '"created":"1970-01-01T00:00:00Z","container_config":' + _EMPTY_CONFIG + ',"os":"linux"}'
    ),
    "527dd1f3f96e95845f400db574f4eb0081d0dd0bc11e44c70dbc3a6a1c37ff01": (
        '{"id":"527dd1f3f96e95845f400db574f4eb0081d0dd0bc11e44c70dbc3a6a1c37ff01",'
        '"parent":"bc61e9c99e249ef705375e0059f0b19a3aa95130b975a8c9409d2247a2227c71",'
        '"created":"2026-11-30T23:55:05.349293812Z","container_config":'
        + _TOP_CONFIG % '["/bin/sh","-c","#(nop) COPY file:062502c1a20aed79f3b245a28e3ef30f7cc2f6'
        'da1f5d715ce557ead911028514 in /b.txt "]'
        + ',"docker_version":"20.10.24+dfsg1","config":' + _TOP_CONFIG % '["/sbin/init"]'
        + ',"architecture":"amd64","os":"linux"}'
    ),
}


def test_chain_ids_match_the_engines_layer_store() -> None:
    assert chain_ids(REAL_DIFF_IDS) == REAL_CHAIN_IDS
    assert chain_ids([]) == []


def test_legacy_v1_ids_identify_each_real_folder_and_only_it() -> None:
    for index, (folder, text) in enumerate(REAL_FOLDERS.items()):
        matches = [i for i, chain in enumerate(REAL_CHAIN_IDS)
                   if folder in legacy_v1_ids(text.encode(), chain)]
        assert matches == [index], folder


# ---------------------------------------------------------------------------------------------
# Fake docker-save tarballs, written the way moby's save.go writes them


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _go_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class FakeImage:
    """An image and its `docker save` tarball, in the legacy (Docker <= 24) or OCI (25+)
    layout."""

    layers: list[bytes]
    tag: str = "fake/image:v1"
    layout: str = "legacy"
    diff_ids: list[str] = field(init=False)
    config: bytes = field(init=False)
    image_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.diff_ids = [_digest(data) for data in self.layers]
        self.config = _go_json({
            "architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/true"]},
            "rootfs": {"type": "layers", "diff_ids": self.diff_ids},
        }).encode()
        self.image_id = _digest(self.config)

    @property
    def attrs(self) -> dict[str, Any]:
        return {"Id": self.image_id, "Size": sum(len(x) for x in self.layers),
                "RootFS": {"Type": "layers", "Layers": list(self.diff_ids)}}

    def save(self) -> bytes:
        entries: dict[str, bytes | str | None] = {}  # path -> data, symlink target, or dir
        layer_paths = []
        if self.layout == "legacy":
            parent = ""
            seen: dict[str, str] = {}
            for i, (data, chain) in enumerate(zip(self.layers, chain_ids(self.diff_ids),
                                                  strict=True)):
                top = i == len(self.layers) - 1
                v1 = {"created": "1970-01-01T00:00:00Z" if not top else "2026-01-01T00:00:00Z",
                      "container_config": {"Cmd": None, "Image": ""}}
                if top:
                    v1["os"] = "linux"
                # image/v1.CreateID: the map with layer_id and parent, keys sorted.
                hashed = dict(v1, layer_id=chain)
                if parent:
                    hashed["parent"] = "sha256:" + parent
                v1_id = hashlib.sha256(
                    json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode()
                ).hexdigest()
                stored = {"id": v1_id, **({"parent": parent} if parent else {}), **v1,
                          "os": "linux"}
                entries[f"{v1_id}/"] = None
                entries[f"{v1_id}/VERSION"] = b"1.0"
                entries[f"{v1_id}/json"] = _go_json(stored).encode()
                if self.diff_ids[i] in seen:
                    entries[f"{v1_id}/layer.tar"] = f"../{seen[self.diff_ids[i]]}/layer.tar"
                else:
                    entries[f"{v1_id}/layer.tar"] = data
                    seen[self.diff_ids[i]] = v1_id
                layer_paths.append(f"{v1_id}/layer.tar")
                parent = v1_id
            config_path = self.image_id[7:] + ".json"
            entries[config_path] = self.config
        else:
            entries["blobs/"] = None
            entries["blobs/sha256/"] = None
            for diff, data in zip(self.diff_ids, self.layers, strict=True):
                entries[f"blobs/sha256/{diff[7:]}"] = data
                layer_paths.append(f"blobs/sha256/{diff[7:]}")
            config_path = f"blobs/sha256/{self.image_id[7:]}"
            entries[config_path] = self.config
            entries["index.json"] = b'{"schemaVersion":2,"manifests":[]}'
            entries["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
        entries["manifest.json"] = _go_json(
            [{"Config": config_path, "RepoTags": [self.tag], "Layers": layer_paths}]
        ).encode()
        entries["repositories"] = b"{}"
        buf = io.BytesIO()
        # Go's archive/tar through pkg/archive.Tar: the folder walked in lexical order.
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(entries):
                value = entries[path]
                info = tarfile.TarInfo(path.rstrip("/"))
                info.mtime = 1_700_000_000
                if value is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif isinstance(value, str):
                    info.type, info.linkname = tarfile.SYMTYPE, value
                    tar.addfile(info)
                else:
                    info.size, info.mode = len(value), 0o644
                    tar.addfile(info, io.BytesIO(value))
        return buf.getvalue()


def _chunks(data: bytes, size: int = 7777) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _members(data: bytes) -> dict[str, bytes | str | None]:
    out: dict[str, bytes | str | None] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            if m.isreg():
                out[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
            elif m.issym():
                out[m.name] = m.linkname
            else:
                out[m.name] = None
    return out


def _rewrite(image: FakeImage, held_layers: int, chunk: int = 7777) -> tuple[bytes, RewriteStats]:
    held = set(chain_ids(image.diff_ids)[:held_layers])
    out = io.BytesIO()
    stats = rewrite_save_stream(_chunks(image.save(), chunk),
                                skip_plan(image.diff_ids, held), out)
    return out.getvalue(), stats


LAYERS = [_layer({"base/big": b"B" * 50_000}), _layer({"mid/lib": b"M" * 20_000}),
          _layer({"top/app": b"new app"})]


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_rewrite_leaves_out_exactly_the_held_layers(layout: str) -> None:
    image = FakeImage(LAYERS, layout=layout)
    original = _members(image.save())
    data, stats = _rewrite(image, held_layers=2)
    rewritten = _members(data)
    dropped = set(original) - set(rewritten)
    assert len(dropped) == 2 and stats.skipped_layers == 2
    assert stats.skipped_bytes == len(LAYERS[0]) + len(LAYERS[1])
    assert {original[name] for name in dropped} == {LAYERS[0], LAYERS[1]}
    for name, value in rewritten.items():  # all the rest: byte for byte, in order
        assert original[name] == value
    assert list(rewritten) == [n for n in original if n not in dropped]
    assert len(data) < len(image.save()) - stats.skipped_bytes + 10240 * 2


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_rewrite_without_a_plan_copies_everything(layout: str) -> None:
    image = FakeImage(LAYERS, layout=layout)
    data, stats = _rewrite(image, held_layers=0, chunk=1 << 20)
    assert _members(data) == _members(image.save())
    assert stats.skipped_bytes == 0 and stats.skipped_layers == 0


def test_rewrite_keeps_layers_held_only_at_another_position() -> None:
    """The layer store is keyed by chain ID: the same diff ID on another base is not held."""
    image = FakeImage(LAYERS)
    other = FakeImage([_layer({"other/base": b"O"}), LAYERS[1]])
    plan = skip_plan(image.diff_ids, set(chain_ids(other.diff_ids)))
    assert plan == {}


def test_rewrite_never_drops_a_diff_id_the_image_repeats() -> None:
    """A repeated diff ID is saved once and linked (legacy symlink): never left out."""
    image = FakeImage([LAYERS[0], LAYERS[1], LAYERS[1], LAYERS[2]])
    original = _members(image.save())
    assert any(isinstance(v, str) for v in original.values())  # the symlink is there
    data, stats = _rewrite(image, held_layers=3)
    rewritten = _members(data)
    assert stats.skipped_layers == 1 and stats.skipped_bytes == len(LAYERS[0])
    assert sum(1 for v in rewritten.values() if v == LAYERS[1]) == 1
    assert sum(1 for v in rewritten.values() if isinstance(v, str)) == 1


def test_rewrite_sends_a_layer_whose_folder_does_not_match() -> None:
    """A legacy folder whose json does not hash to its name is not identified: sent."""
    image = FakeImage(LAYERS)
    raw = image.save()
    members = _members(raw)
    folder = next(n for n, v in members.items() if v == LAYERS[0]).split("/")[0]
    doctored = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, \
            tarfile.open(fileobj=doctored, mode="w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            f = tin.extractfile(m) if m.isreg() else None
            if m.name == f"{folder}/json":
                body = f.read().replace(b'"created":"1970', b'"created":"1971')  # type: ignore[union-attr]
                m.size = len(body)
                f = io.BytesIO(body)
            tout.addfile(m, f)
    out = io.BytesIO()
    held = set(chain_ids(image.diff_ids)[:2])
    stats = rewrite_save_stream(_chunks(doctored.getvalue()),
                                skip_plan(image.diff_ids, held), out)
    rewritten = _members(out.getvalue())
    assert LAYERS[0] in rewritten.values() and LAYERS[1] not in rewritten.values()
    assert stats.skipped_layers == 1


def test_rewrite_of_a_broken_stream_raises() -> None:
    image = FakeImage(LAYERS)
    raw = image.save()
    with pytest.raises(tarfile.TarError):
        rewrite_save_stream(_chunks(raw[: len(raw) // 3]),
                            skip_plan(image.diff_ids, set(chain_ids(image.diff_ids))),
                            io.BytesIO())


# ---------------------------------------------------------------------------------------------
# What the host holds


def test_graph_store_problem() -> None:
    overlay = {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"],
                                                      ["Supports d_type", "true"]]}
    assert graph_store_problem(overlay) is None
    snap = {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}
    assert "containerd image store" in (graph_store_problem(snap) or "")
    assert "not a graph driver" in (graph_store_problem({"Driver": "stargz"}) or "")
    assert graph_store_problem({}) is not None


def test_rootfs_diff_ids_refuses_odd_answers() -> None:
    assert rootfs_diff_ids({"RootFS": {"Type": "layers", "Layers": REAL_DIFF_IDS}}) == REAL_DIFF_IDS
    assert rootfs_diff_ids({"RootFS": {"Type": "other", "Layers": REAL_DIFF_IDS}}) is None
    assert rootfs_diff_ids({"RootFS": {"Type": "layers", "Layers": ["sha256:xyz"]}}) is None
    assert rootfs_diff_ids({"RootFS": {"Type": "layers", "Layers": []}}) is None
    assert rootfs_diff_ids({}) is None


class FakeEngine:
    """A host's engine, as far as the push uses it; its load follows moby's tarexport: untar
    everything, then for each layer use the held chain ID or else open the layer file."""

    def __init__(self, images: list[FakeImage] = (), driver: str = "overlay2",
                 driver_status: list[list[str]] | None = None) -> None:
        self.driver, self.driver_status = driver, driver_status or []
        self.images_by_id = {img.image_id: img for img in images}
        self.chains = {c for img in images for c in chain_ids(img.diff_ids)}
        self.received = 0
        self.api = SimpleNamespace(
            images=lambda: [{"Id": i} for i in self.images_by_id],
            inspect_image=self.inspect_image,
            load_image=lambda data: self.load_image(data),
        )
        self.images = SimpleNamespace(get=self._get)

    def info(self) -> dict[str, Any]:
        return {"Driver": self.driver, "DriverStatus": self.driver_status}

    def inspect_image(self, image_id: str) -> dict[str, Any]:
        return self.images_by_id[image_id].attrs

    def _get(self, image_id: str) -> Any:
        from docker.errors import ImageNotFound

        if image_id not in self.images_by_id:
            raise ImageNotFound(image_id)
        return SimpleNamespace(id=image_id)

    def load_image(self, data: Iterator[bytes]) -> Iterator[dict[str, str]]:
        raw = b"".join(data)
        self.received += len(raw)
        files = _members(raw)
        manifest = json.loads(files["manifest.json"])[0]  # type: ignore[arg-type]
        config = files[manifest["Config"]]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]  # type: ignore[arg-type]
        for path, chain, diff in zip(manifest["Layers"], chain_ids(diff_ids), diff_ids,
                                     strict=True):
            if chain in self.chains:
                continue
            body = files.get(path)
            while isinstance(body, str):  # a symlink, relative to its folder
                path = posixpath.normpath(posixpath.join(posixpath.dirname(path), body))
                body = files.get(path)
            if body is None:
                yield {"error": f"open {path}: no such file or directory"}
                return
            assert _digest(body) == diff  # type: ignore[arg-type]
            self.chains.add(chain)
        image = FakeImage.__new__(FakeImage)
        image.diff_ids, image.config = diff_ids, config  # type: ignore[assignment]
        image.image_id, image.layers = _digest(config), []  # type: ignore[arg-type]
        self.images_by_id[image.image_id] = image
        yield {"stream": f"Loaded image ID: {image.image_id}\n"}


def test_host_chain_ids_and_store_check() -> None:
    v1 = FakeImage(LAYERS[:2])
    held, why = host_chain_ids(FakeEngine([v1]))
    assert held == set(chain_ids(v1.diff_ids)) and why == ""
    held, why = host_chain_ids(FakeEngine([v1], driver="overlayfs",
                                          driver_status=[["driver-type",
                                                          "io.containerd.snapshotter.v1"]]))
    assert held is None and "containerd" in why


# ---------------------------------------------------------------------------------------------
# The push loop with fake engines


class FakeLocal:
    def __init__(self, image: FakeImage) -> None:
        self.image = image
        self.saves = 0
        self.api = self
        self.images = SimpleNamespace(
            get=lambda ref: SimpleNamespace(id=image.image_id, attrs=image.attrs))

    def get_image(self, ref: str, chunk_size: int) -> Iterator[bytes]:
        self.saves += 1
        return _chunks(self.image.save(), 4096)


def _push(engines: dict[str, FakeEngine], image: FakeImage, workers: int = 2
          ) -> tuple[list[Any], list[tuple[str, str]], FakeLocal]:
    settings = HostSettings(image.tag, "none", 2222, 8888, "127.0.0.1", "umprov")
    states = [HostState(SimpleNamespace(name=n), new_outcome(n), settings, client=e)
              for n, e in engines.items()]
    messages: list[tuple[str, str]] = []
    lock = threading.Lock()

    def progress(host: str, msg: str) -> None:
        with lock:
            messages.append((host, msg))

    local = FakeLocal(image)
    push_image(states, local, Parallel(workers), progress)
    return states, messages, local


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_push_one_save_full_and_incremental_hosts(layout: str) -> None:
    v1 = FakeImage(LAYERS[:2], layout=layout)
    v2 = FakeImage(LAYERS, tag="fake/image:v2", layout=layout)
    engines = {"fresh": FakeEngine(), "has-v1": FakeEngine([v1]), "has-v1-too": FakeEngine([v1]),
               "snapshotter": FakeEngine([v1], driver="overlayfs",
                                         driver_status=[["driver-type",
                                                         "io.containerd.snapshotter.v1"]])}
    # More hosts than pool workers: the broadcast must not wait on a host that never reads.
    states, messages, local = _push(engines, v2, workers=1)
    assert local.saves == 1
    by = {st.host.name: st for st in states}
    for st in states:
        assert st.outcome.state == "pending" and st.image_id == v2.image_id, st.outcome.detail
        assert v2.image_id in engines[st.host.name].images_by_id
    full = len(v2.save())
    for name in ("fresh", "snapshotter"):
        assert by[name].outcome.data["skipped_bytes"] == 0
        assert by[name].outcome.data["pushed_bytes"] == engines[name].received >= full
    for name in ("has-v1", "has-v1-too"):
        assert by[name].outcome.data["skipped_bytes"] == len(LAYERS[0]) + len(LAYERS[1])
        assert by[name].outcome.data["pushed_bytes"] == engines[name].received < full - 60_000
    text = "\n".join(f"{h}: {m}" for h, m in messages)
    assert "has-v1: the host already has 2 of the image's 3 layers" in text
    assert "snapshotter: sending every layer (containerd image store" in text
    assert "MB already on the host" in text or "kB already on the host" in text


def test_push_falls_back_to_the_full_stream_when_an_incremental_load_fails() -> None:
    v1 = FakeImage(LAYERS[:2])
    v2 = FakeImage(LAYERS, tag="fake/image:v2")
    engine = FakeEngine([v1])
    original = engine.load_image
    calls = []

    def forgetful_load(data: Iterator[bytes]) -> Iterator[dict[str, str]]:
        if not calls:  # the held layers vanish between the question and the load
            engine.chains.clear()
        calls.append(1)
        return original(data)

    engine.load_image = forgetful_load  # type: ignore[method-assign]
    states, messages, local = _push({"h": engine}, v2)
    st = states[0]
    assert st.image_id == v2.image_id and st.outcome.state == "pending"
    assert local.saves == 2 and len(calls) == 2
    assert st.outcome.data["skipped_bytes"] == 0
    assert any("incremental push failed" in m and "no such file" in m for _, m in messages)


def test_push_reports_a_failed_docker_save_on_every_host() -> None:
    v2 = FakeImage(LAYERS)
    engines = {"a": FakeEngine([FakeImage(LAYERS[:2])]), "b": FakeEngine()}

    class BrokenLocal(FakeLocal):
        def get_image(self, ref: str, chunk_size: int) -> Iterator[bytes]:
            self.saves += 1
            raise RuntimeError("engine went away")

    settings = HostSettings(v2.tag, "none", 2222, 8888, "127.0.0.1", "umprov")
    states = [HostState(SimpleNamespace(name=n), new_outcome(n), settings, client=e)
              for n, e in engines.items()]
    local = BrokenLocal(v2)
    push_image(states, local, Parallel(2), lambda h, m: None)
    assert local.saves == 1  # no retry: the save itself failed
    for st in states:
        assert st.outcome.state == "failed"
        assert "docker save failed: engine went away" in st.outcome.detail


def test_progress_percentage_never_passes_99_before_the_end() -> None:
    assert percent(1274, 1228) == " (~99%)"
    assert percent(614, 1228) == " (~50%)"
    assert percent(5, 0) == ""
    assert size_text(51_200) == "51 kB" and size_text(1_273_525_760) == "1274 MB"
    assert size_text(0) == "0 MB"


def test_push_splits_the_transfer_from_the_hosts_load() -> None:
    """The host's docker load registers the layers only after the stream has ended; the result
    and the progress say how long each part took."""
    v2 = FakeImage(LAYERS, tag="fake/image:v2")
    engine = FakeEngine()
    original = engine.load_image

    def slow_registration(data: Iterator[bytes]) -> Iterator[dict[str, str]]:
        raw = b"".join(data)  # the whole body read: from here on, no more transfer
        time.sleep(0.3)
        yield from original(iter([raw]))

    engine.load_image = slow_registration  # type: ignore[method-assign]
    states, messages, _ = _push({"h": engine}, v2)
    from umprov.hosts.render import records

    outcome = states[0].outcome
    stream_seconds = outcome.data["push_stream_seconds"]
    assert states[0].image_id == v2.image_id
    assert 0 < stream_seconds <= outcome.data["push_seconds"] - 0.3
    assert records([outcome], HOST_FIELDS)[0]["push_stream_seconds"] == round(stream_seconds, 2)
    texts = [m for _, m in messages]
    assert any("the host's docker load is registering the layers" in m for m in texts)
    assert any(m.startswith("pushed ") and "(sent in " in m and ", loaded in " in m
               for m in texts)


def test_push_cell_shows_the_transfer_rate_and_the_load_time() -> None:
    from umprov.cli.deploy import push_cell

    def outcome(**figures: float) -> Any:
        made = new_outcome("h")
        made.data.update(figures)
        return made

    result = outcome(pushed_bytes=1_274_000_000, push_seconds=24.4, push_stream_seconds=12.7)
    assert push_cell(result) == "1274 MB in 24 s: sent at 100 MB/s, loaded in 12 s"
    small = outcome(pushed_bytes=51_200, push_seconds=10.1, push_stream_seconds=0.2,
                    skipped_bytes=1_273_500_000)
    assert push_cell(small) == "51 kB in 10 s (1274 MB already on the host)"
    assert push_cell(outcome()) == ""
