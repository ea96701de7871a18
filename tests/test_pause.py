# amaranth: UnusedElaboratable=no
"""IEEE 802.3x PAUSE in the 10G MAC (hdl/eth/pause.py, hdl/eth/port.py): frame format against
scapy's MACControlPause, the receive side (consumed, counted, honoured with the 512-bit-time
quantum of IEEE 802.3 annex 31B), the transmit side (XOFF above the high-water mark, refreshed,
XON below the low-water mark) and the loss-free budget, in amaranth.sim."""

from __future__ import annotations

import random

import pytest
from amaranth import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth_harness import stream_recv, stream_send
from test_ethport import MTU, run, stats, wr_frame
from wirereduce.hdl.eth.pause import PAUSE_DST, parse_pause, pause_frame
from wirereduce.hdl.eth.port import EthPort10G, EthPort10GCdc, MacPcsRx, MacPcsTx, eth_header, pause_budget

A_MAC, B_MAC = 0x020000000001, 0x020000000002
#: Columns of the 64-bit XGMII in one pause quantum, from the standard's numbers: 512 bit times
#: (IEEE 802.3 annex 31B.2) over 64 bits a column (clause 46).
COLS = 512 // 64


def scapy_pause(src: int, quanta: int, dst: int = PAUSE_DST) -> bytes:
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether

    mac = lambda v: ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))  # noqa: E731
    return bytes(Ether(dst=mac(dst), src=mac(src)) / MACControlPause(pause_time=quanta))


@pytest.mark.parametrize("quanta", [0, 1, 0x1234, 0xFFFF])
def test_pause_frame_is_scapys(quanta):
    ours = pause_frame(B_MAC, quanta)
    assert ours == scapy_pause(B_MAC, quanta)
    assert len(ours) == 60
    assert parse_pause(ours) == quanta
    assert parse_pause(ours, local_mac=A_MAC) == quanta
    assert parse_pause(pause_frame(B_MAC, quanta, dst=A_MAC), local_mac=A_MAC) == quanta
    assert parse_pause(pause_frame(B_MAC, quanta, dst=0x020000000009), local_mac=A_MAC) is None
    assert parse_pause(eth_header(PAUSE_DST, B_MAC) + bytes(46)) is None  # not MAC Control


def test_pause_arguments_rejected():
    with pytest.raises(ValueError, match="quanta"):
        pause_frame(B_MAC, 1 << 16)
    with pytest.raises(ValueError, match="pause_quanta"):
        EthPort10G(MTU, pause_quanta=0)
    with pytest.raises(ValueError, match="cable_cycles"):
        EthPort10GCdc(MTU, cable_cycles=-1)
    # The budget: the FIFO above the high-water mark holds everything in flight plus one frame.
    f = -(-(MTU + 18) // 8)
    b = pause_budget(MTU + 18, 4)
    assert (b.high, b.low) == (f, f // 2)
    assert b.depth == b.high + b.in_flight + f
    assert b.in_flight >= 2 * (f + 3) + 11 + 2 * 4  # two frames in progress, the XOFF, the cable twice
    assert pause_budget(MTU + 18, 100).in_flight == b.in_flight + 2 * 96
    assert EthPort10G(MTU, flow_control=True, cable_cycles=4, cut_through=True).rx_depth == b.depth
    # A store-and-forward receiver holds every frame whole, so its level reaches f on every full-size
    # frame: its XOFF mark is a frame higher (with high = f, every frame sent an XOFF: the engines'
    # host cables ran at 0.60 of the line rate), the same headroom above it.
    s = pause_budget(MTU + 18, 4, store_and_forward=True)
    assert (s.high, s.low, s.in_flight) == (2 * f, f // 2, b.in_flight) and s.depth == b.depth + f
    assert EthPort10G(MTU, flow_control=True, cable_cycles=4).rx_depth == s.depth
    assert EthPort10G(MTU).rx_depth == 2 * f + 16


class Injector(wiring.Component):
    """Port ``a`` (the one under test) with a bare MacPcsTx sending raw Ethernet frames (``inj``)
    into its receive line and a bare MacPcsRx (``mon``) watching its transmit line."""

    def __init__(self, delay: int = 3):
        self.delay = delay
        self.a = EthPort10G(MTU, local_mac=A_MAC, peer_mac=B_MAC)
        self.inj = MacPcsTx(B_MAC)
        self.mon = MacPcsRx(MTU + 18, depth=512)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a, m.submodules.inj, m.submodules.mon = a, inj, mon = self.a, self.inj, self.mon
        line = inj.o.payload.as_value()
        for _ in range(self.delay):
            r = Signal(66)
            m.d.sync += r.eq(line)
            line = r
        m.d.comb += [inj.o.ready.eq(1), a.line_rx.eq(line), mon.i.valid.eq(1), mon.i.payload.eq(a.line_tx),
                     a.rx.ready.eq(1)]
        return m


def test_received_pause_holds_the_transmitter_for_its_quanta():
    """A PAUSE frame built by scapy arrives while the port sends a stream of frames: it is consumed
    (never delivered, not an EtherType drop), counted in rx_pause_frames; the frame in flight
    finishes, and the next one starts pause_time × 8 columns after the PAUSE was received; a
    second PAUSE with pause_time 0 ends a long pause at once; a PAUSE with a bad FCS or for
    another station is not honoured. Every data frame reaches the wire whole."""
    dut = Injector()
    rng = random.Random(3)
    frames = [wr_frame(rng, 60, seq=k) for k in range(90)]  # 256 bytes + header: 34 beats each
    starts: list[int] = []
    events: dict[str, int] = {}
    got = []

    async def tb_send(ctx):
        for f in frames:
            await stream_send(ctx, dut.a.tx, f, 64)

    async def tb_watch(ctx):  # cycle of every frame's first beat taken into the MAC
        cycle, first = 0, True
        async for _clk, _rst, valid, last in ctx.tick().sample(dut.a.tx_tap_valid, dut.a.tx_tap.last):
            cycle += 1
            if "stats" in events:
                return
            if valid and first:
                starts.append(cycle)
            if valid:
                first = bool(last)
            n = ctx.get(dut.a.stats.rx_pause_frames)
            if n and f"pause{n}" not in events:
                events[f"pause{n}"] = cycle

    async def tb_mon(ctx):
        for _ in frames:
            got.append(await stream_recv(ctx, dut.mon.o, 64, max_cycles=20000))
        events["end"] = stats(ctx, dut.a)

    async def tb_inject(ctx):
        # 297, not 300 as before: the PAUSE now takes 3 cycles more from inj to a (MacTx's output
        # stage, the encoder's first stage, the decoder's first stage), and must still arrive
        # just before a frame of a's stream starts, so that one is in flight (checked below).
        await ctx.tick().repeat(297)
        await stream_send(ctx, dut.inj.i, scapy_pause(B_MAC, 40), 64)            # 320 columns
        await ctx.tick().repeat(1200)
        await stream_send(ctx, dut.inj.i, scapy_pause(B_MAC, 3000, dst=A_MAC), 64)  # to our own address
        await ctx.tick().repeat(400)
        await stream_send(ctx, dut.inj.i, scapy_pause(B_MAC, 0), 64)             # XON: release now
        await ctx.tick().repeat(600)
        bad = scapy_pause(B_MAC, 3000)                                            # stomped FCS: ignored
        await stream_send_bad(ctx, dut.inj.i, bad)
        await ctx.tick().repeat(300)
        await stream_send(ctx, dut.inj.i, scapy_pause(B_MAC, 3000, dst=0x02000000BEEF), 64)  # not for us
        await ctx.tick().repeat(300)
        events["stats"] = stats(ctx, dut.a)

    run(dut, [tb_send, tb_watch, tb_mon, tb_inject])
    assert got == [eth_header(B_MAC, A_MAC) + f for f in frames]  # every frame, whole, in order

    def next_start(t):
        return min(s for s in starts if s > t)

    # Pause 1: 40 quanta. Frames start every ~37 columns before and after. The frame already
    # handed to the MAC when the PAUSE arrived (its first beat taken within 3 cycles) finishes;
    # the next one starts 40 × 8 columns after the receipt (+ 3 cycles: start decision, /S/
    # column, first beat taken).
    t1 = events["pause1"]
    in_flight = next_start(t1)
    assert in_flight - t1 <= 3
    assert 40 * COLS <= next_start(in_flight) - t1 <= 40 * COLS + 4, (t1, next_start(in_flight))
    # Pause 2 (to our own unicast address, 3000 quanta) is cut short by pause 3 (pause_time 0).
    t2, t3 = events["pause2"], events["pause3"]
    assert next_start(t2) > t3 and next_start(t3) - t3 <= 3
    st = events["stats"]
    assert st["rx_pause_frames"] == 3  # the stomped and the misaddressed ones are not honoured
    assert st["rx_stomped"] == 1 and st["rx_ethertype_drops"] == 1  # the one for another station
    assert st["rx_frames"] == 0 and st["rx_overflow"] == 0 and st["tx_pause_frames"] == 0
    assert events["end"]["tx_frames"] == len(frames)
    # After the ignored ones the stream ran on without a gap above a frame's length.
    late = [s for s in starts if s > t3]
    assert max(b - a for a, b in zip(late, late[1:])) < 40


async def stream_send_bad(ctx, port, frame: bytes):
    """Send ``frame`` with ``bad`` on its last beat: the MAC stomps (inverts) its FCS."""
    p = port.payload
    beats = [frame[i:i + 8] for i in range(0, len(frame), 8)]
    for k, b in enumerate(beats):
        ctx.set(p.data, int.from_bytes(b.ljust(8, b"\0"), "little"))
        ctx.set(p.keep, (1 << len(b)) - 1)
        ctx.set(p.last, k == len(beats) - 1)
        ctx.set(p.bad, k == len(beats) - 1)
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
    ctx.set(port.valid, 0)
    ctx.set(p.bad, 0)


class Pair(wiring.Component):
    """Two single-clock ports back to back, ``delay`` cycles of wire each way."""

    def __init__(self, flow_control: bool, delay: int = 4, quanta: int = 64):
        self.delay = delay
        kw = dict(flow_control=flow_control, cable_cycles=delay, pause_quanta=quanta, cut_through=True)
        self.a = EthPort10G(MTU, local_mac=A_MAC, peer_mac=B_MAC, **kw)
        self.b = EthPort10G(MTU, local_mac=B_MAC, peer_mac=A_MAC, **kw)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a, m.submodules.b = a, b = self.a, self.b
        ab, ba = a.line_tx.as_value(), b.line_tx.as_value()
        for _ in range(self.delay):
            ab_r, ba_r = Signal(66), Signal(66)
            m.d.sync += [ab_r.eq(ab), ba_r.eq(ba)]
            ab, ba = ab_r, ba_r
        m.d.comb += [b.line_rx.eq(ab), a.line_rx.eq(ba)]
        return m


def stalled_receiver(flow_control: bool, stall: int = 5000):
    """Port a sends 2 × the FIFO's depth of frames at line rate; b's node takes nothing for
    ``stall`` cycles, then everything. Returns (frames sent, frames received, b's stats, a's
    stats, b's XOFF/XON history as (cycle, xoff) changes)."""
    dut = Pair(flow_control)
    rng = random.Random(7)
    depth = dut.b.rx_depth
    frames = []
    while sum(-(-(len(f) + 14) // 8) for f in frames) < 2 * depth:
        frames.append(wr_frame(rng, 100, seq=len(frames)))  # 416 + 14 bytes: 54 beats
    got, out = [], {}

    async def tb_send(ctx):
        for f in frames:
            await stream_send(ctx, dut.a.tx, f, 64)

    async def tb_recv(ctx):
        await ctx.tick().repeat(stall)
        for _ in frames:
            try:
                got.append(await stream_recv(ctx, dut.b.rx, 64, max_cycles=3000))
            except TimeoutError:
                break
        await ctx.tick().repeat(200)
        out["b"], out["a"] = stats(ctx, dut.b), stats(ctx, dut.a)

    run(dut, [tb_send, tb_recv])
    return frames, got, out["b"], out["a"]


def test_xoff_refresh_xon_nothing_lost():
    """b's node stalls for 5000 cycles while a sends at line rate 2 × b's FIFO: b sends XOFF at the
    high-water mark, refreshes it every half pause (quanta 64 = 512 columns: XOFF about every 256
    columns while stalled), XON once drained; a honours each (a's rx_pause_frames = b's
    tx_pause_frames), and every frame arrives, in order, bit for bit, no overflow."""
    frames, got, b, a = stalled_receiver(flow_control=True)
    assert got == frames
    assert b["rx_overflow"] == 0 and b["rx_frames"] == len(frames)
    assert a["rx_pause_frames"] == b["tx_pause_frames"]
    # While stalled: an XOFF at about cycle depth-high, then one per 256 columns; then one XON.
    assert 5000 // 256 - 6 <= b["tx_pause_frames"] <= 5000 // 256 + 3, b
    assert b["tx_frames"] == b["tx_pause_frames"]  # b sends nothing else
    assert a["tx_pause_frames"] == 0 and a["rx_frames"] == 0
    assert all(b[k] == 0 for k in ("rx_fcs_errors", "rx_code_errors", "rx_ethertype_drops", "rx_stomped"))


def test_without_flow_control_the_same_stall_loses_frames():
    """The control experiment: the same traffic without PAUSE overflows b's FIFO."""
    frames, got, b, a = stalled_receiver(flow_control=False, stall=3000)
    assert b["rx_overflow"] > 0
    assert len(got) < len(frames)
    assert b["tx_pause_frames"] == 0 and a["rx_pause_frames"] == 0


class CdcLoop(wiring.Component):
    """A board port (EthPort10GCdc) looped back onto itself, gt_rx clocked by gt_tx: its own XOFF
    pauses its own transmitter, through both crossings of the flow-control signals."""

    def __init__(self):
        self.port = EthPort10GCdc(MTU, flow_control=True, cable_cycles=4, pause_quanta=64)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.domains.gt_rx = ClockDomain()
        m.d.comb += [ClockSignal("gt_rx").eq(ClockSignal("gt_tx")), ResetSignal("gt_rx").eq(ResetSignal("gt_tx"))]
        m.submodules.port = port = self.port
        m.d.comb += port.gt_rx_data.eq(port.gt_tx_data)
        return m


def test_cdc_port_pauses_without_loss():
    """EthPort10GCdc (GT domains at 322.27 MHz, core at 156.25 MHz), looped back, its node not
    reading: the port pauses itself (its XOFF comes back to its own receiver, addressed to the
    reserved multicast address), nothing overflows; once read, every frame arrives intact."""
    dut = CdcLoop()
    rng = random.Random(11)
    frames = [wr_frame(rng, 100, seq=k) for k in range(40)]  # 2 × the FIFO's 1100-odd beats
    got, out = [], {}

    async def tb_send(ctx):
        for f in frames:
            await stream_send(ctx, dut.port.tx, f, 64)

    async def tb_recv(ctx):
        await ctx.tick().repeat(4000)
        out["mid"] = stats(ctx, dut.port)
        for _ in frames:
            got.append(await stream_recv(ctx, dut.port.rx, 64, max_cycles=4000))
        await ctx.tick().repeat(100)
        out["end"] = stats(ctx, dut.port)

    run(dut, [tb_send, tb_recv], clocks=(("sync", 6.4e-9), ("gt_tx", 1e-6 / 322.265625)))
    assert got == frames
    assert out["mid"]["tx_pause_frames"] >= 1 and out["mid"]["rx_pause_frames"] >= 1
    assert out["end"]["rx_overflow"] == 0
    assert out["end"]["rx_pause_frames"] == out["end"]["tx_pause_frames"]
