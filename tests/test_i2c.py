# amaranth: UnusedElaboratable=no
"""I2C master and Si5324 start-up (boards/si5324.py): amaranth.sim block tests, and a cocotb test with cocotbext-i2c.

The block tests put a behavioural bus in the testbench: the open-drain lines are the wired AND of
the DUT's ``*_oe`` and of target models that decode START / bytes / ACK / STOP from the lines
alone, acknowledge their addresses, can refuse a byte and can hold SCL low (clock stretching).
The expected writes are written here from the VC709 facts (switch 0x74 ← channel 7, switch 0x75
← 0, Si5324 0x68 ← every (register, value) of the table) and the I2C protocol; the line timing is
checked against UM10204 standard-mode minimums in microseconds, and the register table is
decoded into the output frequency with the Si5324 divider encoding.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from amaranth.sim import Simulator
from wirereduce.boards.si5324 import SI5324_REGISTERS, I2cMaster, Si5324Init, quarter_cycles

# --- the expected writes, from the board facts -------------------------------------------------

EXPECTED = [(0x74, [0x80]), (0x75, [0x00])] + [(0x68, [reg, val]) for reg, val in SI5324_REGISTERS]

# UM10204 table 10, standard mode, seconds
T_LOW, T_HIGH, T_HD_STA, T_SU_STA, T_SU_STO, T_BUF, T_SU_DAT = 4.7e-6, 4.0e-6, 4.0e-6, 4.7e-6, 4.0e-6, 4.7e-6, 250e-9
SI5324_T_RST_MIN = 1e-6  # Si5324 data sheet: minimum RST low pulse


# --- register table → frequency ----------------------------------------------------------------

def test_register_table_gives_156_25_mhz():
    """Decode the dividers from the table (Si5324 register map) and compute CKOUT1 from the 114.285 MHz crystal."""
    regs = dict(SI5324_REGISTERS)
    assert len(regs) == len(SI5324_REGISTERS), "a register is written twice"
    assert SI5324_REGISTERS[-1] == (136, 0x40), "the sequence must end with ICAL"
    assert regs[0] & 0x40, "FREE_RUN (reg 0 bit 6) must be set: the crystal is the reference"
    n1_hs = (regs[25] >> 5) + 4
    nc1_ls = ((regs[31] & 0xF) << 16 | regs[32] << 8 | regs[33]) + 1
    n2_hs = (regs[40] >> 5) + 4
    n2_ls = ((regs[40] & 0xF) << 16 | regs[41] << 8 | regs[42]) + 1
    n31 = ((regs[43] & 0x7) << 16 | regs[44] << 8 | regs[45]) + 1
    n32 = ((regs[46] & 0x7) << 16 | regs[47] << 8 | regs[48]) + 1
    assert n31 == n32
    assert n2_ls % 2 == 0 and (nc1_ls == 1 or nc1_ls % 2 == 0)  # data sheet: even low-speed dividers
    f_osc = 114.285e6 / n32 * n2_hs * n2_ls
    assert 4.85e9 <= f_osc <= 5.67e9, f"DCO at {f_osc / 1e9:.4f} GHz is outside its range"
    f_out = f_osc / (n1_hs * nc1_ls)
    assert abs(f_out / 156.25e6 - 1) < 1e-6, f"CKOUT1 = {f_out / 1e6:.6f} MHz"
    assert regs[10] & 0x04 == 0, "CKOUT1 must not be disabled (DSBL1_REG)"


# --- behavioural bus -----------------------------------------------------------------------------

class Bus:
    """Wired-AND SCL/SDA with I2C targets decoded from the lines, one call per clock cycle.

    ``acks(addr, index, byte)`` says whether the target acknowledges data byte ``index`` (0 =
    the first after the address byte); ``stretch(n)`` gives the cycles the targets hold SCL low
    after the n-th SCL falling edge. Records the writes (address, data, acked) and timing
    violations (in seconds, at ``clk_hz``).
    """

    def __init__(self, clk_hz, addresses=(0x74, 0x75, 0x68), acks=None, stretch=None, f_scl_max=100e3):
        self.clk_hz = clk_hz
        self.t_scl_min = 1 / f_scl_max
        self.addresses = set(addresses)
        self.acks = acks or (lambda addr, index, byte: True)
        self.stretch = stretch or (lambda n: 0)
        self.scl = self.sda = 1
        self.pull_scl = 0   # cycles the target still holds SCL low
        self.pull_sda = False
        self.cycle = 0
        self.busy = False
        self.nbits = self.byte = 0
        self.cur = None     # [address byte, data bytes, acks]
        self.writes = []    # (7-bit address, [data bytes], all acked)
        self.events = []    # (cycle, "start" | "restart" | "stop")
        self.violations = []
        self.falls = 0
        self.last_sda_change = None
        self.scl_rise = self.scl_fall = None
        self.high_has_condition = False

    def _need(self, name, cycles, minimum):
        if cycles / self.clk_hz < minimum * (1 - 1e-9):
            self.violations.append(f"{name} {cycles / self.clk_hz * 1e6:.3f} us < {minimum * 1e6:.3f} us "
                                   f"at cycle {self.cycle}")

    def step(self, scl_oe, sda_oe):
        """Lines in this cycle given the master's drive; updates the targets for the next cycle."""
        scl = int(not scl_oe and self.pull_scl == 0)
        sda = int(not sda_oe and not self.pull_sda)
        c = self.cycle
        if self.pull_scl:
            self.pull_scl -= 1
        if sda != self.sda:
            if scl and self.scl:            # SDA changed with SCL high: START or STOP
                self.high_has_condition = True
                if not sda:
                    kind = "restart" if self.busy else "start"
                    if kind == "start" and self.events and self.events[-1][1] == "stop":
                        self._need("t_BUF", c - self.events[-1][0], T_BUF)
                    if kind == "restart":
                        self._need("t_SU;STA", c - self.scl_rise, T_SU_STA)
                    self._close()
                    self.busy, self.nbits, self.byte, self.cur = True, 0, 0, None
                    self.events.append((c, kind))
                else:
                    self._need("t_SU;STO", c - self.scl_rise, T_SU_STO)
                    self._close()
                    self.busy = False
                    self.events.append((c, "stop"))
            self.last_sda_change = c
        if scl and not self.scl:            # SCL rises: sample
            if self.scl_fall is not None:
                self._need("t_LOW", c - self.scl_fall, T_LOW)
            if self.scl_rise is not None and self.busy:
                self._need("SCL period", c - self.scl_rise, self.t_scl_min)
            if self.last_sda_change is not None and self.busy:
                self._need("t_SU;DAT", c - self.last_sda_change, T_SU_DAT)
            self.scl_rise, self.high_has_condition = c, False
            if self.busy:
                if self.nbits < 8:
                    self.byte = (self.byte << 1) | sda
                self.nbits += 1
        if not scl and self.scl:            # SCL falls
            last = self.events[-1] if self.events else None
            if last and last[1] in ("start", "restart") and last[0] > (self.scl_rise or -1):
                self._need("t_HD;STA", c - self.events[-1][0], T_HD_STA)
            elif self.scl_rise is not None and not self.high_has_condition:
                self._need("t_HIGH", c - self.scl_rise, T_HIGH)
            self.scl_fall = c
            self.falls += 1
            if self.busy and self.nbits == 8:     # the 9th clock comes: acknowledge or not
                self.pull_sda = self._ack(self.byte)
            elif self.busy and self.nbits == 9:   # the 9th clock is over
                self.pull_sda = False
                self.nbits, self.byte = 0, 0
            hold = self.stretch(self.falls)
            if hold:
                self.pull_scl = hold
        self.scl, self.sda, self.cycle = scl, sda, c + 1
        return scl, sda

    def _ack(self, byte):
        """Acknowledge ``byte`` (the address byte right after a START, else data)?"""
        if self.cur is None:
            ok = self.address_ack(byte)
            self.cur = [byte, [], [ok]]
            return ok
        if not self.cur[2][0]:
            return False
        ok = bool(self.acks(self.cur[0] >> 1, len(self.cur[1]), byte))
        self.cur[1].append(byte)
        self.cur[2].append(ok)
        return ok

    def address_ack(self, byte):
        return (byte >> 1) in self.addresses and not byte & 1

    def _close(self):
        if self.cur is not None:
            self.writes.append((self.cur[0] >> 1, self.cur[1], all(self.cur[2])))
        self.cur = None


def run_init(dut: Si5324Init, bus: Bus, max_cycles: int, extra: int = 200):
    """Simulate ``dut`` on ``bus`` until done/error (+ ``extra`` cycles); returns a trace dict."""
    trace = {"rst_low": [], "done_at": None, "error_at": None, "cycles": 0, "rst_n": []}

    async def bench(ctx):
        end = None
        for cyc in range(max_cycles):
            scl, sda = bus.step(ctx.get(dut.scl_oe), ctx.get(dut.sda_oe))
            ctx.set(dut.scl_i, scl)
            ctx.set(dut.sda_i, sda)
            trace["rst_n"].append((ctx.get(dut.si5324_rst_n), ctx.get(dut.mux_rst_n)))
            if ctx.get(dut.done) and trace["done_at"] is None:
                trace["done_at"] = cyc
            if ctx.get(dut.error) and trace["error_at"] is None:
                trace["error_at"] = cyc
            if end is None and (trace["done_at"] is not None or trace["error_at"] is not None):
                end = cyc + extra
            if end is not None and cyc >= end:
                break
            await ctx.tick()
        trace["cycles"] = cyc + 1
        trace["final_done"], trace["final_error"] = ctx.get(dut.done), ctx.get(dut.error)

    sim = Simulator(dut)
    sim.add_clock(1 / dut.clk_hz)
    sim.add_testbench(bench)
    sim.run()
    return trace


def low_pulses(levels):
    """[(start cycle, length)] of the runs of 0 in ``levels``."""
    out, start = [], None
    for k, v in enumerate(levels + [1]):
        if not v and start is None:
            start = k
        elif v and start is not None:
            out.append((start, k - start))
            start = None
    return out


CLK = 2_000_000  # 5 clocks per quarter at 100 kHz: short simulations, real standard-mode timing in µs
FAST = {"reset_s": 5e-6, "ready_s": 50e-6}


def check_timing(bus):
    assert not bus.violations, "\n".join(bus.violations[:10])


# --- block tests ---------------------------------------------------------------------------------

@functools.cache
def plain_run():
    """The start-up on a bus with no stretching and every byte acknowledged: (bus, trace)."""
    bus = Bus(CLK)
    return bus, run_init(Si5324Init(CLK, 100_000, **FAST), bus, 60_000)


def test_startup_sequence_exact():
    """Reset pulse, ready wait, then exactly the expected writes, each in its own START…STOP, then done."""
    bus, tr = plain_run()
    assert tr["done_at"] is not None and tr["error_at"] is None, f"done={tr['done_at']} error={tr['error_at']}"
    assert [(a, d) for a, d, _ in bus.writes] == EXPECTED
    assert all(ok for _, _, ok in bus.writes)
    assert [k for _, k in bus.events] == ["start", "stop"] * len(EXPECTED)
    check_timing(bus)
    # both resets: one low pulse from reset, ≥ 1 µs (Si5324), then high for good
    for pin in (0, 1):
        pulses = low_pulses([r[pin] for r in tr["rst_n"]])
        assert len(pulses) == 1 and pulses[0][0] == 0, pulses
        assert pulses[0][1] / CLK >= max(SI5324_T_RST_MIN, FAST["reset_s"])
    release = low_pulses([r[0] for r in tr["rst_n"]])[0][1]
    first_start = bus.events[0][0]
    assert (first_start - release) / CLK >= FAST["ready_s"], "I2C access before the Si5324 is ready"
    # bus idle at the end, done stays
    assert bus.scl and bus.sda and tr["final_done"] and not tr["final_error"]
    # SCL never faster than 100 kHz: START, 9 clocks per byte, STOP; check total time against a lower bound
    nbytes = sum(1 + len(d) for _, d in EXPECTED)
    assert (tr["done_at"] - first_start) / CLK >= nbytes * 9 / 100_000


def test_clock_stretching():
    """Targets hold SCL low after every 3rd falling edge (longer than a whole SCL period): the master waits."""
    hold = 37  # cycles, > 4 quarters of 5 cycles
    dut = Si5324Init(CLK, 100_000, **FAST)
    bus = Bus(CLK, stretch=lambda n: hold if n % 3 == 0 else 0)
    tr = run_init(dut, bus, 120_000)
    assert tr["done_at"] is not None and tr["error_at"] is None
    assert [(a, d) for a, d, _ in bus.writes] == EXPECTED
    check_timing(bus)   # a master that ignored the stretch would show short SCL highs or lost bits
    plain, ref = plain_run()
    assert tr["done_at"] - ref["done_at"] >= (plain.falls // 3) * (hold - 2 * dut.quarter)


def test_nack_raises_error():
    """The Si5324 refuses the value byte of register 25: error, STOP, nothing more (retries=0)."""
    def acks(addr, index, byte):
        return not (addr == 0x68 and index == 1 and last_reg[0] == 25)

    last_reg = [None]

    def acks_tracking(addr, index, byte):
        if addr == 0x68 and index == 0:
            last_reg[0] = byte
        return acks(addr, index, byte)

    dut = Si5324Init(CLK, 100_000, retries=0, **FAST)
    bus = Bus(CLK, acks=acks_tracking)
    tr = run_init(dut, bus, 60_000, extra=2000)
    assert tr["error_at"] is not None and tr["done_at"] is None and tr["final_error"]
    k = [r for r, _ in SI5324_REGISTERS].index(25)
    assert [(a, d) for a, d, _ in bus.writes] == EXPECTED[:2 + k + 1]
    assert [ok for _, _, ok in bus.writes] == [True] * (2 + k) + [False]
    assert bus.events[-1][1] == "stop" and bus.scl and bus.sda, "the bus must be released with a STOP"
    assert bus.events[-1][0] < tr["error_at"]
    check_timing(bus)


def test_nack_address_then_retry():
    """The Si5324 does not answer its address the first time: the start-up restarts from the resets and finishes."""
    seen = [0]

    class RetryBus(Bus):
        def address_ack(self, byte):
            if byte >> 1 == 0x68:
                seen[0] += 1
                if seen[0] == 1:
                    return False
            return super().address_ack(byte)

    dut = Si5324Init(CLK, 100_000, retries=1, **FAST)
    bus = RetryBus(CLK)
    tr = run_init(dut, bus, 120_000)
    assert tr["done_at"] is not None and not tr["final_error"]
    got = [(a, d) for a, d, _ in bus.writes]
    assert got == EXPECTED[:2] + [(0x68, [])] + EXPECTED
    assert [ok for _, _, ok in bus.writes] == [True, True, False] + [True] * len(EXPECTED)
    assert len(low_pulses([r[0] for r in tr["rst_n"]])) == 2, "the retry must pulse the resets again"
    assert len(low_pulses([r[1] for r in tr["rst_n"]])) == 2
    check_timing(bus)


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"clk_hz=1500000 gives 3.75 clocks per quarter.*clk_hz >= 1600000"):
        Si5324Init(1_500_000, 100_000)
    with pytest.raises(ValueError, match="400"):
        I2cMaster(200_000_000, 1_000_000)
    with pytest.raises(ValueError, match="positive int"):
        I2cMaster(200e6)
    with pytest.raises(ValueError, match="positive int"):
        Si5324Init(200_000_000, 0)
    with pytest.raises(ValueError, match="retries"):
        Si5324Init(200_000_000, retries=-1)
    with pytest.raises(ValueError, match="ready_s"):
        Si5324Init(200_000_000, ready_s=0)
    assert quarter_cycles(1_600_000, 100_000) == 4
    assert quarter_cycles(200_000_000, 100_000) == 500
    assert quarter_cycles(10_000_000, 400_000) == 7  # 6.25 rounded up: SCL stays at or below i2c_hz


def test_verilog_ports():
    """The Verilog has exactly the ports the board top wires (plus clk and rst)."""
    from amaranth.back import verilog

    text = verilog.convert(Si5324Init(200_000_000), name="si5324_init", emit_src=False)
    header = text[text.index("module si5324_init("):].split(";", 1)[0]
    ports = {p.strip() for p in header[header.index("(") + 1:header.rindex(")")].split(",")}
    assert ports == {"clk", "rst", "scl_i", "scl_oe", "sda_i", "sda_oe", "si5324_rst_n", "mux_rst_n", "done",
                     "error"}


# --- cocotb: the Verilog with cocotbext-i2c targets ----------------------------------------------

@pytest.fixture(scope="module")
def i2c_sim(tmp_path_factory):
    from tb_i2c import build

    return build(tmp_path_factory.mktemp("i2c_verilator"))


@pytest.mark.cocotb
def test_i2c_cocotb(i2c_sim):
    """tests/cocotb/tb_i2c.py: the Verilog against cocotbext-i2c targets (two switches, an I2cMemory as the Si5324)."""
    from tb_i2c import run_case

    failures, log, result = run_case(i2c_sim, "startup")
    assert failures == 0, f"cocotb test failed; log {log}:\n" + "\n".join(
        Path(log).read_text(errors="replace").splitlines()[-40:])
    r = json.loads(result.read_text())
    assert [(a, list(d)) for a, d in r["writes"]] == EXPECTED
    assert r["si5324_memory"] == {str(reg): val for reg, val in SI5324_REGISTERS}
    assert r["reset_cycles"] / r["clk_hz"] >= SI5324_T_RST_MIN
    # at least 9 SCL periods per byte, each at least 1/i2c_hz long
    assert r["startup_cycles"] / r["clk_hz"] >= sum(1 + len(d) for _, d in EXPECTED) * 9 / r["i2c_hz"]
