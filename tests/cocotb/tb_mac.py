"""cocotb testbenches of the 10G MAC's Verilog, with cocotbext-eth on the XGMII side.

:class:`MacTop` puts a :class:`~wirereduce.hdl.eth.mac.MacTx` and a :class:`~wirereduce.hdl.eth.mac.MacRx`
(followed by an :class:`~wirereduce.hdl.eth.mac.RxDropBad`) side by side with flat ports named for
the bus models: ``tx_axis_*`` is driven by cocotbext-axi's ``AxiStreamSource`` and
``xgmii_txd``/``xgmii_txc`` read by cocotbext-eth's ``XgmiiSink``; ``xgmii_rxd``/``xgmii_rxc`` are
driven by ``XgmiiSource``, ``rx_axis_*`` watched by an ``AxiStreamMonitor`` and ``good_axis_*``
(the frames that pass the drop-bad filter) read by an ``AxiStreamSink``. Frames are built with
scapy. :func:`build` makes the Verilator model once; :func:`run_case` runs one testbench.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import cocotb
from amaranth import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, with_timeout
from wirereduce.hdl.eth.mac import JUMBO_FRAME_BYTES, MacRx, MacTx, RxDropBad

__all__ = ["MacTop", "mac_top_verilog", "build", "run_case"]

TOP = "mac_top"
PERIOD_PS = 6400          # 156.25 MHz
BYTE_PS = PERIOD_PS // 8  # one byte of line time at 10 Gbit/s
RX_COUNTERS = ("frames_ok", "bytes_ok", "fcs_errors", "runts", "oversize", "errors")


class MacTop(wiring.Component):
    """MacTx, and MacRx → RxDropBad, with flat ports for the cocotb bus models.

    ``tx_axis_tuser`` bit 0 is :attr:`MacTx.abort`, bit 1 :attr:`MacTx.stomp`; ``rx_axis_tuser`` is
    ``bad`` followed by the ``error`` flags (fcs, runt, oversize, code) of the received beat.
    """

    def __init__(self, max_frame: int = JUMBO_FRAME_BYTES):
        self.max_frame = max_frame
        members = {
            "tx_axis_tdata": In(64), "tx_axis_tkeep": In(8), "tx_axis_tlast": In(1), "tx_axis_tvalid": In(1),
            "tx_axis_tready": Out(1), "tx_axis_tuser": In(2),
            "xgmii_txd": Out(64), "xgmii_txc": Out(8),
            "xgmii_rxd": In(64), "xgmii_rxc": In(8),
            "rx_axis_tdata": Out(64), "rx_axis_tkeep": Out(8), "rx_axis_tlast": Out(1), "rx_axis_tvalid": Out(1),
            "rx_axis_tuser": Out(5),
            "good_axis_tdata": Out(64), "good_axis_tkeep": Out(8), "good_axis_tlast": Out(1),
            "good_axis_tvalid": Out(1), "good_axis_tready": In(1),
            "drop_dropped": Out(32), "drop_overflow": Out(32),
            "tx_frames": Out(32), "tx_stomped": Out(32), "tx_aborted": Out(32),
        }
        members.update({f"rx_{name}": Out(32) for name in RX_COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = tx = MacTx()
        m.submodules.rx = rx = MacRx(self.max_frame)
        m.submodules.drop = drop = RxDropBad(self.max_frame)
        wiring.connect(m, rx.o, drop.i)
        m.d.comb += [
            tx.i.payload.data.eq(self.tx_axis_tdata), tx.i.payload.keep.eq(self.tx_axis_tkeep),
            tx.i.payload.last.eq(self.tx_axis_tlast), tx.i.valid.eq(self.tx_axis_tvalid),
            self.tx_axis_tready.eq(tx.i.ready),
            tx.abort.eq(self.tx_axis_tuser[0]), tx.stomp.eq(self.tx_axis_tuser[1]),
            self.xgmii_txd.eq(tx.xgmii.data), self.xgmii_txc.eq(tx.xgmii.ctrl),
            self.tx_frames.eq(tx.stats.frames), self.tx_stomped.eq(tx.stats.stomped),
            self.tx_aborted.eq(tx.stats.aborted),
            rx.xgmii.data.eq(self.xgmii_rxd), rx.xgmii.ctrl.eq(self.xgmii_rxc),
            self.rx_axis_tdata.eq(rx.o.payload.data), self.rx_axis_tkeep.eq(rx.o.payload.keep),
            self.rx_axis_tlast.eq(rx.o.payload.last), self.rx_axis_tvalid.eq(rx.o.valid),
            self.rx_axis_tuser.eq(Cat(rx.o.payload.bad, rx.o.payload.error)),
            self.good_axis_tdata.eq(drop.o.payload.data), self.good_axis_tkeep.eq(drop.o.payload.keep),
            self.good_axis_tlast.eq(drop.o.payload.last), self.good_axis_tvalid.eq(drop.o.valid),
            drop.o.ready.eq(self.good_axis_tready),
            self.drop_dropped.eq(drop.dropped), self.drop_overflow.eq(drop.overflow),
        ]
        m.d.comb += [getattr(self, f"rx_{name}").eq(rx.stats[name]) for name in RX_COUNTERS]
        return m


def mac_top_verilog(max_frame: int = JUMBO_FRAME_BYTES) -> str:
    """Verilog text of :class:`MacTop` with top module ``mac_top``."""
    from amaranth.back import verilog

    return verilog.convert(MacTop(max_frame), name=TOP, emit_src=False)


def build(build_dir: str | Path, max_frame: int = JUMBO_FRAME_BYTES, waves: bool = False):
    """Build the Verilator model of :class:`MacTop` in ``build_dir``; returns what :func:`run_case` needs."""
    from wirereduce.sim.engines.runner import build_block_model

    runner, build_dir = build_block_model(mac_top_verilog(max_frame), TOP, build_dir, waves)
    return runner, build_dir, waves


def run_case(sim, case: str) -> tuple[int, Path]:
    """Run the cocotb test ``case`` of this module on a model from :func:`build`.

    Returns the number of failed tests (1 if the simulator did not report) and the log file.
    """
    from wirereduce.sim.engines.runner import run_block_case

    runner, build_dir, waves = sim
    return run_block_case(runner, build_dir, TOP, "tb_mac", case, waves=waves)


# --- frames -------------------------------------------------------------------------------------

def eth(payload_bytes: int, seed: int = 0) -> bytes:
    """An Ethernet II frame (EtherType 0x88B5, no FCS) of ``14 + payload_bytes`` bytes."""
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    rnd = random.Random(seed)
    body = bytes(rnd.randrange(256) for _ in range(payload_bytes))
    return bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02", type=0x88B5) / Raw(body))


def udp(payload_bytes: int) -> bytes:
    """Ether()/IP()/UDP()/Raw: 42 bytes of headers plus the payload."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    return bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02") / IP(src="10.0.0.2", dst="10.0.0.1")
                 / UDP(sport=4791, dport=4791) / Raw(bytes(k & 0xFF for k in range(payload_bytes))))


def fcs(frame: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(frame))


def padded(frame: bytes) -> bytes:
    return frame.ljust(60, b"\0")


# --- testbench plumbing ---------------------------------------------------------------------------

async def start(dut):
    """Clock, reset, and quiet inputs."""
    dut.rst.value = 1
    dut.tx_axis_tvalid.value = 0
    dut.tx_axis_tuser.value = 0
    dut.good_axis_tready.value = 0
    dut.xgmii_rxd.value = 0x0707070707070707
    dut.xgmii_rxc.value = 0xFF
    cocotb.start_soon(Clock(dut.clk, PERIOD_PS, unit="ps").start())
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)


def counters(dut, prefix: str, names) -> dict[str, int]:
    return {n: int(getattr(dut, f"{prefix}{n}").value) for n in names}


def gap_bytes(prev, nxt) -> int:
    """Bytes from the /T/ of ``prev`` to the /S/ of ``nxt`` (XgmiiFrame times, in ps)."""
    return (nxt.sim_time_start - prev.sim_time_end) // BYTE_PS


def tx_models(dut):
    from cocotbext.axi import AxiStreamBus, AxiStreamSource
    from cocotbext.eth import XgmiiSink

    source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "tx_axis"), dut.clk, dut.rst)
    sink = XgmiiSink(dut.xgmii_txd, dut.xgmii_txc, dut.clk, dut.rst)
    return source, sink


def rx_models(dut):
    from cocotbext.axi import AxiStreamBus, AxiStreamMonitor, AxiStreamSink
    from cocotbext.eth import XgmiiSource

    source = XgmiiSource(dut.xgmii_rxd, dut.xgmii_rxc, dut.clk, dut.rst)
    monitor = AxiStreamMonitor(AxiStreamBus.from_prefix(dut, "rx_axis"), dut.clk, dut.rst)
    good = AxiStreamSink(AxiStreamBus.from_prefix(dut, "good_axis"), dut.clk, dut.rst)
    return source, monitor, good


def last_status(frame) -> int:
    """``rx_axis_tuser`` of a monitored frame's last byte: bit 0 bad, then fcs, runt, oversize, code."""
    return frame.tuser[-1] if isinstance(frame.tuser, list) else int(frame.tuser or 0)


STATUS = {"good": 0b00000, "fcs": 0b00011, "runt": 0b00101, "oversize": 0b01001, "code": 0b10001}


# --- testbenches --------------------------------------------------------------------------------

@cocotb.test()
async def tx_frames(dut):
    """MacTx → XgmiiSink: minimum (padded UDP), maximum, jumbo and odd-length frames back to back:
    preamble and SFD, padding, FCS correct, gap ≥ 9 bytes and 12 on average (DIC)."""
    from cocotbext.axi import AxiStreamFrame

    await start(dut)
    source, sink = tx_models(dut)
    rnd = random.Random(1)
    frames = [udp(4), udp(18), eth(1500, 1), eth(9000, 2), eth(46, 3), eth(47, 4)]
    frames += [eth(rnd.randrange(0, 300), 10 + k) for k in range(24)]
    for f in frames:
        source.send_nowait(AxiStreamFrame(f))
    got = []
    for _ in frames:
        got.append(await with_timeout(sink.recv(), 200, "us"))
    for f, g in zip(frames, got):
        assert g.get_preamble() == bytes([0x55] * 7 + [0xD5]), g.get_preamble().hex()
        assert g.ctrl is None, "a control character inside the frame"
        assert g.start_lane in (0, 4)
        assert g.check_fcs(), f"bad FCS on a {len(f)}-byte frame"
        assert bytes(g.get_payload()) == padded(f), (len(g.get_payload()), len(f))
    gaps = [gap_bytes(a, b) for a, b in zip(got, got[1:])]
    assert min(gaps) >= 9, gaps
    assert abs(sum(gaps) - 12 * len(gaps)) <= 3, (sum(gaps), len(gaps))
    assert {g.start_lane for g in got} == {0, 4}
    assert counters(dut, "tx_", ("frames", "stomped", "aborted")) == {"frames": len(frames), "stomped": 0,
                                                                         "aborted": 0}


@cocotb.test()
async def tx_stomp_abort(dut):
    """A stomped frame leaves with FCS XOR 0xFFFFFFFF; an aborted one ends with /E/ after the bytes
    sent so far; the frames around them are intact."""
    from cocotbext.axi import AxiStreamFrame

    await start(dut)
    source, sink = tx_models(dut)
    before, stomped, aborted, after = eth(100, 1), eth(200, 2), eth(300, 3), udp(30)
    source.send_nowait(AxiStreamFrame(before))
    source.send_nowait(AxiStreamFrame(stomped, tuser=2))
    source.send_nowait(AxiStreamFrame(aborted, tuser=[0] * 40 + [1] * (len(aborted) - 40)))
    source.send_nowait(AxiStreamFrame(after))
    got = [await with_timeout(sink.recv(), 100, "us") for _ in range(4)]
    assert got[0].check_fcs() and bytes(got[0].get_payload()) == before
    assert not got[1].check_fcs()
    assert bytes(got[1].get_payload()) == stomped
    assert bytes(got[1].get_fcs()) == bytes(b ^ 0xFF for b in fcs(stomped))
    assert got[2].ctrl is not None and got[2].ctrl[-1] == 1 and got[2].data[-1] == 0xFE, got[2]
    assert bytes(got[2].data[8:-1]) == aborted[:40]
    assert got[3].check_fcs() and bytes(got[3].get_payload()) == padded(after)
    assert counters(dut, "tx_", ("frames", "stomped", "aborted")) == {"frames": 3, "stomped": 1, "aborted": 1}


async def recv_all(queue, n, what):
    out = []
    for _ in range(n):
        out.append(await with_timeout(queue.recv(), 200, "us"))
    assert queue.empty(), f"more {what} frames than expected"
    return out


@cocotb.test()
async def rx_frames(dut):
    """XgmiiSource → MacRx: minimum, maximum and jumbo frames, then bursts at the nominal gap (DIC, /S/
    in lanes 0 and 4) and at the 5-byte minimum gap: every frame out intact and good, counters,
    and the same frames through the drop-bad filter."""
    from cocotbext.eth import XgmiiFrame

    await start(dut)
    source, monitor, good = rx_models(dut)
    rnd = random.Random(2)
    frames = [udp(18), eth(1500, 1), eth(9000, 2)]
    burst1 = [eth(rnd.randrange(46, 200), 10 + k) for k in range(20)]
    burst2 = [eth(rnd.randrange(46, 200), 40 + k) for k in range(20)]
    for f in frames + burst1:
        source.send_nowait(XgmiiFrame.from_payload(f))
    await source.wait()
    source.ifg = 5
    source.enable_dic = False
    for f in burst2:
        source.send_nowait(XgmiiFrame.from_payload(f))
    await source.wait()
    sent = frames + burst1 + burst2
    got = await recv_all(monitor, len(sent), "received")
    for f, g in zip(sent, got):
        assert bytes(g.tdata) == f, (len(g.tdata), len(f))
        assert last_status(g) == 0
    passed = await recv_all(good, len(sent), "filtered")
    assert [bytes(g.tdata) for g in passed] == sent
    await ClockCycles(dut.clk, 4)
    assert counters(dut, "rx_", RX_COUNTERS) == {"frames_ok": len(sent), "bytes_ok": sum(map(len, sent)),
                                                 "fcs_errors": 0, "runts": 0, "oversize": 0, "errors": 0}
    assert counters(dut, "drop_", ("dropped", "overflow")) == {"dropped": 0, "overflow": 0}


@cocotb.test()
async def rx_errors(dut):
    """FCS error, runt, oversize (over the 9018-byte jumbo limit), a frame cut short by /E/ and one
    with an idle in the middle, between good frames: marked on the last beat, counted, and only
    the good frames pass the drop-bad filter."""
    from cocotbext.eth import XgmiiFrame

    await start(dut)
    source, monitor, good = rx_models(dut)
    g1, g2, g3, g4, g5 = eth(60, 1), udp(100), eth(9000, 3), eth(46, 4), eth(500, 5)
    bad_fcs, runt, big, cut_e, cut_i = eth(200, 6), eth(30, 7), eth(9001, 8), eth(300, 9), eth(300, 10)

    def with_ctrl(f: bytes, offset: int, char: int):
        x = XgmiiFrame.from_payload(f)
        x.ctrl = [0] * len(x.data)
        x.data[8 + offset] = char
        x.ctrl[8 + offset] = 1
        return x

    plan = [
        (XgmiiFrame.from_payload(g1), "good", g1),
        (XgmiiFrame.from_raw_payload(bad_fcs + bytes(b ^ 0x5A for b in fcs(bad_fcs))), "fcs", bad_fcs),
        (XgmiiFrame.from_payload(g2), "good", g2),
        (XgmiiFrame.from_payload(runt, min_len=0), "runt", runt),
        (XgmiiFrame.from_payload(g3), "good", g3),
        (XgmiiFrame.from_payload(big), "oversize", big),
        (XgmiiFrame.from_payload(g4), "good", g4),
        (with_ctrl(cut_e, 150, 0xFE), "code", cut_e),
        (with_ctrl(cut_i, 77, 0x07), "code", cut_i),
        (XgmiiFrame.from_payload(g5), "good", g5),
    ]
    for x, _, _ in plan:
        source.send_nowait(x)
    await source.wait()
    got = await recv_all(monitor, len(plan), "received")
    for (_, kind, f), g in zip(plan, got):
        data = bytes(g.tdata)
        assert last_status(g) == STATUS[kind], (kind, last_status(g))
        if kind in ("good", "fcs", "runt"):
            assert data == (padded(f) if kind == "good" else f)
        else:
            assert f.startswith(data) and len(data) < len(f) + 4, (kind, len(data))
            if kind == "oversize":
                assert len(data) <= JUMBO_FRAME_BYTES
    goods = [padded(f) for _, k, f in plan if k == "good"]
    passed = await recv_all(good, len(goods), "filtered")
    assert [bytes(g.tdata) for g in passed] == goods
    await ClockCycles(dut.clk, 4)
    assert counters(dut, "rx_", RX_COUNTERS) == {"frames_ok": 5, "bytes_ok": sum(map(len, goods)), "fcs_errors": 1,
                                                 "runts": 1, "oversize": 1, "errors": 2}
    assert counters(dut, "drop_", ("dropped", "overflow")) == {"dropped": 5, "overflow": 0}
