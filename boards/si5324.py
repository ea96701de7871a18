"""I2C master and the VC709's Si5324 start-up: the SFP+ reference clock (156.25 MHz) in gateware.

The VC709's SFP+ cages take their GTH reference clock (MGTREFCLK0_113) from an Si5324 jitter
attenuator that comes up unprogrammed; it has to be written over I2C before the transceivers can
lock. On the board the Si5324 (address 0x68) sits behind a PCA9548/TCA9548 I2C switch at 0x74
(channel 7); a second switch at 0x75 shares the bus and is switched off. :class:`Si5324Init` does
the whole start-up after reset without a processor:

1. pulse the Si5324 reset (``si5324_rst_n``) and the switch reset (``mux_rst_n``), then wait
   for the Si5324 to be ready for I2C access;
2. write the 0x74 control register (channel 7 only), write 0 to the 0x75 control register;
3. write :data:`SI5324_REGISTERS` to the Si5324, one register per I2C write, ending with ICAL;
4. raise ``done`` — or ``error`` if a target did not acknowledge (after ``retries`` restarts).

:class:`I2cMaster` is the byte-level master underneath it (START / repeated START, write a byte
and read the ACK, STOP) with open-drain pins and clock stretching.

Sources: NXP UM10204 *I2C-bus specification and user manual* (rev. 7, table 10, standard- and
fast-mode timing); Silicon Labs *Si5324 data sheet* and *Any-Frequency Precision Clocks
Si5316/19/22/23/24/25/26/27/68/69/74/75 family reference manual* (register map, divider
encoding: each divider register holds the divider minus 1, N1_HS/N2_HS minus 4); TI
*TCA9548A* / NXP *PCA9548A* data sheets (control register: one enable bit per channel; RESET
low pulse t_W(L) ≥ 6 ns, recovery 0 ns).
"""

from __future__ import annotations

import math

from amaranth import Module, Signal, unsigned
from amaranth.lib import enum, memory, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = [
    "I2cCmd", "I2cMaster", "Si5324Init", "SI5324_REGISTERS", "SI5324_ADDR", "MUX_ADDR", "MUX_CHANNEL",
    "MUX2_ADDR", "XTAL_HZ", "RESET_PULSE_S", "READY_S", "startup_writes", "MIN_QUARTER_CYCLES", "quarter_cycles",
]

#: Fewest system clocks in a quarter of an SCL period: the input synchronisers take 2 of them, and
#: the master must see its own SCL low before it can wait for the line to rise again.
MIN_QUARTER_CYCLES = 4

#: 7-bit I2C address of the Si5324 on the VC709.
SI5324_ADDR = 0x68
#: 7-bit address of the PCA9548/TCA9548 switch in front of the Si5324, and the channel it is on.
MUX_ADDR, MUX_CHANNEL = 0x74, 7
#: 7-bit address of the VC709's second I2C switch; written 0 (all channels off).
MUX2_ADDR = 0x75
#: The Si5324's crystal (XA/XB) on the VC709, Hz.
XTAL_HZ = 114_285_000

#: Si5324 RST low time, seconds: the data sheet's minimum reset pulse width is 1 µs (the
#: PCA9548A/TCA9548A need ≥ 6 ns); 10 µs leaves margin for the slow board-level RC.
RESET_PULSE_S = 10e-6
#: Wait after releasing the resets before the first I2C access, seconds: the Si5324 needs up to
#: 10 ms after RST rises before its registers can be accessed; 20 ms is twice that.
READY_S = 20e-3

#: Si5324 register writes (register, value) for 156.25 MHz on CKOUT1 from the VC709's 114.285 MHz
#: crystal in free-run mode, in the order they are written; the last one starts the internal
#: calibration (ICAL). The values are the ones public VC709 10G designs program (Alex Forencich's
#: verilog-ethernet ``example/VC709/fpga/rtl/si5324_i2c_init.v``, also used by Corundum), decoded
#: here with the Si5324 register map (DSPLLsim terms):
#:
#: ====  =====  =============================================================================
#: reg   value  meaning
#: ====  =====  =============================================================================
#: 0     0x54   FREE_RUN = 1 (XA/XB crystal routed to CKIN2), CKOUT_ALWAYS_ON = 0, BYPASS = 0
#: 1     0xE4   CK_PRIOR1 = CKIN1, CK_PRIOR2 = CKIN2
#: 2     0x12   BWSEL_REG = 1
#: 3     0x15   CKSEL_REG = CKIN1, DHOLD = 0, SQ_ICAL = 1 (outputs off during ICAL)
#: 4     0x92   AUTOSEL_REG = automatic revertive, HIST_DEL = 0x12
#: 10    0x08   DSBL2_REG = 1 (CKOUT2 off), CKOUT1 on
#: 11    0x40   PD_CK1 = PD_CK2 = 0 (both inputs powered)
#: 25    0xA0   N1_HS = 5 + 4 = 9
#: 31-33 0x000003  NC1_LS = 3 + 1 = 4
#: 40-42 0xC249EF  N2_HS = 6 + 4 = 10, N2_LS = 0x249EF + 1 = 150000
#: 43-45 0x00770B  N31 = 0x770B + 1 = 30476
#: 46-48 0x00770B  N32 = 30476
#: 136   0x40   ICAL = 1
#: ====  =====  =============================================================================
#:
#: f_osc = 114.285 MHz / N32 · N2_HS · N2_LS = 5.625 GHz (inside the 4.85–5.67 GHz DCO range);
#: f_out = f_osc / (N1_HS · NC1_LS) = 156.25 MHz exactly.
SI5324_REGISTERS: tuple[tuple[int, int], ...] = (
    (0, 0x54), (1, 0xE4), (2, 0x12), (3, 0x15), (4, 0x92),
    (10, 0x08), (11, 0x40),
    (25, 0xA0),
    (31, 0x00), (32, 0x00), (33, 0x03),
    (40, 0xC2), (41, 0x49), (42, 0xEF),
    (43, 0x00), (44, 0x77), (45, 0x0B),
    (46, 0x00), (47, 0x77), (48, 0x0B),
    (136, 0x40),
)


def startup_writes() -> tuple[tuple[int, bytes], ...]:
    """The I2C writes of the start-up, in order: (7-bit address, data bytes after the address byte).

    Switch 0x74 ← channel 7 only, switch 0x75 ← 0, then one (register, value) write to the Si5324
    per entry of :data:`SI5324_REGISTERS`. This is what :class:`Si5324Init`'s ROM holds.
    """
    return ((MUX_ADDR, bytes([1 << MUX_CHANNEL])), (MUX2_ADDR, bytes([0])),
            *((SI5324_ADDR, bytes([reg, value])) for reg, value in SI5324_REGISTERS))


def _check_hz(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int in Hz, got {value!r}")


def quarter_cycles(clk_hz: int, i2c_hz: int) -> int:
    """Clock cycles in a quarter SCL period, ``ceil(clk_hz / (4 · i2c_hz))`` (so SCL ≤ ``i2c_hz``).

    Raises
    ------
    ValueError
        If a frequency is not a positive int, ``i2c_hz`` is above 400 kHz (fast mode), or the
        quarter would be shorter than :data:`MIN_QUARTER_CYCLES` (4) clocks.
    """
    _check_hz("clk_hz", clk_hz)
    _check_hz("i2c_hz", i2c_hz)
    if i2c_hz > 400_000:
        raise ValueError(f"i2c_hz={i2c_hz} is above fast mode (400 kHz); use 100_000 (standard mode) "
                         "or at most 400_000")
    ratio = clk_hz / (4 * i2c_hz)
    if ratio < MIN_QUARTER_CYCLES:
        raise ValueError(
            f"clk_hz={clk_hz} gives {ratio:g} clocks per quarter of a {i2c_hz} Hz SCL period, fewer than "
            f"{MIN_QUARTER_CYCLES}; use clk_hz >= {MIN_QUARTER_CYCLES * 4 * i2c_hz} or a lower i2c_hz")
    return math.ceil(ratio)


class I2cCmd(enum.Enum, shape=2):
    """What :class:`I2cMaster` does with an accepted command."""
    START = 0  #: START, or a repeated START if the master still holds the bus
    WRITE = 1  #: shift out ``data`` MSB first, then read the target's ACK into ``nack``
    STOP = 2   #: STOP, then the bus-free time


class I2cMaster(wiring.Component):
    """Byte-level I2C master, single master, open-drain pins, clock stretching honoured.

    Parameters
    ----------
    clk_hz : int
        Frequency of the ``sync`` domain, Hz.
    i2c_hz : int
        SCL frequency, Hz (100 kHz standard mode by default; at most 400 kHz).

    Every SCL period is four *quarters* of ``quarter = ceil(clk_hz / (4 · i2c_hz))`` cycles: SCL
    low for two (SDA changes after the first), released for two (counted from the moment the line
    is seen high, so a target holding SCL low stretches the clock for as long as it likes). START
    holds SDA low two quarters before SCL falls (t_HD;STA), a repeated START and STOP wait two
    quarters with SCL high (t_SU;STA, t_SU;STO), and STOP leaves the bus free two quarters
    (t_BUF). At 100 kHz every UM10204 standard-mode minimum is met (t_LOW 5 µs ≥ 4.7, t_HIGH
    5 µs ≥ 4.0, data setup 2.5 µs ≥ 0.25, data valid 2.5 µs ≤ 3.45); for fast mode's t_LOW
    ≥ 1.3 µs keep ``i2c_hz`` ≤ 384 kHz. ``scl_i``/``sda_i`` go through 2-FF synchronisers.

    Ports
    -----
    scl_i, sda_i : In(1)
        The lines as seen on the pins.
    scl_oe, sda_oe : Out(1)
        1 pulls the line low; 0 releases it (the pull-up makes it high). Registered.
    cmd : In(I2cCmd); data : In(8); valid : In(1); ready : Out(1)
        A command is taken in a cycle with ``valid`` and ``ready``; ``ready`` is high again when
        it is finished.
    nack : Out(1)
        After a WRITE: 1 if the target did not acknowledge the byte (SDA high at the 9th clock).

    Raises
    ------
    ValueError
        If a frequency is not a positive int, ``i2c_hz`` is above 400 kHz, or ``clk_hz`` gives
        fewer than :data:`MIN_QUARTER_CYCLES` (4) clocks per quarter SCL period.
    """

    def __init__(self, clk_hz: int, i2c_hz: int = 100_000):
        quarter = quarter_cycles(clk_hz, i2c_hz)
        self.clk_hz, self.i2c_hz = clk_hz, i2c_hz
        #: cycles in a quarter of an SCL period
        self.quarter = quarter
        super().__init__({
            "scl_i": In(1, init=1), "scl_oe": Out(1), "sda_i": In(1, init=1), "sda_oe": Out(1),
            "cmd": In(I2cCmd), "data": In(8), "valid": In(1), "ready": Out(1), "nack": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        q = self.quarter
        scl = Signal(init=1)
        sda = Signal(init=1)
        m.submodules.scl_sync = FFSynchronizer(self.scl_i, scl, init=1)
        m.submodules.sda_sync = FFSynchronizer(self.sda_i, sda, init=1)

        timer = Signal(range(2 * q))
        expired = timer == 0
        held = Signal()       # SCL is ours and low: between a START and its STOP
        shreg = Signal(8)
        bits = Signal(range(8))

        def wait(quarters: int):
            m.d.sync += timer.eq(quarters * q - 1)

        def scl_up(low: str, rise: str, then: str):
            """States ``low`` (SCL held low until the timer expires, then released) and ``rise``
            (clock stretching: wait for the line, not the timer), then ``then`` with a two-quarter
            wait: the rising SCL edge of a bit, the ACK clock, a repeated START and a STOP."""
            with m.State(low):
                with m.If(expired):
                    m.d.sync += self.scl_oe.eq(0)
                    m.next = rise
            with m.State(rise):
                with m.If(scl):
                    wait(2)
                    m.next = then

        with m.If(~expired):
            m.d.sync += timer.eq(timer - 1)   # the FSM's loads below take precedence

        with m.FSM(name="i2c"):
            with m.State("IDLE"):
                m.d.comb += self.ready.eq(1)
                with m.If(self.valid):
                    with m.Switch(self.cmd):
                        with m.Case(I2cCmd.START):
                            with m.If(held):
                                m.d.sync += self.sda_oe.eq(0)
                                wait(1)
                                m.next = "RS_SDA_UP"
                            with m.Else():
                                m.d.sync += self.sda_oe.eq(1)
                                wait(2)
                                m.next = "START_HOLD"
                        with m.Case(I2cCmd.WRITE):
                            m.d.sync += [shreg.eq(self.data), bits.eq(7), self.sda_oe.eq(~self.data[7])]
                            wait(1)
                            m.next = "BIT_LOW"
                        with m.Case(I2cCmd.STOP):
                            m.d.sync += self.sda_oe.eq(1)
                            wait(1)
                            m.next = "STOP_LOW"

            # repeated START: SDA up while SCL is low, SCL up, t_SU;STA, then a START
            scl_up("RS_SDA_UP", "RS_SCL_UP", "RS_SETUP")
            with m.State("RS_SETUP"):
                with m.If(expired):
                    m.d.sync += self.sda_oe.eq(1)
                    wait(2)
                    m.next = "START_HOLD"
            # START: SDA went low with SCL high; t_HD;STA, then SCL low for one quarter
            with m.State("START_HOLD"):
                with m.If(expired):
                    m.d.sync += self.scl_oe.eq(1)
                    wait(1)
                    m.next = "START_LOW"
            with m.State("START_LOW"):
                with m.If(expired):
                    m.d.sync += held.eq(1)
                    m.next = "IDLE"

            # one data bit: SDA set one quarter before SCL is released
            scl_up("BIT_LOW", "BIT_RISE", "BIT_HIGH")
            with m.State("BIT_HIGH"):
                with m.If(expired):
                    m.d.sync += self.scl_oe.eq(1)
                    wait(1)
                    m.next = "BIT_FALL"
            with m.State("BIT_FALL"):
                with m.If(expired):
                    wait(1)
                    with m.If(bits == 0):
                        m.d.sync += self.sda_oe.eq(0)     # release SDA for the target's ACK
                        m.next = "ACK_LOW"
                    with m.Else():
                        m.d.sync += [bits.eq(bits - 1), shreg.eq(shreg << 1), self.sda_oe.eq(~shreg[6])]
                        m.next = "BIT_LOW"

            # the 9th clock: read the ACK in the middle of SCL high
            scl_up("ACK_LOW", "ACK_RISE", "ACK_HIGH")
            with m.State("ACK_HIGH"):
                with m.If(timer == q - 1):
                    m.d.sync += self.nack.eq(sda)
                with m.If(expired):
                    m.d.sync += self.scl_oe.eq(1)
                    wait(1)
                    m.next = "ACK_FALL"
            with m.State("ACK_FALL"):
                with m.If(expired):
                    m.next = "IDLE"

            # STOP: SDA low while SCL is low, SCL up, t_SU;STO, SDA up, t_BUF
            scl_up("STOP_LOW", "STOP_RISE", "STOP_SETUP")
            with m.State("STOP_SETUP"):
                with m.If(expired):
                    m.d.sync += self.sda_oe.eq(0)
                    wait(2)
                    m.next = "STOP_BUF"
            with m.State("STOP_BUF"):
                with m.If(expired):
                    m.d.sync += held.eq(0)
                    m.next = "IDLE"
        return m


# ROM word: bit 9 = first byte of a write (send START before it), bit 8 = last byte (STOP after it)
_FIRST, _LAST = 1 << 9, 1 << 8


def _program() -> list[int]:
    words = []
    for addr, payload in startup_writes():
        seq = [addr << 1, *payload]  # address byte with R/W = 0 (write)
        for k, byte in enumerate(seq):
            words.append((_FIRST if k == 0 else 0) | (_LAST if k == len(seq) - 1 else 0) | byte)
    return words


class Si5324Init(wiring.Component):
    """Reset the VC709's I2C switch and Si5324, select the Si5324 and program it for 156.25 MHz.

    Parameters
    ----------
    clk_hz : int
        Frequency of the ``sync`` domain, Hz (the VC709's 200 MHz system clock, for instance).
    i2c_hz : int
        SCL frequency, Hz; 100 kHz (standard mode) by default. See :class:`I2cMaster`.
    reset_s : float
        How long ``si5324_rst_n`` and ``mux_rst_n`` are held low, seconds (default
        :data:`RESET_PULSE_S`, 10 µs ≥ the Si5324's 1 µs minimum).
    ready_s : float
        Wait after the resets are released before the first I2C access, seconds (default
        :data:`READY_S`, 20 ms ≥ the Si5324's 10 ms).
    retries : int
        Times the whole start-up (from the reset pulse) is tried again after a NACK before
        ``error`` is raised.

    Ports
    -----
    scl_i, sda_i : In(1); scl_oe, sda_oe : Out(1)
        The I2C pins, open drain: ``*_oe`` = 1 pulls the line low (VC709: SCL AT35, SDA AU32).
    si5324_rst_n : Out(1)
        Si5324 RST, active low (VC709: AT36).
    mux_rst_n : Out(1)
        I2C switch RESET, active low (VC709: AY42).
    done : Out(1)
        High, and stays high, once the last write (ICAL, register 136 ← 0x40) was acknowledged.
        The Si5324 then calibrates (outputs squelched, SQ_ICAL = 1) before CKOUT1 runs; the
        transceivers' reset logic has to wait for their PLL lock, not only for ``done``.
    error : Out(1)
        High, and stays high, when a target did not acknowledge a byte and no retry is left; a
        STOP was sent and nothing more happens until reset.

    The writes are :func:`startup_writes` held in a ROM (one 10-bit word per byte).

    Raises
    ------
    ValueError
        As :class:`I2cMaster`; also if ``reset_s`` or ``ready_s`` is not positive or
        ``retries`` is negative.
    """

    def __init__(self, clk_hz: int, i2c_hz: int = 100_000, *, reset_s: float = RESET_PULSE_S,
                 ready_s: float = READY_S, retries: int = 2):
        #: cycles in a quarter SCL period (see :class:`I2cMaster`)
        self.quarter = quarter_cycles(clk_hz, i2c_hz)
        if not reset_s > 0 or not ready_s > 0:
            raise ValueError(f"reset_s and ready_s must be positive seconds, got reset_s={reset_s!r}, "
                             f"ready_s={ready_s!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        self.clk_hz, self.i2c_hz, self.retries = clk_hz, i2c_hz, retries
        #: cycles ``si5324_rst_n``/``mux_rst_n`` are low, and cycles waited after they rise
        self.reset_cycles = max(1, math.ceil(reset_s * clk_hz))
        self.ready_cycles = max(1, math.ceil(ready_s * clk_hz))
        self.program = _program()
        super().__init__({
            "scl_i": In(1, init=1), "scl_oe": Out(1), "sda_i": In(1, init=1), "sda_oe": Out(1),
            "si5324_rst_n": Out(1), "mux_rst_n": Out(1), "done": Out(1), "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.master = master = I2cMaster(self.clk_hz, self.i2c_hz)
        m.d.comb += [
            master.scl_i.eq(self.scl_i), master.sda_i.eq(self.sda_i),
            self.scl_oe.eq(master.scl_oe), self.sda_oe.eq(master.sda_oe),
        ]
        n = len(self.program)
        # one spare word so that the address never leaves the ROM (pc == n after the last write)
        m.submodules.rom = rom = memory.Memory(shape=unsigned(10), depth=n + 1, init=self.program + [0])
        rd = rom.read_port(domain="comb")
        pc = Signal(range(n + 1))
        m.d.comb += rd.addr.eq(pc)
        first, last, byte = rd.data[9], rd.data[8], rd.data[:8]

        count = Signal(range(max(self.reset_cycles, self.ready_cycles) + 1))
        tries = Signal(range(self.retries + 1), init=self.retries)

        # registered, so that the reset pins and the status never glitch while the FSM decodes
        rst_n = Signal()
        m.d.comb += [self.si5324_rst_n.eq(rst_n), self.mux_rst_n.eq(rst_n)]
        done, error = Signal(), Signal()
        m.d.comb += [self.done.eq(done), self.error.eq(error)]

        with m.FSM(name="init"):
            with m.State("RESET"):
                m.d.sync += count.eq(count + 1)
                with m.If(count == self.reset_cycles - 1):
                    m.d.sync += [count.eq(0), rst_n.eq(1)]
                    m.next = "READY_WAIT"
            with m.State("READY_WAIT"):
                m.d.sync += count.eq(count + 1)
                with m.If(count == self.ready_cycles - 1):
                    m.d.sync += [count.eq(0), pc.eq(0)]
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.next = "START"
                with m.If(~first):
                    m.next = "WRITE"
            for name, cmd, after in (("START", I2cCmd.START, "WRITE"), ("WRITE", I2cCmd.WRITE, "WROTE"),
                                     ("STOP", I2cCmd.STOP, "STOPPED"), ("NACK_STOP", I2cCmd.STOP, "ABORTED")):
                with m.State(name):
                    m.d.comb += [master.valid.eq(1), master.cmd.eq(cmd), master.data.eq(byte)]
                    with m.If(master.ready):
                        m.next = f"{name}_BUSY"
                with m.State(f"{name}_BUSY"):
                    with m.If(master.ready):
                        m.next = after
            with m.State("WROTE"):
                with m.If(master.nack):
                    m.next = "NACK_STOP"
                with m.Else():
                    m.d.sync += pc.eq(pc + 1)
                    m.next = "WRITE"
                    with m.If(last):
                        m.next = "STOP"
            with m.State("STOPPED"):
                m.next = "NEXT"
                with m.If(pc == n):
                    m.d.sync += done.eq(1)
                    m.next = "DONE"
            with m.State("ABORTED"):
                with m.If(tries == 0):
                    m.d.sync += error.eq(1)
                    m.next = "ERROR"
                with m.Else():
                    m.d.sync += [tries.eq(tries - 1), pc.eq(0), count.eq(0), rst_n.eq(0)]
                    m.next = "RESET"
            with m.State("DONE"):
                pass
            with m.State("ERROR"):
                pass
        return m
