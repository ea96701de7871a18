"""Where frames go inside a node: into the reduce pipeline, out of it, through the forks and the
static muxes to ``cw_out``, ``ccw_out`` and the host.

The muxes are static choices by role: the ``rank`` and ``nodes`` registers
(:class:`~wirereduce.hdl.core.control.RunState`) set them when a collective starts, and they do
not change while it runs.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from wirereduce.hdl.core.reduce import reduce_input_layout
from wirereduce.hdl.stream.frame import Fork, FrameArbiter, FrameStream, beat_layout

from wirereduce.protocol import Flag, Opcode

__all__ = ["pipeline_input", "pipeline_output", "broadcast_fork", "ccw_output", "host_output"]


def _stream_mux(m, sel, a, b, o):
    """Connect ``o`` to stream ``a`` when ``sel`` else to ``b`` (a static, per-collective choice)."""
    m.d.comb += [
        o.valid.eq(Mux(sel, a.valid, b.valid)),
        o.payload.eq(Mux(sel, a.payload.as_value(), b.payload.as_value())),
        a.ready.eq(sel & o.ready),
        b.ready.eq(~sel & o.ready),
    ]


def _stream_mux_out(m, sel, src, a, b):
    """Route stream ``src`` to ``a`` when ``sel`` else to ``b`` (a static, per-collective choice)."""
    m.d.comb += [
        a.payload.eq(src.payload), b.payload.eq(src.payload),
        a.valid.eq(src.valid & sel), b.valid.eq(src.valid & ~sel),
        src.ready.eq(Mux(sel, a.ready, b.ready)),
    ]


def _set_header_byte(m, src, dst, byte, value):
    """Copy tagged beat stream ``src`` to ``dst`` with header byte ``byte`` set to ``value``."""
    m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready), dst.payload.eq(src.payload)]
    with m.If(src.payload.first):
        m.d.comb += dst.payload.data[8 * byte:8 * byte + 8].eq(value)


def _untag(m, src, dst):
    """Drop the ``first`` flag: tagged beat stream ``src`` to plain beat stream ``dst``."""
    m.d.comb += [
        dst.valid.eq(src.valid), src.ready.eq(dst.ready),
        dst.payload.data.eq(src.payload.data), dst.payload.keep.eq(src.payload.keep),
        dst.payload.last.eq(src.payload.last), dst.payload.bad.eq(src.payload.bad),
    ]


def pipeline_input(m: Module, pipe, src_host, src_ring, run, width: int, index_bits: int, slot_bad):
    """Feed ``pipe``: rank 0 passes its host's chunks (gated stream ``src_host``) through, the
    others add the local chunk to the ring's REDUCE frames (``src_ring``); the frames leave as
    BROADCAST from rank N-1, as REDUCE from the others. ``slot_bad`` (high while the local chunk
    of ``src_ring``'s frame was lost) marks the sum's last beat ``bad``."""
    rin = stream.Signature(reduce_input_layout(width, index_bits)).create()
    m.d.comb += [
        rin.valid.eq(Mux(run.is_first, src_host.valid, src_ring.valid)),
        rin.payload.eq(Cat(Mux(run.is_first, src_host.payload.as_value(), src_ring.payload.as_value()),
                           ~run.is_first)),
        src_host.ready.eq(Mux(run.is_first, rin.ready, 1)),  # ranks > 0: the buffer always takes it
        src_ring.ready.eq(~run.is_first & rin.ready),
    ]
    with m.If(~run.is_first & src_ring.payload.last & slot_bad):
        m.d.comb += rin.payload.bad.eq(1)
    wiring.connect(m, rin, pipe.i)
    m.d.comb += [
        pipe.rank.eq(run.rank),
        pipe.opcode.eq(Mux(run.is_last, Opcode.BROADCAST, Opcode.REDUCE)),
    ]


def pipeline_output(m: Module, pipe, run, tagged, cw_out):
    """Send ``pipe``'s frames on to rank+1 (``cw_out``), or (rank N-1) into the returned fork,
    whose ``a`` goes counter-clockwise and ``b`` to the host."""
    m.submodules.last_fork = last_fork = Fork(tagged)
    cw_tagged = stream.Signature(tagged).create()
    fork_in = stream.Signature(tagged).create()
    _stream_mux_out(m, ~run.is_last, pipe.o, cw_tagged, fork_in)
    wiring.connect(m, fork_in, last_fork.i)
    m.d.comb += [last_fork.en_a.eq(1), last_fork.en_b.eq(1)]
    _untag(m, cw_tagged, cw_out)
    return last_fork


def broadcast_fork(m: Module, src, run, tagged):
    """Copy the BROADCAST frames of gated stream ``src`` (the ccw gate) to the returned fork's
    ``a`` (forwarded, at ranks > 0) and ``b`` (to the host), with ``src`` = rank and ``hop`` + 1."""
    m.submodules.bc_fork = bc_fork = Fork(tagged)
    g = src.payload
    m.d.comb += [
        bc_fork.i.valid.eq(src.valid),
        src.ready.eq(bc_fork.i.ready),
        bc_fork.i.payload.data.eq(g.data),
        bc_fork.i.payload.keep.eq(g.keep),
        bc_fork.i.payload.last.eq(g.last),
        bc_fork.i.payload.bad.eq(g.bad),
        bc_fork.i.payload.first.eq(g.first),
        bc_fork.en_a.eq(~run.is_first),
        bc_fork.en_b.eq(1),
    ]
    with m.If(g.first):
        m.d.comb += [bc_fork.i.payload.data[40:48].eq(run.rank), bc_fork.i.payload.data[48:56].eq(g.hdr.hop + 1)]
    return bc_fork


def ccw_output(m: Module, last_fork, bc_fork, run, tagged, ccw_out):
    """``ccw_out``: the broadcast starts at rank N-1 (``last_fork``) and is forwarded by the ranks
    in between (``bc_fork``)."""
    ccw_tagged = stream.Signature(tagged).create()
    _stream_mux(m, run.is_last, last_fork.a, bc_fork.a, ccw_tagged)
    _untag(m, ccw_tagged, ccw_out)


def host_output(m: Module, last_fork, bc_fork, status, run, events, tagged, width: int, host_tx):
    """``host_tx``: every finished chunk as HOST_RESULT (from ``last_fork`` at rank N-1, else from
    ``bc_fork``), merged a whole frame at a time with the STATS frames of ``status``; results
    win ties.

    A LOST placeholder (``flags`` has ``Flag.LOST``; header only, marked ``bad`` on the ring)
    leaves to the host *unmarked*: it is a well-formed report that the chunk is lost, sent with a
    good FCS, so that the host's driver learns of the loss at once instead of waiting for its
    deadline (docs/protocol.md "Lost chunks")."""
    result = stream.Signature(tagged).create()
    _stream_mux(m, run.is_last, last_fork.b, bc_fork.b, result)
    result_op = stream.Signature(tagged).create()
    _set_header_byte(m, result, result_op, 1, Opcode.HOST_RESULT)
    result_beats = FrameStream(width).create()
    _untag(m, result_op, result_beats)
    lost_bit = 8 * 7 + (int(Flag.LOST).bit_length() - 1)  # header byte 7 (flags), in beat 0
    lost_first = result_op.payload.first & result_op.payload.data[lost_bit]
    lost_reg = Signal()
    with m.If(result_op.valid & result_op.ready & result_op.payload.first):
        m.d.sync += lost_reg.eq(lost_first)
    with m.If(Mux(result_op.payload.first, lost_first, lost_reg)):
        m.d.comb += result_beats.payload.bad.eq(0)
    with m.If(result_op.valid & result_op.ready & result_op.payload.first):
        m.d.comb += events.flag("result_frames").eq(1)

    m.submodules.tx_arb = tx_arb = FrameArbiter(beat_layout(width), 2)
    wiring.connect(m, result_beats, tx_arb.i0)
    wiring.connect(m, status.o, tx_arb.i1)
    wiring.connect(m, tx_arb.o, host_tx)
