"""GTHE2 wrapper: reset sequencer in amaranth.sim; the Instances checked in the generated Verilog.

The expected numbers are computed here from UG476's equations and the 10GBASE-R line rate, not read
back from ``wirereduce.hdl.xilinx.gth``.
"""

from __future__ import annotations

import re

import pytest
from amaranth import ClockDomain, Elaboratable, Module
from amaranth.back import verilog
from amaranth.hdl import IOPort
from amaranth.lib.io import DifferentialPort
from amaranth.sim import Simulator
from wirereduce.hdl.xilinx.gth import GthQuad10G, GthResetSequencer, qpll_line_rate

CLK_HZ = 1_000_000          # 1 µs a cycle keeps the time-outs short in cycles
RESET_CYCLES = 3            # qpll_reset_ns = 3000
LOCK_CYCLES = 20            # lock_timeout_s = 20 µs
DONE_CYCLES = 30            # done_timeout_s = 30 µs
SYNC_DELAY = 2              # two-flop input synchronisers


def make_seq(lanes=1):
    return GthResetSequencer(CLK_HZ, lanes, qpll_reset_ns=3000, lock_timeout_s=20e-6, done_timeout_s=30e-6)


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


async def sample(ctx, dut, cycles):
    """Values of the outputs over ``cycles`` cycles (one dict a cycle, sampled before each edge)."""
    out = []
    for _ in range(cycles):
        out.append({k: ctx.get(getattr(dut, k)) for k in
                    ("qpll_reset", "gttxreset", "gtrxreset", "userrdy", "tx_ready", "rx_ready", "restarts")})
        await ctx.tick()
    return out


def test_line_rate_from_ug476_equations():
    # 156.25 MHz * 66 / (1 * 2) * 2 / 1 = 10.3125 Gbit/s; 32-bit words at 322.265625 MHz
    assert qpll_line_rate(156.25e6, 66, 1, 1) == 10.3125e9
    assert 10.3125e9 / 32 == 322.265625e6
    with pytest.raises(ValueError, match="feedback divider"):
        qpll_line_rate(156.25e6, 65, 1, 1)
    with pytest.raises(ValueError, match="OUT_DIV"):
        qpll_line_rate(156.25e6, 66, 1, 3)


def test_sequencer_rejects_bad_parameters():
    with pytest.raises(ValueError, match="at least 1 MHz"):
        GthResetSequencer(1000)
    with pytest.raises(ValueError, match="lanes must be 1 to 4"):
        GthResetSequencer(CLK_HZ, 5)
    with pytest.raises(ValueError, match="lock_timeout_s must be positive"):
        GthResetSequencer(CLK_HZ, lock_timeout_s=0)


def test_holds_everything_until_refclk_ready():
    dut = make_seq()

    async def bench(ctx):
        ctx.set(dut.qpll_lock, 1)           # even a (bogus) lock must not release anything
        ctx.set(dut.tx_resetdone, 1)
        ctx.set(dut.rx_resetdone, 1)
        for s in await sample(ctx, dut, 200):
            assert s["qpll_reset"] == s["gttxreset"] == s["gtrxreset"] == 1
            assert s["userrdy"] == s["tx_ready"] == s["rx_ready"] == 0

    run(dut, bench)


def test_bring_up_order_and_timing():
    dut = make_seq(lanes=2)

    async def bench(ctx):
        ctx.set(dut.refclk_ready, 1)
        trace = await sample(ctx, dut, 10)
        qpll_high = [s["qpll_reset"] for s in trace]
        # refclk_ready seen after the synchroniser, then QPLLRESET stays high RESET_CYCLES more cycles
        first_low = qpll_high.index(0)
        assert first_low == SYNC_DELAY + 1 + RESET_CYCLES
        assert all(qpll_high[:first_low]) and not any(qpll_high[first_low:])
        # no lock yet: GT resets held, nothing ready
        assert all(s["gttxreset"] and s["gtrxreset"] and not s["userrdy"] for s in trace)
        ctx.set(dut.qpll_lock, 1)
        trace = await sample(ctx, dut, 8)
        released = [s["gttxreset"] for s in trace].index(0)
        assert released == SYNC_DELAY + 1
        assert all(s["userrdy"] and not s["gtrxreset"] for s in trace[released:])
        assert not any(s["tx_ready"] for s in trace)
        ctx.set(dut.tx_resetdone, 0b11)
        ctx.set(dut.rx_resetdone, 0b01)      # lane 1 not done: not ready
        assert not any(s["tx_ready"] for s in await sample(ctx, dut, 8))
        ctx.set(dut.rx_resetdone, 0b11)
        trace = await sample(ctx, dut, 8)
        assert trace[-1]["tx_ready"] == trace[-1]["rx_ready"] == 1
        assert trace[-1]["restarts"] == 0

    run(dut, bench)


def test_lock_timeout_restarts_qpll():
    dut = make_seq()

    async def bench(ctx):
        ctx.set(dut.refclk_ready, 1)
        trace = await sample(ctx, dut, 3 * (LOCK_CYCLES + RESET_CYCLES) + 20)
        rises = [k for k in range(1, len(trace)) if trace[k]["qpll_reset"] and not trace[k - 1]["qpll_reset"]]
        assert len(rises) >= 2, "QPLLRESET must be pulsed again after a lock time-out"
        # one time-out period between the pulses: RESET_CYCLES high + LOCK_CYCLES waiting
        assert rises[1] - rises[0] == RESET_CYCLES + LOCK_CYCLES
        assert trace[-1]["restarts"] == len(rises)
        assert not any(s["tx_ready"] or not s["gttxreset"] for s in trace)

    run(dut, bench)


def test_resetdone_timeout_restarts():
    dut = make_seq()

    async def bench(ctx):
        ctx.set(dut.refclk_ready, 1)
        ctx.set(dut.qpll_lock, 1)
        ctx.set(dut.tx_resetdone, 1)         # RX never finishes
        trace = await sample(ctx, dut, 2 * (RESET_CYCLES + DONE_CYCLES) + 20)
        assert trace[-1]["restarts"] >= 1
        assert not any(s["rx_ready"] for s in trace)
        # after the time-out the QPLL is reset again and the GT resets asserted again
        k = next(i for i, s in enumerate(trace) if s["restarts"] == 1)
        assert trace[k]["qpll_reset"] == 1 and trace[k]["gttxreset"] == 1

    run(dut, bench)


def test_lock_loss_restarts_and_recovers():
    dut = make_seq()

    async def bench(ctx):
        for sig in (dut.refclk_ready, dut.qpll_lock, dut.tx_resetdone, dut.rx_resetdone):
            ctx.set(sig, 1)
        trace = await sample(ctx, dut, 20)
        assert trace[-1]["tx_ready"] == 1
        ctx.set(dut.qpll_lock, 0)
        trace = await sample(ctx, dut, 6)
        assert trace[-1]["tx_ready"] == 0 and trace[-1]["qpll_reset"] == 1 and trace[-1]["gttxreset"] == 1
        assert trace[-1]["restarts"] == 1
        ctx.set(dut.qpll_lock, 1)
        trace = await sample(ctx, dut, 20)
        assert trace[-1]["tx_ready"] == 1 and trace[-1]["restarts"] == 1

    run(dut, bench)


def test_refclk_loss_goes_back_to_waiting():
    dut = make_seq()

    async def bench(ctx):
        for sig in (dut.refclk_ready, dut.qpll_lock, dut.tx_resetdone, dut.rx_resetdone):
            ctx.set(sig, 1)
        assert (await sample(ctx, dut, 20))[-1]["rx_ready"] == 1
        ctx.set(dut.refclk_ready, 0)
        trace = await sample(ctx, dut, 50)
        assert trace[-1]["rx_ready"] == 0 and trace[-1]["qpll_reset"] == 1
        assert trace[-1]["restarts"] == 0    # waiting for the clock is not a failure

    run(dut, bench)


class _QuadTop(Elaboratable):
    def __init__(self):
        def diff(name):
            return DifferentialPort(IOPort(1, name=f"{name}_p"), IOPort(1, name=f"{name}_n"))
        self.refclk = diff("refclk")
        lanes = {}
        for n in range(2):
            tx, rx = diff(f"tx{n}"), diff(f"rx{n}")
            lanes[n] = (tx.p, tx.n, rx.p, rx.n) + (("off",) if n == 1 else ())
        self.quad = GthQuad10G(100_000_000, self.refclk, lanes=lanes, domains=False)

    def elaborate(self, platform):
        m = Module()
        m.domains += [ClockDomain(f"gt{n}_{d}") for n in range(2) for d in ("tx", "rx")]
        m.submodules.quad = self.quad
        ch = self.quad.channels[0]
        m.d.gt0_tx += ch.tx_data.eq(ch.tx_data + 1)
        return m


@pytest.fixture(scope="module")
def quad_verilog():
    top = _QuadTop()
    return verilog.convert(top, name="quad", ports=[top.quad.refclk_ready])


def _instance(text, cell):
    """Parameter block and port block of the first instance of ``cell`` in Verilog ``text``."""
    m = re.search(rf"\b{cell} #\((.*?)\n  \) \S+ \((.*?)\n  \);", text, re.S)
    assert m, f"no {cell} instance in the Verilog"
    return m.group(1), m.group(2)


def test_common_instance_attributes(quad_verilog):
    params, ports = _instance(quad_verilog, "GTHE2_COMMON")
    n, m = 66, 1  # 156.25 MHz * 66 / 1 = 10.3125 GHz VCO
    assert ".QPLL_FBDIV(10'h140)" in params          # UG476 encoding of N = 66: 10'b0101000000
    assert ".QPLL_FBDIV_RATIO(1'h0)" in params       # N = 66 is the one divider with ratio 0
    assert f".QPLL_REFCLK_DIV(32'd{m})" in params    # integer attributes come out as 32-bit decimals
    assert 156.25e6 * n / m == 10.3125e9
    assert ".QPLLREFCLKSEL(3'h1)" in ports            # GTREFCLK0
    for port in ("GTREFCLK0", "QPLLRESET", "QPLLLOCK", "QPLLOUTCLK", "QPLLOUTREFCLK", "QPLLLOCKDETCLK"):
        assert f".{port}(" in ports
    assert "IBUFDS_GTE2" in quad_verilog


def test_channel_instance_attributes(quad_verilog):
    params, ports = _instance(quad_verilog, "GTHE2_CHANNEL")
    for attr in (".TX_DATA_WIDTH(32'd32)", ".RX_DATA_WIDTH(32'd32)", ".TX_INT_DATAWIDTH(32'd1)",
                 ".RX_INT_DATAWIDTH(32'd1)", ".RXOUT_DIV(32'd1)", ".TXOUT_DIV(32'd1)", '.TXGEARBOX_EN("FALSE")',
                 '.RXGEARBOX_EN("FALSE")', '.TXBUF_EN("TRUE")', '.RXBUF_EN("TRUE")', '.CLK_CORRECT_USE("FALSE")',
                 ".RX_CLK25_DIV(32'd7)", ".TX_CLK25_DIV(32'd7)"):
        assert attr in params, attr
    # CLK25_DIV: 156.25 MHz / 7 = 22.3 MHz ≤ 25 MHz, and 6 would exceed it
    assert 156.25e6 / 7 <= 25e6 < 156.25e6 / 6
    assert re.search(r"\.RXCDR_CFG\(83'h[0-9a-f]+\)", params)
    assert ".TXSYSCLKSEL(2'h3)" in ports and ".RXSYSCLKSEL(2'h3)" in ports     # both on the QPLL
    assert ".TXOUTCLKSEL(3'h2)" in ports and ".RXOUTCLKSEL(3'h2)" in ports     # PMA clocks, 322 MHz
    assert ".TX8B10BEN(1'h0)" in ports
    assert re.search(r"\.TXDATA\(", ports) and re.search(r"\.RXDATA\(", ports)
    for pin in ("GTHTXP(tx0_p)", "GTHTXN(tx0_n)", "GTHRXP(rx0_p)", "GTHRXN(rx0_n)"):
        assert "." + pin in ports
    assert ".TXPD(2'h0)" in ports


def test_powered_down_channel_and_bufgs(quad_verilog):
    channels = re.findall(r"GTHE2_CHANNEL #\(.*?\n  \);", quad_verilog, re.S)
    assert len(channels) == 2
    assert ".TXPD(2'h3)" in channels[1] and ".RXPD(2'h3)" in channels[1]
    assert len(re.findall(r"\bBUFG\b", quad_verilog)) == 4    # TX and RX user clock per channel
