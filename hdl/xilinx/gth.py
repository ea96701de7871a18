"""GTHE2 transceivers (Virtex-7) for 10GBASE-R: one QPLL per quad, 32-bit raw words, reset sequencing.

The PCS (:mod:`wirereduce.hdl.eth.pcs`) does 64b/66b coding, scrambling and the 66 ↔ 32 gearbox itself
(``TxGearbox``/``RxGearbox`` with ``width=32``), so the transceiver runs in *raw* mode: 8b/10b off,
the GTH's own 64b/66b gearbox off (``TXGEARBOX_EN = RXGEARBOX_EN = "FALSE"``), a 32-bit user
interface with a 4-byte internal datapath (``TX/RX_DATA_WIDTH = 32``, ``TX/RX_INT_DATAWIDTH = 1``).
Bit 0 of a 32-bit word is the first bit on the line, as the PCS expects (UG476 "FPGA TX Interface":
TXDATA[0] is serialised first).

Clocking (UG476 ch. 2 "Shared Features", QPLL; equations 2-3 and 2-4)::

    f_PLLClkout = f_refclk * N / (M * 2)         = 156.25 MHz * 66 / (1 * 2) = 5156.25 MHz
    line rate   = f_PLLClkout * 2 / D            = 5156.25 MHz * 2 / 1       = 10.3125 Gbit/s
    QPLL VCO    = f_refclk * N / M               = 10312.5 MHz (GTHE2 QPLL range 8.0-13.1 GHz, DS183)
    TXUSRCLK = TXUSRCLK2 = line rate / 32       = 322.265625 MHz (UG476 "FPGA TX Interface", 4-byte internal)

``TXOUTCLK`` (``TXOUTCLKSEL = 3'b010``, TXOUTCLKPMA) and ``RXOUTCLK`` (``RXOUTCLKSEL = 3'b010``,
RXOUTCLKPMA, the recovered clock) each drive a BUFG that clocks the channel's ``gt{n}_tx`` and
``gt{n}_rx`` domains (322.265625 MHz). Both buffers stay on (TX buffer: ``TX_XCLK_SEL = "TXOUT"``;
RX elastic buffer without clock correction: the RX side runs on the recovered clock, so a
±100 ppm partner cannot over- or underflow it).

Attribute values: the ones that define the operating point (dividers, widths, clock selects,
gearbox, buffer, 8b/10b) follow from UG476 (v1.12) tables cited at :data:`QPLL_ATTRS` and
:data:`CHANNEL_ATTRS`. The analog "reserved"/CDR values (``QPLL_CFG``, ``QPLL_LOCK_CFG``,
``BIAS_CFG``, ``RXCDR_CFG``, ``PMA_RSV*``, ``RX_DFE_*``) are those the 7 Series Transceivers Wizard
writes for GTHE2 (as seen in public wizard-generated wrappers); they could not be checked against
a Vivado run here and should be compared with a wizard output for 10.3125 Gbit/s before the first
bitstream.

Components
----------
:class:`GthResetSequencer`
    Plain-Amaranth state machine (simulated in ``tests/test_gth.py``): waits for the reference
    clock (Si5324 programmed), resets the QPLL, waits for lock, releases GTTXRESET/GTRXRESET,
    waits for TX/RXRESETDONE, with time-outs and restart on lock loss (UG476 "Reset and
    Initialization", GTTXRESET/GTRXRESET after PLL lock, Figures 2-14/2-23 sequential mode).
:class:`GthCommon10G`
    IBUFDS_GTE2 for the reference clock(s) + ``GTHE2_COMMON`` (QPLL).
:class:`GthChannel10G`
    One ``GTHE2_CHANNEL`` with its two BUFGs and clock domains ``gt{n}_tx`` / ``gt{n}_rx``.
:class:`GthQuad10G`
    A quad: common + channels + one sequencer (all lanes share the QPLL and are reset together).
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Const, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting

__all__ = [
    "REFCLK_HZ", "LINE_RATE_BPS", "USRCLK_HZ", "WORD_BITS",
    "QPLL_ATTRS", "CHANNEL_ATTRS", "qpll_line_rate",
    "GthResetSequencer", "GthCommon10G", "GthChannel10G", "GthQuad10G",
]

#: Reference clock of the QPLL in Hz (Si5324 output on MGTREFCLK0_113 of the VC709, docs/boards.md "Clocking").
REFCLK_HZ = 156_250_000
#: 10GBASE-R line rate in bit/s (IEEE 802.3 clause 49: 10 Gbit/s * 66 / 64).
LINE_RATE_BPS = 10_312_500_000
#: Width of TXDATA/RXDATA used, in bits.
WORD_BITS = 32
#: TXUSRCLK(2)/RXUSRCLK(2) in Hz: line rate / 32 bits = 322.265625 MHz.
USRCLK_HZ = LINE_RATE_BPS / WORD_BITS

# QPLL dividers (UG476 "QPLL" section: divider settings and the QPLL_FBDIV encoding table).
QPLL_M = 1    # QPLL_REFCLK_DIV
QPLL_N = 66   # QPLL_FBDIV_IN: 66 needs QPLL_FBDIV = 10'b0101000000 with QPLL_FBDIV_RATIO = 0
OUT_DIV = 1   # RXOUT_DIV / TXOUT_DIV (D)

#: QPLL_FBDIV encodings of UG476's QPLL divider table (integer N → 10-bit attribute, FBDIV_RATIO).
QPLL_FBDIV_ENCODING = {
    16: (0b0000100000, 1), 20: (0b0000110000, 1), 32: (0b0001100000, 1), 40: (0b0010000000, 1),
    64: (0b0011100000, 1), 66: (0b0101000000, 0), 80: (0b0100100000, 1), 100: (0b0101110000, 1),
}


def qpll_line_rate(refclk_hz: float, n: int, m: int, d: int) -> float:
    """Line rate in bit/s of a channel on the QPLL (UG476 equations 2-3 and 2-4).

    ``f_PLLClkout = refclk * N / (M * 2)``; ``line rate = f_PLLClkout * 2 / D``.

    Raises
    ------
    ValueError
        If ``n`` is not a QPLL feedback divider of UG476 (16, 20, 32, 40, 64, 66, 80, 100), ``m`` not
        in 1..4 or ``d`` not in {1, 2, 4, 8, 16}.
    """
    if n not in QPLL_FBDIV_ENCODING:
        raise ValueError(f"QPLL N={n} is not a QPLL feedback divider of UG476: {sorted(QPLL_FBDIV_ENCODING)}")
    if m not in (1, 2, 3, 4):
        raise ValueError(f"QPLL M (QPLL_REFCLK_DIV) must be 1-4, not {m}")
    if d not in (1, 2, 4, 8, 16):
        raise ValueError(f"RX/TXOUT_DIV must be 1, 2, 4, 8 or 16, not {d}")
    return refclk_hz * n / (m * 2) * 2 / d


#: ``GTHE2_COMMON`` attributes: name → value (``Const`` for bit vectors, with the width of the
#: UNISIM model). Operating point from UG476 "QPLL" (dividers, FBDIV encoding); ``*_CFG``, ``BIAS_CFG``, ``COMMON_CFG``
#: are 7 Series Wizard values for GTHE2 (not confirmed against a Vivado run here).
QPLL_ATTRS = {
    "BIAS_CFG": Const(0x0000040000001050, 64),
    "COMMON_CFG": Const(0x0000001C, 32),
    "QPLL_CFG": Const(0x04801C7, 27),
    "QPLL_CLKOUT_CFG": Const(0b1111, 4),
    "QPLL_COARSE_FREQ_OVRD": Const(0b010000, 6),
    "QPLL_COARSE_FREQ_OVRD_EN": Const(0, 1),
    "QPLL_CP": Const(0b0000011111, 10),
    "QPLL_CP_MONITOR_EN": Const(0, 1),
    "QPLL_DMONITOR_SEL": Const(0, 1),
    "QPLL_FBDIV": Const(QPLL_FBDIV_ENCODING[QPLL_N][0], 10),
    "QPLL_FBDIV_MONITOR_EN": Const(0, 1),
    "QPLL_FBDIV_RATIO": Const(QPLL_FBDIV_ENCODING[QPLL_N][1], 1),
    "QPLL_INIT_CFG": Const(0x000006, 24),
    "QPLL_LOCK_CFG": Const(0x05E8, 16),
    "QPLL_LPF": Const(0b1111, 4),
    "QPLL_REFCLK_DIV": QPLL_M,
    "QPLL_RP_COMP": Const(0, 1),
    "QPLL_VTRL_RESET": Const(0, 2),
    "RCAL_CFG": Const(0, 2),
    "RSVD_ATTR0": Const(0, 16),
    "RSVD_ATTR1": Const(0, 16),
    "SIM_QPLLREFCLK_SEL": Const(0b001, 3),
    "SIM_RESET_SPEEDUP": "FALSE",
    "SIM_VERSION": "2.0",
}

#: ``GTHE2_CHANNEL`` attributes for 10.3125 Gbit/s raw 32-bit mode. UG476 sources (by section, v1.12):
#: "FPGA TX/RX Interface" (32-bit external width with the 4-byte internal datapath,
#: TXUSRCLK = TXUSRCLK2 = line rate / 32); "TX/RX Fabric Clock Output Control" and the QPLL equations
#: above (``*OUT_DIV`` = 1); ``*_CLK25_DIV`` = ceil(156.25 MHz / 25 MHz) = 7 (the attribute
#: descriptions: refclk / CLK25_DIV must not exceed 25 MHz); "TX/RX Gearbox" (off); "TX Buffer",
#: "RX Elastic Buffer" (on, no clock correction); "TX 8B/10B Encoder" (off). ``RXCDR_CFG`` is the
#: wizard's GTHE2 value for line rates ≥ 8 Gbit/s with RXOUT_DIV = 1 (UG476 "RX CDR" lists
#: RXCDR_CFG by line rate and divider; the value was not confirmed against the table here).
CHANNEL_ATTRS = {
    # data path widths
    "TX_DATA_WIDTH": 32, "RX_DATA_WIDTH": 32,
    "TX_INT_DATAWIDTH": 1, "RX_INT_DATAWIDTH": 1,
    # dividers
    "TXOUT_DIV": OUT_DIV, "RXOUT_DIV": OUT_DIV,
    "TX_CLK25_DIV": 7, "RX_CLK25_DIV": 7,
    # gearbox off: the PCS in wirereduce.hdl.eth.pcs does 66 <-> 32
    "TXGEARBOX_EN": "FALSE", "RXGEARBOX_EN": "FALSE", "GEARBOX_MODE": Const(0, 3),
    # buffers on, no clock correction / channel bonding / comma alignment (64b/66b raw)
    "TXBUF_EN": "TRUE", "TX_XCLK_SEL": "TXOUT", "TXBUF_RESET_ON_RATE_CHANGE": "TRUE",
    "RXBUF_EN": "TRUE", "RX_XCLK_SEL": "RXREC", "RXBUF_ADDR_MODE": "FAST",
    "RXBUF_RESET_ON_RATE_CHANGE": "TRUE", "RXBUF_RESET_ON_EIDLE": "FALSE",
    "RXBUF_RESET_ON_CB_CHANGE": "TRUE", "RXBUF_RESET_ON_COMMAALIGN": "FALSE",
    "RXBUF_THRESH_OVFLW": 61, "RXBUF_THRESH_UNDFLW": 4, "RXBUF_THRESH_OVRD": "FALSE",
    "RXBUF_EIDLE_HI_CNT": Const(0b1000, 4), "RXBUF_EIDLE_LO_CNT": Const(0, 4),
    "RX_BUFFER_CFG": Const(0, 6), "RX_DEFER_RESET_BUF_EN": "TRUE",
    "CLK_CORRECT_USE": "FALSE", "CHAN_BOND_SEQ_2_USE": "FALSE", "FTS_LANE_DESKEW_EN": "FALSE",
    "ALIGN_COMMA_DOUBLE": "FALSE", "ALIGN_MCOMMA_DET": "FALSE", "ALIGN_PCOMMA_DET": "FALSE",
    "ALIGN_COMMA_ENABLE": Const(0b1111111111, 10), "ALIGN_COMMA_WORD": 1,
    "SHOW_REALIGN_COMMA": "FALSE", "RXSLIDE_MODE": "OFF",
    "DEC_MCOMMA_DETECT": "FALSE", "DEC_PCOMMA_DETECT": "FALSE", "DEC_VALID_COMMA_ONLY": "FALSE",
    "PCS_PCIE_EN": "FALSE",
    # CDR (wizard value for GTHE2, >= 8 Gbit/s, RXOUT_DIV = 1)
    "RXCDR_CFG": Const(0x0002007FE2000C208001A, 83),
    "RXCDR_LOCK_CFG": Const(0b010101, 6),
    "RXCDR_FR_RESET_ON_EIDLE": Const(0, 1), "RXCDR_HOLD_DURING_EIDLE": Const(0, 1),
    "RXCDR_PH_RESET_ON_EIDLE": Const(0, 1),
    # PMA (GTHE2 defaults written by the wizard)
    "PMA_RSV": Const(0x00000080, 32), "PMA_RSV2": Const(0x1C00000A, 32), "PMA_RSV3": Const(0, 2),
    "PMA_RSV4": Const(0x0008, 15), "PMA_RSV5": Const(0, 4),
    "RX_BIAS_CFG": Const(0b000011000000000000010000, 24), "RX_CM_SEL": Const(0b11, 2),
    "RX_CM_TRIM": Const(0b1010, 4), "RX_OS_CFG": Const(0b0000010000000, 13),
    "TERM_RCAL_CFG": Const(0b100001000010000, 15), "TERM_RCAL_OVRD": Const(0, 3),
    "OUTREFCLK_SEL_INV": Const(0b11, 2), "DMONITOR_CFG": Const(0x000A00, 24),
    "RX_DFE_LPM_CFG": Const(0x0080, 16), "RXLPM_HF_CFG": Const(0b00001000000000, 14),
    "RXLPM_LF_CFG": Const(0b001001000000000000, 18), "ADAPT_CFG0": Const(0x00C10, 20),
    "CFOK_CFG": Const(0x24800040E80, 42), "CFOK_CFG2": Const(0x20, 6), "CFOK_CFG3": Const(0x20, 6),
    # CPLL unused (powered down), its attributes at their wizard values
    "CPLL_CFG": Const(0x00BC07DC, 29), "CPLL_FBDIV": 4, "CPLL_FBDIV_45": 5, "CPLL_REFCLK_DIV": 1,
    # simulation-only
    "SIM_RESET_SPEEDUP": "FALSE", "SIM_VERSION": "2.0", "SIM_CPLLREFCLK_SEL": Const(0b001, 3),
}


class GthResetSequencer(wiring.Component):
    """Reset and initialisation of a GTHE2 quad on one QPLL (UG476 "Reset and Initialization").

    Runs in its ``sync`` domain, a free-running clock of ``clk_hz`` that does not depend on the
    transceivers (the board's 200 MHz system clock; rename with ``DomainRenamer``). Asynchronous
    inputs are synchronised inside (two flip-flops, so each input is seen 2 cycles late).

    States::

        WAIT_REFCLK  all resets held until refclk_ready (Si5324 programmed, docs/boards.md "Si5324 start-up")
        QPLL_RESET   QPLLRESET high for qpll_reset_cycles
        WAIT_QPLL    QPLLLOCK within lock_timeout_s, else back to QPLL_RESET (restarts += 1)
        WAIT_DONE    GTTX/GTRXRESET released, TX/RXUSERRDY high; all lanes' TX and RXRESETDONE within
                     done_timeout_s, else back to QPLL_RESET (restarts += 1)
        READY        tx_ready / rx_ready high; loss of refclk_ready → WAIT_REFCLK, loss of QPLL
                     lock → QPLL_RESET (restarts += 1)

    GTTXRESET/GTRXRESET stay high from reset until the QPLL has locked (UG476: "GTTXRESET must be
    held until the PLL is locked"); TX/RXUSERRDY rise with their release, when TXUSRCLK (from the
    locked QPLL) is stable.

    Parameters
    ----------
    clk_hz : int
        Frequency of the ``sync`` domain in Hz (≥ 1 MHz).
    lanes : int
        Channels on the QPLL (1-4); their RESETDONE flags are ANDed.
    qpll_reset_ns : float
        Width of the QPLLRESET pulse in ns (default 1000; UG476 asks for a pulse, any width ≥ 1
        cycle of the lock-detect clock works).
    lock_timeout_s, done_timeout_s : float
        Time-outs in seconds (defaults 2 ms and 5 ms; QPLL lock is specified as < 1 ms in DS183).

    Attributes
    ----------
    refclk_ready : In(1)
        High once the reference clock runs (the Si5324 programmer's ``done``).
    qpll_lock : In(1)
        QPLLLOCK of the GTHE2_COMMON (asynchronous).
    tx_resetdone, rx_resetdone : In(lanes)
        TXRESETDONE / RXRESETDONE of each lane (asynchronous).
    qpll_reset, gttxreset, gtrxreset, userrdy : Out(1)
        To the GTHE2_COMMON (QPLLRESET) and to every channel (GTTXRESET, GTRXRESET, TX/RXUSERRDY).
    tx_ready, rx_ready : Out(1)
        High in READY.
    restarts : Out(8)
        Time-outs and lock losses so far (saturates at 255).
    state : Out(3)
        The state as above, numbered 0-4 in that order (for LEDs and tests).

    Raises
    ------
    ValueError
        If ``clk_hz`` < 1 MHz, ``lanes`` not in 1..4, or a time-out is not positive.
    """

    WAIT_REFCLK, QPLL_RESET, WAIT_QPLL, WAIT_DONE, READY = range(5)

    def __init__(self, clk_hz: int, lanes: int = 1, *, qpll_reset_ns: float = 1000.0,
                 lock_timeout_s: float = 2e-3, done_timeout_s: float = 5e-3):
        with rejecting(self):
            if not isinstance(clk_hz, int) or clk_hz < 1_000_000:
                raise ValueError(f"clk_hz must be an int frequency of at least 1 MHz, not {clk_hz!r}")
            if lanes not in (1, 2, 3, 4):
                raise ValueError(f"lanes must be 1 to 4 (channels of one GTH quad), not {lanes!r}")
            for name, value in (("qpll_reset_ns", qpll_reset_ns), ("lock_timeout_s", lock_timeout_s),
                                ("done_timeout_s", done_timeout_s)):
                if not value > 0:
                    raise ValueError(f"{name} must be positive, not {value!r}")
        self.clk_hz = clk_hz
        self.lanes = lanes
        self.reset_cycles = max(1, round(qpll_reset_ns * 1e-9 * clk_hz))
        self.lock_cycles = max(1, round(lock_timeout_s * clk_hz))
        self.done_cycles = max(1, round(done_timeout_s * clk_hz))
        super().__init__({
            "refclk_ready": In(1), "qpll_lock": In(1),
            "tx_resetdone": In(lanes), "rx_resetdone": In(lanes),
            "qpll_reset": Out(1), "gttxreset": Out(1), "gtrxreset": Out(1),
            "userrdy": Out(1), "tx_ready": Out(1), "rx_ready": Out(1),
            "restarts": Out(8), "state": Out(3),
        })

    def elaborate(self, platform):
        m = Module()
        refclk_ready = Signal()
        lock = Signal()
        txd = Signal(self.lanes)
        rxd = Signal(self.lanes)
        m.submodules.sync_refclk = FFSynchronizer(self.refclk_ready, refclk_ready)
        m.submodules.sync_lock = FFSynchronizer(self.qpll_lock, lock)
        m.submodules.sync_txdone = FFSynchronizer(self.tx_resetdone, txd)
        m.submodules.sync_rxdone = FFSynchronizer(self.rx_resetdone, rxd)
        all_tx = txd.all()
        all_rx = rxd.all()

        timer = Signal(range(max(self.reset_cycles, self.lock_cycles, self.done_cycles) + 1))
        expired = timer == 0

        with m.If(~expired):
            m.d.sync += timer.eq(timer - 1)

        def restart():
            m.d.sync += timer.eq(self.reset_cycles - 1)
            with m.If(self.restarts != 255):
                m.d.sync += self.restarts.eq(self.restarts + 1)

        with m.FSM(init="WAIT_REFCLK") as fsm:
            with m.State("WAIT_REFCLK"):
                m.d.comb += [self.qpll_reset.eq(1), self.gttxreset.eq(1), self.gtrxreset.eq(1),
                             self.state.eq(self.WAIT_REFCLK)]
                with m.If(refclk_ready):
                    m.d.sync += timer.eq(self.reset_cycles - 1)
                    m.next = "QPLL_RESET"
            with m.State("QPLL_RESET"):
                m.d.comb += [self.qpll_reset.eq(1), self.gttxreset.eq(1), self.gtrxreset.eq(1),
                             self.state.eq(self.QPLL_RESET)]
                with m.If(~refclk_ready):
                    m.next = "WAIT_REFCLK"
                with m.Elif(expired):
                    m.d.sync += timer.eq(self.lock_cycles - 1)
                    m.next = "WAIT_QPLL"
            with m.State("WAIT_QPLL"):
                m.d.comb += [self.gttxreset.eq(1), self.gtrxreset.eq(1), self.state.eq(self.WAIT_QPLL)]
                with m.If(~refclk_ready):
                    m.next = "WAIT_REFCLK"
                with m.Elif(lock):
                    m.d.sync += timer.eq(self.done_cycles - 1)
                    m.next = "WAIT_DONE"
                with m.Elif(expired):
                    restart()
                    m.next = "QPLL_RESET"
            with m.State("WAIT_DONE"):
                m.d.comb += [self.userrdy.eq(1), self.state.eq(self.WAIT_DONE)]
                with m.If(~refclk_ready):
                    m.next = "WAIT_REFCLK"
                with m.Elif(~lock | expired):
                    restart()
                    m.next = "QPLL_RESET"
                with m.Elif(all_tx & all_rx):
                    m.next = "READY"
            with m.State("READY"):
                m.d.comb += [self.userrdy.eq(1), self.tx_ready.eq(1), self.rx_ready.eq(1),
                             self.state.eq(self.READY)]
                with m.If(~refclk_ready):
                    m.next = "WAIT_REFCLK"
                with m.Elif(~lock):
                    restart()
                    m.next = "QPLL_RESET"
        self._fsm = fsm
        return m


class GthCommon10G(wiring.Component):
    """Reference clock buffers and the ``GTHE2_COMMON`` (QPLL) of one quad at 10.3125 Gbit/s.

    Parameters
    ----------
    refclk0, refclk1 : DifferentialPort or None
        The MGTREFCLK0/1 pins of the quad (raw ports, ``platform.request(..., dir="-")``); each goes
        through an ``IBUFDS_GTE2`` (UG476 "Reference Clock Input Structure") to GTREFCLK0/1.
    use_refclk1 : bool
        Run the QPLL from GTREFCLK1 (``QPLLREFCLKSEL = 3'b010``) instead of GTREFCLK0 (``3'b001``),
        UG476 "Reference Clock Selection". On the VC709, refclk1 is the SMA input.

    Attributes
    ----------
    qpll_reset : In(1)
        QPLLRESET, active high.
    lockdet_clk : In(1)
        Free-running clock for QPLLLOCKDETCLK and DRPCLK (the system clock).
    qpll_lock : Out(1)
        QPLLLOCK (asynchronous to everything).
    qpll_clk, qpll_refclk : Out(1)
        QPLLOUTCLK / QPLLOUTREFCLK to the channels' QPLLCLK / QPLLREFCLK (dedicated routing).
    refclk_fabric : Out(1)
        The IBUFDS_GTE2 ``O`` of the selected reference clock (156.25 MHz) for a BUFG, if wanted.

    Raises
    ------
    ValueError
        If the selected reference clock port is ``None``.
    """

    def __init__(self, refclk0, refclk1=None, *, use_refclk1: bool = False):
        if (refclk1 if use_refclk1 else refclk0) is None:
            raise ValueError(f"GthCommon10G: refclk{int(use_refclk1)} is selected but no port was given; "
                             f"pass the MGTREFCLK pins from platform.request(..., dir='-')")
        self._refclks = (refclk0, refclk1)
        self._use_refclk1 = use_refclk1
        super().__init__({
            "qpll_reset": In(1), "lockdet_clk": In(1),
            "qpll_lock": Out(1), "qpll_clk": Out(1), "qpll_refclk": Out(1), "refclk_fabric": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        gtrefclk = [Const(0, 1), Const(0, 1)]
        for k, port in enumerate(self._refclks):
            if port is None:
                continue
            clk = Signal(name=f"gtrefclk{k}")
            m.submodules[f"ibufds_gte2_{k}"] = Instance(
                "IBUFDS_GTE2",
                p_CLKCM_CFG="TRUE", p_CLKRCV_TRST="TRUE", p_CLKSWING_CFG=Const(0b11, 2),
                i_I=port.p, i_IB=port.n, i_CEB=Const(0, 1), o_O=clk, o_ODIV2=Signal(name=f"gtrefclk{k}_div2"))
            gtrefclk[k] = clk
        m.d.comb += self.refclk_fabric.eq(gtrefclk[1] if self._use_refclk1 else gtrefclk[0])
        m.submodules.gthe2_common = Instance(
            "GTHE2_COMMON",
            **{f"p_{k}": v for k, v in QPLL_ATTRS.items()},
            i_GTREFCLK0=gtrefclk[0], i_GTREFCLK1=gtrefclk[1],
            i_GTGREFCLK=Const(0, 1), i_GTNORTHREFCLK0=Const(0, 1), i_GTNORTHREFCLK1=Const(0, 1),
            i_GTSOUTHREFCLK0=Const(0, 1), i_GTSOUTHREFCLK1=Const(0, 1),
            i_QPLLREFCLKSEL=Const(0b010 if self._use_refclk1 else 0b001, 3),
            i_QPLLLOCKDETCLK=self.lockdet_clk, i_QPLLLOCKEN=Const(1, 1), i_QPLLPD=Const(0, 1),
            i_QPLLRESET=self.qpll_reset, i_QPLLOUTRESET=Const(0, 1),
            o_QPLLLOCK=self.qpll_lock, o_QPLLOUTCLK=self.qpll_clk, o_QPLLOUTREFCLK=self.qpll_refclk,
            o_QPLLFBCLKLOST=Signal(name="qpll_fbclklost"), o_QPLLREFCLKLOST=Signal(name="qpll_refclklost"),
            i_QPLLRSVD1=Const(0, 16), i_QPLLRSVD2=Const(0b11111, 5),
            i_BGBYPASSB=Const(1, 1), i_BGMONITORENB=Const(1, 1), i_BGPDB=Const(1, 1),
            i_BGRCALOVRD=Const(0b11111, 5), i_PMARSVD=Const(0, 8), i_RCALENB=Const(1, 1),
            i_DRPCLK=self.lockdet_clk, i_DRPEN=Const(0, 1), i_DRPWE=Const(0, 1),
            i_DRPADDR=Const(0, 8), i_DRPDI=Const(0, 16),
        )
        return m


class GthChannel10G(wiring.Component):
    """One ``GTHE2_CHANNEL`` at 10.3125 Gbit/s, raw 32-bit words, on the quad's QPLL.

    Creates clock domains ``gt{n}_tx`` and ``gt{n}_rx`` (322.265625 MHz, from TXOUTCLK/RXOUTCLK
    through a BUFG each, UG476 "TX/RX Fabric Clock Output Control"). Their resets are held until
    ``tx_ready`` / ``rx_ready`` (synchronised with :class:`~amaranth.lib.cdc.ResetSynchronizer`).
    When a platform is given, TXOUTCLK and RXOUTCLK get a ``create_clock`` of 322.265625 MHz.

    Parameters
    ----------
    n : int
        Name of the clock domains (``gt{n}_tx``, ``gt{n}_rx``), e.g. the SFP cage number.
    tx_p, tx_n, rx_p, rx_n : IOPort
        The GTH pins (raw ports; ``platform.request("sfp", n, dir={"tx": "-", "rx": "-", ...})``).
    power_down : bool
        Power the channel down (TXPD = RXPD = 2'b11, UG476 "Power Down"): for a cage that
        is not used but whose pins are placed.
    lpm : bool
        Receive equaliser: LPM (default, short SFP+ optical/DAC links, UG476 "RX Equalizer (DFE and
        LPM)") or DFE.
    domains : bool
        Define the two clock domains here (default). Pass ``False`` when the parent defines
        ``ClockDomain("gt{n}_tx")`` and ``ClockDomain("gt{n}_rx")`` itself because it uses them
        (Amaranth 0.6 will not let a parent use a domain defined in a child); this component still
        drives their clocks and resets.

    Attributes
    ----------
    tx_data : In(32)
        Word to send, domain ``gt{n}_tx``; bit 0 goes first on the line.
    rx_data : Out(32)
        Word received, domain ``gt{n}_rx``; bit 0 arrived first.
    tx_ready, rx_ready : Out(1)
        The quad is initialised and this lane's TX/RXRESETDONE is high (asynchronous to both
        domains; the domain resets follow them).
    qpll_clk, qpll_refclk : In(1)
        From :class:`GthCommon10G`.
    gttxreset, gtrxreset, userrdy, seq_ready : In(1)
        From :class:`GthResetSequencer`.
    tx_resetdone, rx_resetdone : Out(1)
        TXRESETDONE / RXRESETDONE, to the sequencer.
    drp_clk : In(1)
        Free-running clock for DRPCLK / DMONITORCLK.

    Raises
    ------
    ValueError
        If ``n`` is not a non-negative int.
    """

    def __init__(self, n: int, tx_p, tx_n, rx_p, rx_n, *, power_down: bool = False, lpm: bool = True,
                 domains: bool = True):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"GthChannel10G: n must be a non-negative int (the domain suffix), not {n!r}")
        self.n = n
        self._pins = (tx_p, tx_n, rx_p, rx_n)
        self._power_down = power_down
        self._lpm = lpm
        self._domains = domains
        self.tx_domain = f"gt{n}_tx"
        self.rx_domain = f"gt{n}_rx"
        super().__init__({
            "tx_data": In(WORD_BITS), "rx_data": Out(WORD_BITS),
            "tx_ready": Out(1), "rx_ready": Out(1),
            "qpll_clk": In(1), "qpll_refclk": In(1), "drp_clk": In(1),
            "gttxreset": In(1), "gtrxreset": In(1), "userrdy": In(1), "seq_ready": In(1),
            "tx_resetdone": Out(1), "rx_resetdone": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        tx_p, tx_n, rx_p, rx_n = self._pins
        n = self.n
        if self._domains:
            m.domains += [ClockDomain(self.tx_domain), ClockDomain(self.rx_domain)]

        txoutclk = Signal(name=f"gt{n}_txoutclk")
        rxoutclk = Signal(name=f"gt{n}_rxoutclk")
        m.submodules.txusrclk_bufg = Instance("BUFG", i_I=txoutclk, o_O=ClockSignal(self.tx_domain))
        m.submodules.rxusrclk_bufg = Instance("BUFG", i_I=rxoutclk, o_O=ClockSignal(self.rx_domain))
        if platform is not None:
            platform.add_clock_constraint(txoutclk, USRCLK_HZ)
            platform.add_clock_constraint(rxoutclk, USRCLK_HZ)

        m.d.comb += [
            self.tx_ready.eq(self.seq_ready & self.tx_resetdone),
            self.rx_ready.eq(self.seq_ready & self.rx_resetdone),
        ]
        m.submodules.tx_rst = ResetSynchronizer(~self.tx_ready, domain=self.tx_domain)
        m.submodules.rx_rst = ResetSynchronizer(~self.rx_ready, domain=self.rx_domain)

        pd = Const(0b11 if self._power_down else 0b00, 2)
        txdata = Signal(64)
        rxdata = Signal(64)
        m.d.comb += [txdata.eq(Cat(self.tx_data, Const(0, 32))), self.rx_data.eq(rxdata[:32])]
        zero = Const(0, 1)
        m.submodules.gthe2_channel = Instance(
            "GTHE2_CHANNEL",
            **{f"p_{k}": v for k, v in CHANNEL_ATTRS.items()},
            # pins
            o_GTHTXP=tx_p, o_GTHTXN=tx_n, i_GTHRXP=rx_p, i_GTHRXN=rx_n,
            # clocking: both directions on the QPLL (UG476 "Dynamic PLL switching": TX/RXSYSCLKSEL = 2'b11)
            i_QPLLCLK=self.qpll_clk, i_QPLLREFCLK=self.qpll_refclk,
            i_TXSYSCLKSEL=Const(0b11, 2), i_RXSYSCLKSEL=Const(0b11, 2),
            i_CPLLPD=Const(1, 1), i_CPLLRESET=zero, i_CPLLLOCKEN=zero, i_CPLLREFCLKSEL=Const(0b001, 3),
            i_CPLLLOCKDETCLK=self.drp_clk,
            i_GTREFCLK0=zero, i_GTREFCLK1=zero, i_GTGREFCLK=zero,
            i_GTNORTHREFCLK0=zero, i_GTNORTHREFCLK1=zero, i_GTSOUTHREFCLK0=zero, i_GTSOUTHREFCLK1=zero,
            i_TXOUTCLKSEL=Const(0b010, 3), i_RXOUTCLKSEL=Const(0b010, 3),
            o_TXOUTCLK=txoutclk, o_RXOUTCLK=rxoutclk,
            i_TXUSRCLK=ClockSignal(self.tx_domain), i_TXUSRCLK2=ClockSignal(self.tx_domain),
            i_RXUSRCLK=ClockSignal(self.rx_domain), i_RXUSRCLK2=ClockSignal(self.rx_domain),
            # resets (sequential mode, UG476 GTRESETSEL = 0)
            i_GTRESETSEL=zero, i_RESETOVRD=zero,
            i_GTTXRESET=self.gttxreset, i_GTRXRESET=self.gtrxreset,
            i_TXUSERRDY=self.userrdy, i_RXUSERRDY=self.userrdy,
            i_TXPCSRESET=zero, i_TXPMARESET=zero, i_RXPCSRESET=zero, i_RXPMARESET=zero,
            i_RXBUFRESET=zero, i_RXCDRRESET=zero, i_RXDFELPMRESET=zero, i_EYESCANRESET=zero,
            o_TXRESETDONE=self.tx_resetdone, o_RXRESETDONE=self.rx_resetdone,
            o_RXCDRLOCK=Signal(name=f"gt{n}_rxcdrlock"),
            o_RXBUFSTATUS=Signal(3, name=f"gt{n}_rxbufstatus"),
            o_TXBUFSTATUS=Signal(2, name=f"gt{n}_txbufstatus"),
            # data: raw 32 bit, no 8b/10b, no gearbox
            i_TXDATA=txdata, o_RXDATA=rxdata,
            i_TX8B10BEN=zero, i_RX8B10BEN=zero, i_TXCHARISK=Const(0, 8),
            i_TXHEADER=Const(0, 3), i_TXSEQUENCE=Const(0, 7), i_RXGEARBOXSLIP=zero,
            i_RXCOMMADETEN=zero, i_RXMCOMMAALIGNEN=zero, i_RXPCOMMAALIGNEN=zero, i_RXSLIDE=zero,
            i_TXPOLARITY=zero, i_RXPOLARITY=zero, i_TXINHIBIT=zero, i_LOOPBACK=Const(0, 3),
            # power, driver, equaliser
            i_TXPD=pd, i_RXPD=pd,
            i_TXDIFFCTRL=Const(0b1000, 4), i_TXMAINCURSOR=Const(0, 7),
            i_TXPOSTCURSOR=Const(0, 5), i_TXPRECURSOR=Const(0, 5),
            i_RXLPMEN=Const(1 if self._lpm else 0, 1),
            # DRP unused
            i_DRPCLK=self.drp_clk, i_DMONITORCLK=self.drp_clk, i_DRPEN=zero, i_DRPWE=zero,
            i_DRPADDR=Const(0, 9), i_DRPDI=Const(0, 16),
        )
        return m


class GthQuad10G(wiring.Component):
    """A GTH quad at 10.3125 Gbit/s: :class:`GthCommon10G`, channels, one :class:`GthResetSequencer`.

    The sequencer runs in ``sync`` (a free-running clock of ``clk_hz``, rename with
    ``DomainRenamer``) and resets the QPLL and all channels together.

    Parameters
    ----------
    clk_hz : int
        Frequency of ``sync`` in Hz.
    refclk0, refclk1 : DifferentialPort or None
        MGTREFCLK0/1 of the quad (see :class:`GthCommon10G`).
    lanes : dict[int, tuple]
        Domain number → ``(tx_p, tx_n, rx_p, rx_n)`` IOPorts, or ``(tx_p, tx_n, rx_p, rx_n, "off")``
        for a powered-down channel (its RESETDONE flags are still awaited).
    use_refclk1 : bool
        See :class:`GthCommon10G`.
    sequencer_args : dict
        Keyword arguments for :class:`GthResetSequencer` (time-outs).
    domains : bool
        Passed to each :class:`GthChannel10G`.

    Attributes
    ----------
    refclk_ready : In(1)
        The reference clock runs (Si5324 programmed).
    restarts : Out(8), state : Out(3)
        From the sequencer.
    channels : dict[int, GthChannel10G]
        The channels, whose ``tx_data``, ``rx_data``, ``tx_ready`` and ``rx_ready`` the parent uses.

    Raises
    ------
    ValueError
        If ``lanes`` has no entry or more than 4.
    """

    def __init__(self, clk_hz: int, refclk0, refclk1=None, *, lanes: dict, use_refclk1: bool = False,
                 sequencer_args: dict | None = None, domains: bool = True):
        if not 1 <= len(lanes) <= 4:
            raise ValueError(f"a GTH quad has 1 to 4 channels, not {len(lanes)}")
        self.common = GthCommon10G(refclk0, refclk1, use_refclk1=use_refclk1)
        self.sequencer = GthResetSequencer(clk_hz, len(lanes), **(sequencer_args or {}))
        self.channels = {}
        for n, pins in lanes.items():
            off = len(pins) > 4 and pins[4] == "off"
            self.channels[n] = GthChannel10G(n, *pins[:4], power_down=off, domains=domains)
        super().__init__({"refclk_ready": In(1), "restarts": Out(8), "state": Out(3)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.common = common = self.common
        m.submodules.sequencer = seq = self.sequencer
        m.d.comb += [
            seq.refclk_ready.eq(self.refclk_ready),
            seq.qpll_lock.eq(common.qpll_lock),
            common.qpll_reset.eq(seq.qpll_reset),
            common.lockdet_clk.eq(ClockSignal("sync")),
            self.restarts.eq(seq.restarts), self.state.eq(seq.state),
        ]
        for k, (n, ch) in enumerate(self.channels.items()):
            m.submodules[f"channel{n}"] = ch
            m.d.comb += [
                ch.qpll_clk.eq(common.qpll_clk), ch.qpll_refclk.eq(common.qpll_refclk),
                ch.drp_clk.eq(ClockSignal("sync")),
                ch.gttxreset.eq(seq.gttxreset), ch.gtrxreset.eq(seq.gtrxreset),
                ch.userrdy.eq(seq.userrdy), ch.seq_ready.eq(seq.tx_ready),
                seq.tx_resetdone[k].eq(ch.tx_resetdone), seq.rx_resetdone[k].eq(ch.rx_resetdone),
            ]
        return m
