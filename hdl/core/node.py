"""One in-network allreduce node: host port, two ring ports, local buffer and reduce pipeline.

Ring schedule (SPEC.md system 1, with the directions split as ``docs/architecture.md`` shows):
the *reduce* pass runs clockwise, rank 0 → 1 → … → N-1, on the ``cw`` ports; rank N-1
completes each chunk's sum and starts the *broadcast* pass counter-clockwise,
N-1 → N-2 → … → 0, on the ``ccw`` ports, while every node delivers the finished chunk to its
host. Each directed link carries the message once, so reduce and broadcast overlap and the
allreduce of M bytes takes about M / B plus the pipeline's fill time.

Roles by rank (``rank`` and ``nodes`` are run-time registers set by a CONTROL frame):

- rank 0 turns its host's HOST_PUSH frames straight into REDUCE frames (no add);
- ranks 1 … N-2 add their local chunk to each passing REDUCE frame and forward it, and
  forward each BROADCAST frame while delivering it to the host as HOST_RESULT;
- rank N-1 adds its chunk and sends the sum both to the host and counter-clockwise.

Every input goes through a :class:`~wirereduce.hdl.stream.frame.FrameGate`: a frame whose header is
wrong for its port (version, opcode, collective, sequence number, element count, runt) is
dropped whole before any beat of it reaches the adders, and counted in the STATS counters
(:data:`wirereduce.protocol.STATS_COUNTERS`) that a STATS_REQUEST from the host reads.

A frame whose last beat says ``bad`` (a cut-through Ethernet receiver found its FCS wrong after
the node had started on it, :mod:`wirereduce.hdl.stream.frame`) is processed like any other, and every
frame it turns into leaves with ``bad`` on its last beat too: the Ethernet port sends it with a
stomped FCS, the next hop drops it at its host NIC or passes it on marked, and no host ever
receives it. The sum it carried is lost whole; no part of it is applied anywhere. The chunk is
missing at every host (the driver reports it, :class:`~wirereduce.host.driver.ChunksLost`), the
sequence numbers stay in step and the rest of the collective completes. A HOST_PUSH marked
``bad`` does not fill its buffer slot (the ring then waits for that chunk, and the driver
reports the stall).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.codec.port import CodecIn, CodecOut
from wirereduce.hdl.core.reduce import ReducePipeline, reduce_input_layout
from wirereduce.hdl.eth.port import eth_stats_layout, rx_drops
from wirereduce.hdl.stream.frame import (
    Fork,
    FrameArbiter,
    FrameGate,
    beat_layout,
    tagged_layout,
)

from wirereduce.config import NodeConfig
from wirereduce.protocol import (
    ETH_PORT_COUNTERS,
    ETH_PORTS,
    HEADER_BYTES,
    STATS_COUNTERS,
    VERSION,
    Header,
    Opcode,
    header_layout,
)

__all__ = ["Node", "NodeConfig"]


class StatusResponder(wiring.Component):
    """Sends one STATS frame (header + counters as little-endian u32) each time ``trigger`` pulses.

    ``busy`` is high from the trigger until the frame's last beat has left.
    """

    def __init__(self, width: int, counters: int):
        self._width = width
        self._counters = counters
        super().__init__({
            "o": Out(stream.Signature(beat_layout(width))),
            "trigger": In(1),
            "busy": Out(1),
            "header": In(header_layout()),
            "values": In(data.ArrayLayout(32, counters)),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        nbytes = HEADER_BYTES + 4 * self._counters
        nbeats = -(-nbytes // (w // 8))
        snap = Signal(nbeats * w)
        idx = Signal(range(nbeats))
        beats = Array(snap[k * w:(k + 1) * w] for k in range(nbeats))
        tail = nbytes - (nbeats - 1) * (w // 8)
        last = idx == nbeats - 1
        m.d.comb += [
            self.o.payload.data.eq(beats[idx]),
            self.o.payload.keep.eq(Mux(last, (1 << tail) - 1, (1 << (w // 8)) - 1)),
            self.o.payload.last.eq(last),
        ]
        # The snapshot is taken the cycle after the trigger, so that a CONTROL frame's new
        # configuration (written on the trigger's edge) is what the STATS answer reports.
        pending = Signal()
        sending = Signal()
        m.d.comb += [self.busy.eq(pending | sending), self.o.valid.eq(sending)]
        with m.If(sending):
            with m.If(self.o.ready):
                m.d.sync += idx.eq(idx + 1)
                with m.If(last):
                    m.d.sync += [sending.eq(0), idx.eq(0)]
        with m.Elif(pending):
            m.d.sync += [snap.eq(Cat(self.header, self.values)), pending.eq(0), sending.eq(1), idx.eq(0)]
        with m.Elif(self.trigger):
            m.d.sync += pending.eq(1)
        return m


def _stream_mux(m, sel, a, b, o):
    """Connect ``o`` to stream ``a`` when ``sel`` else to ``b`` (a static, per-collective choice)."""
    m.d.comb += [
        o.valid.eq(Mux(sel, a.valid, b.valid)),
        o.payload.eq(Mux(sel, a.payload.as_value(), b.payload.as_value())),
        a.ready.eq(sel & o.ready),
        b.ready.eq(~sel & o.ready),
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


class Node(wiring.Component):
    """One allreduce node (see the module docstring for the schedule and roles).

    Parameters
    ----------
    config : NodeConfig

    Attributes
    ----------
    host_rx : In(stream.Signature(beat_layout(width)))
        Frames from the host: HOST_PUSH, CONTROL, STATS_REQUEST.
    host_tx : Out(stream.Signature(beat_layout(width)))
        Frames to the host: HOST_RESULT, STATS.
    cw_in, cw_out : reduce direction (from rank-1, to rank+1).
    ccw_in, ccw_out : broadcast direction (from rank+1, to rank-1).
    port_stats : In(StructLayout({"host": eth_stats_layout(), "cw": …, "ccw": …}))
        The counters of the Ethernet port in front of ``host_rx``/``host_tx``, ``cw_in``/
        ``ccw_out`` and ``ccw_in``/``cw_out`` (:attr:`wirereduce.hdl.eth.port.EthPort10G.stats`):
        reported in STATS as ``{port}_{counter}``, and summed into ``link_drop_{port}``
        (:func:`wirereduce.hdl.eth.port.rx_drops`); leave at 0 where the ports are not Ethernet.
    """

    def __init__(self, config: NodeConfig | None = None):
        self.config = config if config is not None else NodeConfig()
        beat = stream.Signature(beat_layout(self.config.width))
        super().__init__({
            "host_rx": In(beat), "host_tx": Out(beat),
            "cw_in": In(beat), "cw_out": Out(beat),
            "ccw_in": In(beat), "ccw_out": Out(beat),
            "port_stats": In(data.StructLayout({port: eth_stats_layout() for port in ETH_PORTS})),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w = cfg.width
        tagged = tagged_layout(w)
        slots = cfg.slots
        slot_bits = (slots - 1).bit_length()
        beat_bits = (cfg.slot_beats - 1).bit_length()

        # Run-time configuration, written by CONTROL frames.
        collective = Signal(16)
        rank = Signal(8)
        nodes = Signal(8)
        chunks = Signal(32)
        active = Signal()
        is_first = rank == 0
        is_last = rank == nodes - 1

        # Event counters (STATS_COUNTERS after the first four, which are the configuration).
        # (then link_drop_* and the Ethernet ports' own counters, from ``port_stats``)
        event_names = STATS_COUNTERS[4:STATS_COUNTERS.index("link_drop_host")]
        counters = {name: Signal(32, name=f"cnt_{name}") for name in event_names}
        incs = {name: [] for name in event_names}

        def count(name):
            flag = Signal(name=f"inc_{name}_{len(incs[name])}")
            incs[name].append(flag)
            return flag

        m.submodules.host_gate = host_gate = FrameGate(w, cfg.max_beats)
        m.submodules.cw_gate = cw_gate = FrameGate(w, cfg.max_beats)
        m.submodules.ccw_gate = ccw_gate = FrameGate(w, cfg.max_beats)
        # Ports: straight to the gates, or (codec nodes) through a CodecIn/CodecOut each.
        beat = stream.Signature(beat_layout(w))
        host_rx, cw_in, ccw_in = (wiring.flipped(p) for p in (self.host_rx, self.cw_in, self.ccw_in))
        host_tx, cw_out, ccw_out = (wiring.flipped(p) for p in (self.host_tx, self.cw_out, self.ccw_out))
        if cfg.codec:
            ins = {}
            for name in ("host_rx", "cw_in", "ccw_in"):
                stage = m.submodules[f"codec_{name}"] = CodecIn(w, cfg.max_elements, cfg.max_beats)
                wiring.connect(m, wiring.flipped(getattr(self, name)), stage.i)
                m.d.comb += count("drop_codec").eq(stage.dropped)
                ins[name] = beat.create()
                wiring.connect(m, stage.o, wiring.flipped(ins[name]))
            host_rx, cw_in, ccw_in = ins["host_rx"], ins["cw_in"], ins["ccw_in"]
            outs = {}
            for name in ("host_tx", "cw_out", "ccw_out"):
                stage = m.submodules[f"codec_{name}"] = CodecOut(w, cfg.max_elements, cfg.max_beats)
                wiring.connect(m, stage.o, wiring.flipped(getattr(self, name)))
                inner = beat.create()
                wiring.connect(m, inner, stage.i)
                outs[name] = wiring.flipped(inner)
            host_tx, cw_out, ccw_out = outs["host_tx"], outs["cw_out"], outs["ccw_out"]
        wiring.connect(m, host_rx, host_gate.i)
        wiring.connect(m, cw_in, cw_gate.i)
        wiring.connect(m, ccw_in, ccw_gate.i)
        index_bits = len(host_gate.o.payload.index)

        m.submodules.pipe = pipe = ReducePipeline(w, index_bits, slots, cfg.slot_beats)
        m.submodules.status = status = StatusResponder(w, len(STATS_COUNTERS))

        # Local buffer bookkeeping: which slots hold a pushed chunk, and its element count.
        slot_valid = Signal(slots)
        slot_count = Array(Signal(16, name=f"slot_count{k}") for k in range(slots))

        def slot_of(seq):
            return seq[:slot_bits] if slot_bits else Const(0, 1)

        # Expected sequence numbers per port: frames arrive in order on every port.
        push_seq = Signal(32)
        reduce_seq = Signal(32)
        bcast_seq = Signal(32)

        def gate_decision(gate, opcode_ok, expect_seq, count_bad, wait):
            """Common header checks; returns the accept-transfer strobe of the gate."""
            h = gate.head
            with m.If(gate.head_valid):
                with m.If(gate.head_short):
                    m.d.comb += [gate.drop.eq(1), count("drop_short").eq(1)]
                with m.Elif(h.version != VERSION):
                    m.d.comb += [gate.drop.eq(1), count("drop_version").eq(1)]
                with m.Elif(~opcode_ok):
                    m.d.comb += [gate.drop.eq(1), count("drop_opcode").eq(1)]
                with m.Elif(~active | (h.collective != collective)):
                    m.d.comb += [gate.drop.eq(1), count("drop_collective").eq(1)]
                with m.Elif((h.seq != expect_seq) | (h.seq >= chunks)):
                    m.d.comb += [gate.drop.eq(1), count("drop_seq").eq(1)]
                with m.Elif(count_bad):
                    m.d.comb += [gate.drop.eq(1), count("drop_count").eq(1)]
                with m.Elif(~wait):
                    m.d.comb += gate.accept.eq(1)
            return gate.o.valid & gate.o.ready & gate.o.payload.first

        def count_too_big(h):
            return (h.count == 0) | (h.count > cfg.max_elements)

        # --- host port -------------------------------------------------------------------
        hh = host_gate.head
        host_ctl = hh.opcode == Opcode.CONTROL
        host_stats = hh.opcode == Opcode.STATS_REQUEST
        with m.If(host_gate.head_valid & ~host_gate.head_short & (hh.version == VERSION)
                  & (host_ctl | host_stats)):
            # Control and status requests are consumed here and answered with one STATS frame.
            with m.If(~status.busy):
                m.d.comb += [host_gate.drop.eq(1), status.trigger.eq(1)]
                with m.If(host_ctl):
                    m.d.sync += [
                        collective.eq(hh.collective), rank.eq(hh.src), nodes.eq(hh.hop),
                        chunks.eq(hh.seq), active.eq(1),
                        push_seq.eq(0), reduce_seq.eq(0), bcast_seq.eq(0), slot_valid.eq(0),
                    ]
        with m.Else():
            push_slot_busy = (slot_valid >> slot_of(hh.seq))[0] & ~is_first
            gate_decision(host_gate, hh.opcode == Opcode.HOST_PUSH, push_seq,
                          count_too_big(hh), push_slot_busy)
        with m.If(host_gate.o.valid & host_gate.o.ready & host_gate.o.payload.first):
            m.d.sync += push_seq.eq(push_seq + 1)
            m.d.comb += count("push_frames").eq(1)

        # Pushed chunks go to the local buffer (ranks > 0) or straight into the ring (rank 0).
        hb_out = host_gate.o.payload
        wr_slot = slot_of(hb_out.hdr.seq)
        m.d.comb += [
            pipe.wr_addr.eq(Cat(hb_out.index[:beat_bits], wr_slot) if slot_bits else hb_out.index[:beat_bits]),
            pipe.wr_data.eq(hb_out.data),
            pipe.wr_en.eq(host_gate.o.valid & host_gate.o.ready & ~is_first),
        ]
        written = host_gate.o.valid & host_gate.o.ready & ~is_first & hb_out.last & ~hb_out.bad

        # --- clockwise input: REDUCE frames ---------------------------------------------------
        ch = cw_gate.head
        cw_slot = slot_of(ch.seq)
        cw_slot_ready = (slot_valid >> cw_slot)[0]
        cw_taken = gate_decision(
            cw_gate, (ch.opcode == Opcode.REDUCE) & ~is_first, reduce_seq,
            cw_slot_ready & (slot_count[cw_slot] != ch.count), ~cw_slot_ready)
        with m.If(cw_taken):
            m.d.sync += reduce_seq.eq(reduce_seq + 1)
            m.d.comb += count("reduce_frames").eq(1)

        # Slot bookkeeping: a push fills a slot; the reduce pipeline's last read frees it.
        for k in range(slots):
            with m.If(written & (wr_slot == k)):
                m.d.sync += [slot_valid[k].eq(1), slot_count[k].eq(hb_out.hdr.count)]
            with m.Elif(pipe.release & (pipe.release_slot == k)):
                m.d.sync += slot_valid[k].eq(0)

        # Pipeline input: rank 0 passes its host's chunk through, the others add to the ring's.
        rin = stream.Signature(reduce_input_layout(w, index_bits)).create()
        src_host = host_gate.o
        src_ring = cw_gate.o
        m.d.comb += [
            rin.valid.eq(Mux(is_first, src_host.valid, src_ring.valid)),
            rin.payload.eq(Cat(Mux(is_first, src_host.payload.as_value(), src_ring.payload.as_value()),
                               ~is_first)),
            src_host.ready.eq(Mux(is_first, rin.ready, 1)),  # ranks > 0: the buffer always takes it
            src_ring.ready.eq(~is_first & rin.ready),
        ]
        wiring.connect(m, rin, pipe.i)
        m.d.comb += [
            pipe.rank.eq(rank),
            pipe.opcode.eq(Mux(is_last, Opcode.BROADCAST, Opcode.REDUCE)),
        ]

        # Pipeline output: on to rank+1, or (rank N-1) to the host and counter-clockwise.
        m.submodules.last_fork = last_fork = Fork(tagged)
        cw_tagged = stream.Signature(tagged).create()
        fork_in = stream.Signature(tagged).create()
        _stream_mux_out(m, ~is_last, pipe.o, cw_tagged, fork_in)
        wiring.connect(m, fork_in, last_fork.i)
        m.d.comb += [last_fork.en_a.eq(1), last_fork.en_b.eq(1)]
        _untag(m, cw_tagged, cw_out)

        # --- counter-clockwise input: BROADCAST frames ------------------------------------------
        bh = ccw_gate.head
        bc_taken = gate_decision(
            ccw_gate, (bh.opcode == Opcode.BROADCAST) & ~is_last, bcast_seq, count_too_big(bh), Const(0, 1))
        with m.If(bc_taken):
            m.d.sync += bcast_seq.eq(bcast_seq + 1)
            m.d.comb += count("broadcast_frames").eq(1)
        m.submodules.bc_fork = bc_fork = Fork(tagged)
        g = ccw_gate.o.payload
        m.d.comb += [
            bc_fork.i.valid.eq(ccw_gate.o.valid),
            ccw_gate.o.ready.eq(bc_fork.i.ready),
            bc_fork.i.payload.data.eq(g.data),
            bc_fork.i.payload.keep.eq(g.keep),
            bc_fork.i.payload.last.eq(g.last),
            bc_fork.i.payload.bad.eq(g.bad),
            bc_fork.i.payload.first.eq(g.first),
            bc_fork.en_a.eq(~is_first),
            bc_fork.en_b.eq(1),
        ]
        with m.If(g.first):
            m.d.comb += [bc_fork.i.payload.data[40:48].eq(rank), bc_fork.i.payload.data[48:56].eq(g.hdr.hop + 1)]

        # ccw_out: the broadcast starts at rank N-1 and is forwarded by the ranks in between.
        ccw_tagged = stream.Signature(tagged).create()
        _stream_mux(m, is_last, last_fork.a, bc_fork.a, ccw_tagged)
        _untag(m, ccw_tagged, ccw_out)

        # --- host delivery ----------------------------------------------------------------------
        result = stream.Signature(tagged).create()
        _stream_mux(m, is_last, last_fork.b, bc_fork.b, result)
        result_op = stream.Signature(tagged).create()
        _set_header_byte(m, result, result_op, 1, Opcode.HOST_RESULT)
        result_beats = stream.Signature(beat_layout(w)).create()
        _untag(m, result_op, result_beats)
        with m.If(result_op.valid & result_op.ready & result_op.payload.first):
            m.d.comb += count("result_frames").eq(1)

        m.submodules.tx_arb = tx_arb = FrameArbiter(beat_layout(w), 2)
        wiring.connect(m, result_beats, tx_arb.i0)
        wiring.connect(m, status.o, tx_arb.i1)
        wiring.connect(m, tx_arb.o, host_tx)

        # --- status ---------------------------------------------------------------------------
        stats_hdr = Header(opcode=Opcode.STATS, count=len(STATS_COUNTERS))
        m.d.comb += [
            status.header.eq(stats_hdr.to_int()),
            status.header.collective.eq(collective),
            status.header.src.eq(rank),
            status.header.hop.eq(nodes),
            status.header.seq.eq(chunks),
        ]
        ps = self.port_stats
        values = ([collective, rank, nodes, chunks] + [counters[n] for n in event_names]
                  + [rx_drops(ps[port]) for port in ETH_PORTS]
                  + [ps[port][name] for port in ETH_PORTS for name in ETH_PORT_COUNTERS])
        assert len(values) == len(STATS_COUNTERS)
        for k, v in enumerate(values):
            m.d.comb += status.values[k].eq(v)
        for name, flags in incs.items():
            if flags:
                total = flags[0]
                for f in flags[1:]:
                    total = total + f
                m.d.sync += counters[name].eq(counters[name] + total)

        return m


def _stream_mux_out(m, sel, src, a, b):
    """Route stream ``src`` to ``a`` when ``sel`` else to ``b`` (a static, per-collective choice)."""
    m.d.comb += [
        a.payload.eq(src.payload), b.payload.eq(src.payload),
        a.valid.eq(src.valid & sel), b.valid.eq(src.valid & ~sel),
        src.ready.eq(Mux(sel, a.ready, b.ready)),
    ]
