"""Hop latency of the schedule engine in amaranth.sim: cut-through within the 16 cycles of
docs/background.md "Performance targets", at 64 and 512 bit, whatever the MTU
(:mod:`wirereduce.sim.bench.latency`)."""

from __future__ import annotations

import pytest
from wirereduce.sim.bench.latency import engine_hop_latency, hop_latency


def test_hop_latency_within_target():
    # The ring's hop (P = 2 engine): a two-term reduce and a forwarded broadcast.
    got = {(w, p): hop_latency(w, 1500, p) for w, p in ((64, "reduce"), (64, "broadcast"), (512, "reduce"))}
    assert all(isinstance(v, int) and 0 < v <= 16 for v in got.values()), got
    # The hop does not wait for the frame: it cuts through, whatever the MTU.
    assert hop_latency(64, 9000, "reduce") == got[64, "reduce"]


def test_engine_hop_latency_within_target():
    # The schedule engine's hop (P = 4, a VC709 torus node): a two-term reduce and a forwarded
    # broadcast (which the engine takes only after its own partial sum of the chunk left) both
    # cut through within the 16 cycles.
    got = {p: engine_hop_latency(64, 4, 2, p, 1500) for p in ("reduce", "broadcast")}
    assert all(isinstance(v, int) and 0 < v <= 16 for v in got.values()), got


def test_codec_engine_uncompressed_hop_cuts_through():
    # With the codec at its ports an uncompressed frame still cuts through: its hop costs the two
    # codec stages' fixed delay (FrameGate, registered route decision, bypass FIFO: 10 cycles at 64
    # bit, docs/codec.md), whatever the MTU, not a frame time (a 1,500-byte frame is 188 beats).
    plain = engine_hop_latency(64, 2, 2, "reduce", 1500)
    codec = [engine_hop_latency(64, 2, 2, "reduce", mtu, codec=True) for mtu in (1500, 9000)]
    assert all(plain < c <= plain + 10 for c in codec), (plain, codec)


def test_hop_latency_errors():
    with pytest.raises(ValueError, match="path"):
        hop_latency(64, 1500, "sideways")
    with pytest.raises(ValueError, match="width"):
        hop_latency(96)
    with pytest.raises(TypeError, match="width"):
        hop_latency("64")
