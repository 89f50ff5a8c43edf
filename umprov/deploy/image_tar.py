"""Incremental image push: a ``docker save`` stream without the layers a host already holds.

Why it works (moby ``image/tarexport/load.go``, the graph-driver image store, unchanged from
Docker 1.10 to 28): ``docker load`` untars the whole stream into a temporary folder, then for
each layer of the manifest looks up the layer's chain ID in its layer store first
(``lss.Get(ChainID)``) and opens the layer file only when the layer is missing. A tarball whose
layer files are left out for layers the host already has therefore loads to the same image ID.

Which file is which layer:

- Docker 25 and later save an OCI layout: every layer is ``blobs/sha256/<diff ID>``, one file
  per diff ID; the name says it.
- Docker 24 and earlier save the legacy layout: one folder per layer named by a "v1 ID"
  (``<v1 ID>/VERSION``, ``/json``, ``/layer.tar``), and the manifest that maps folders to
  layers comes last in the stream (the save tars its folder in lexical order). The v1 ID is
  the SHA-256 of the folder's ``json`` rewritten with the layer's chain ID (moby
  ``image/v1.CreateID``), and ``json`` comes before ``layer.tar`` in the stream, so each folder
  is identified before its layer passes: only a folder whose recomputed ID matches exactly is
  left out, which makes the mapping self-checking (no match: the layer is sent).

A layer is left out only when its chain ID is on the host and its diff ID occurs once in the
image: a repeated diff ID is saved once and linked (legacy symlink, shared OCI blob).

The rewrite is streaming (``tarfile`` modes ``r|`` and ``w|``): nothing is buffered beyond a
chunk. Hosts whose engine uses the containerd image store (Docker 29's default for new
installs) get the full stream: its import may need every blob.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any, BinaryIO

CHUNK = 1 << 20

# Storage drivers of the graph-driver image store (daemon/graphdriver); the containerd image
# store reports its snapshotter instead ("overlayfs", driver-type io.containerd.snapshotter.v1).
GRAPH_DRIVERS = frozenset({
    "overlay2", "overlay", "fuse-overlayfs", "btrfs", "zfs", "vfs", "devicemapper", "aufs",
    "windowsfilter",
})

_HEX64 = frozenset("0123456789abcdef")


def chain_ids(diff_ids: Iterable[str]) -> list[str]:
    """Chain IDs of every prefix of a RootFS (moby layer.CreateChainID)."""
    out: list[str] = []
    for diff in diff_ids:
        if not out:
            out.append(diff)
        else:
            out.append("sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return out


def _is_digest(value: Any) -> bool:
    return (
        isinstance(value, str) and value.startswith("sha256:") and len(value) == 71
        and set(value[7:]) <= _HEX64
    )


def rootfs_diff_ids(attrs: Mapping[str, Any]) -> list[str] | None:
    """An image's diff IDs from ``docker image inspect``; None when they look off."""
    rootfs = attrs.get("RootFS") or {}
    layers = rootfs.get("Layers")
    if rootfs.get("Type") != "layers" or not isinstance(layers, list) or not layers:
        return None
    if not all(_is_digest(d) for d in layers):
        return None
    return list(layers)


def graph_store_problem(info: Mapping[str, Any]) -> str | None:
    """Why an engine (``docker info``) is not a graph-driver image store; None when it is."""
    for row in info.get("DriverStatus") or []:
        text = " ".join(str(x) for x in row) if isinstance(row, list | tuple) else str(row)
        if "containerd" in text.lower():
            return f"containerd image store ({text})"
    driver = str(info.get("Driver") or "")
    if driver not in GRAPH_DRIVERS:
        return f"storage driver {driver or 'unknown'} is not a graph driver"
    return None


def host_chain_ids(client: Any) -> tuple[set[str] | None, str]:
    """Chain IDs of the layers under every image on a host's engine.

    (None, reason) when the host must get the full stream: not a graph-driver image store, or
    anything unexpected in the engine's answers.
    """
    info = client.info()
    problem = graph_store_problem(info)
    if problem:
        return None, problem
    held: set[str] = set()
    for summary in client.api.images():
        image_id = summary.get("Id")
        if not image_id:
            continue
        diff_ids = rootfs_diff_ids(client.api.inspect_image(image_id))
        if diff_ids is None:
            continue  # an image without a usable RootFS adds nothing
        held.update(chain_ids(diff_ids))
    return held, ""


def skip_plan(diff_ids: list[str], held: set[str]) -> dict[str, str]:
    """The layers that can be left out: {diff ID: chain ID} for layers whose chain ID the host
    holds and whose diff ID occurs once in the image."""
    counts = Counter(diff_ids)
    return {
        diff: chain
        for diff, chain in zip(diff_ids, chain_ids(diff_ids), strict=True)
        if chain in held and counts[diff] == 1
    }


# ---------------------------------------------------------------------------------------------
# Legacy (Docker <= 24) layer folders: the v1 ID


def _json_members(text: str) -> list[tuple[str, str]]:
    """The top-level members of a JSON object as (key, raw value text), in order."""
    decoder = json.JSONDecoder()
    n = len(text)

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = skip_ws(0)
    if i >= n or text[i] != "{":
        raise ValueError("not a JSON object")
    i = skip_ws(i + 1)
    members: list[tuple[str, str]] = []
    if i < n and text[i] == "}":
        return members
    while True:
        if i >= n or text[i] != '"':
            raise ValueError("expected a key")
        key, i = scanstring(text, i + 1)
        i = skip_ws(i)
        if i >= n or text[i] != ":":
            raise ValueError("expected ':'")
        i = skip_ws(i + 1)
        _value, end = decoder.raw_decode(text, i)
        members.append((key, text[i:end]))
        i = skip_ws(end)
        if i < n and text[i] == ",":
            i = skip_ws(i + 1)
            continue
        if i < n and text[i] == "}":
            return members
        raise ValueError("expected ',' or '}'")


def legacy_v1_ids(layer_json: bytes, chain_id: str) -> set[str]:
    """The v1 IDs a legacy save gives the layer folder holding ``layer_json`` if the layer's
    chain ID is ``chain_id``.

    moby image/v1.CreateID hashes the layer's V1Image without "id" and "parent", plus
    "layer_id" (the chain ID) and "parent" ("sha256:" + the parent's v1 ID), keys sorted, as Go
    marshals a map; save.go then writes that V1Image with "id" and "parent" (no prefix), and
    since Docker 20.10 with "os" added after hashing (an intermediate layer's hashed form has
    no "os"; the top layer's has it). Both forms are returned; the caller compares exactly.
    """
    members = dict(_json_members(layer_json.decode("utf-8")))
    members.pop("id", None)
    parent = members.pop("parent", None)
    members["layer_id"] = json.dumps(chain_id)
    if parent is not None:
        members["parent"] = json.dumps("sha256:" + json.loads(parent))
    out = set()
    for drop_os in (False, True):
        fields = dict(members)
        if drop_os and fields.pop("os", None) is None:
            continue
        body = "{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in sorted(fields)) + "}"
        out.add(hashlib.sha256(body.encode("utf-8")).hexdigest())
    return out


def _legacy_match(folder: str, layer_json: bytes, by_chain: Mapping[str, str]) -> str | None:
    """The diff ID of the planned layer whose v1 ID is ``folder``, if any."""
    if len(folder) != 64 or not set(folder) <= _HEX64:
        return None
    try:
        for chain, diff in by_chain.items():
            if folder in legacy_v1_ids(layer_json, chain):
                return diff
    except (ValueError, UnicodeDecodeError):
        return None
    return None


# ---------------------------------------------------------------------------------------------
# The streaming rewrite


class _IterReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buf = bytearray()
        self._eof = False

    def readable(self) -> bool:
        return True

    def _fill(self, size: int) -> None:
        while not self._eof and (size < 0 or len(self._buf) < size):
            chunk = next(self._chunks, None)
            if chunk is None:
                self._eof = True
            else:
                self._buf += chunk

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        self._fill(size)
        if size < 0 or size >= len(self._buf):
            out = bytes(self._buf)
            self._buf.clear()
        else:
            out = bytes(self._buf[:size])
            del self._buf[:size]
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def drain(self) -> int:
        """Read what is left (so the producer is never left blocked); return its size."""
        left = len(self._buf)
        self._buf.clear()
        for chunk in self._chunks:
            left += len(chunk)
        self._eof = True
        return left


@dataclass
class RewriteStats:
    skipped_bytes: int = 0  # sizes of the layer files left out
    skipped_layers: int = 0
    members: int = 0


def rewrite_save_stream(
    chunks: Iterable[bytes],
    skip: Mapping[str, str],
    out: BinaryIO,
    stats: RewriteStats | None = None,
) -> RewriteStats:
    """Copy a ``docker save`` tar stream to ``out``, leaving out the layer files of ``skip``
    ({diff ID: chain ID}, from ``skip_plan``). Everything else is copied as it comes, in order;
    a layer is left out only when its file is identified for sure (see the module docstring).
    """
    stats = stats if stats is not None else RewriteStats()
    by_chain = {chain: diff for diff, chain in skip.items()}
    legacy: dict[str, str] = {}  # layer folder (v1 ID) -> diff ID, once its json matched
    reader = _IterReader(chunks)
    with (
        tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK) as tin,
        tarfile.open(fileobj=out, mode="w|", bufsize=CHUNK, format=tarfile.PAX_FORMAT) as tout,
    ):
        tout.copybufsize = CHUNK
        for member in tin:
            stats.members += 1
            name = member.name.removeprefix("./")
            parts = name.split("/")
            diff: str | None = None
            if member.isreg() and skip:
                if len(parts) == 3 and parts[:2] == ["blobs", "sha256"]:
                    diff = "sha256:" + parts[2]
                elif len(parts) == 2 and parts[1] == "layer.tar":
                    diff = legacy.get(parts[0])
                elif len(parts) == 2 and parts[1] == "json" and member.size <= CHUNK:
                    data = _read_member(tin, member)
                    match = _legacy_match(parts[0], data, by_chain)
                    if match is not None:
                        legacy[parts[0]] = match
                    tout.addfile(member, io.BytesIO(data))
                    continue
            if diff is not None and diff in skip:
                stats.skipped_bytes += member.size
                stats.skipped_layers += 1
                continue
            if member.isreg():
                tout.addfile(member, tin.extractfile(member))
            else:
                tout.addfile(member)
    reader.drain()
    return stats


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise tarfile.ReadError(f"{member.name}: cannot read")
    data = handle.read()
    if len(data) != member.size:
        raise tarfile.ReadError(f"{member.name}: truncated")
    return data
