"""bench/managed_discard.py's choice of what to discard: whole 2 MiB pages inside free blocks
only (its GPU run: bench/README)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from tests.conftest import REPO

if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

import managed_discard  # noqa: E402

MIB = 1 << 20


def pool(*segments: tuple[int, list[tuple[int, str]]]) -> SimpleNamespace:
    return SimpleNamespace(snapshot=lambda: [
        {"address": address, "blocks": [{"size": size, "state": state} for size, state in blocks]}
        for address, blocks in segments])


def test_only_whole_pages_inside_free_blocks_are_discarded():
    seen = managed_discard.free_ranges(pool(
        (64 * MIB, [(3 * MIB, "active_allocated"), (9 * MIB, "inactive"),
                    (1 * MIB, "inactive"), (4 * MIB, "active_pending_free")]),
        (256 * MIB, [(8 * MIB, "inactive")])))
    # 67-76 MiB free: its whole pages are 68-76; the 1 MiB block holds none
    assert seen == [(68 * MIB, 8 * MIB), (256 * MIB, 8 * MIB)]


def test_a_pool_with_every_block_in_use_has_nothing_to_discard():
    assert managed_discard.free_ranges(pool((0, [(4 * MIB, "active_allocated")]))) == []
