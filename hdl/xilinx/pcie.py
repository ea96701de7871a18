"""PCIe host link glue: the Xilinx XDMA's AXI4-Stream channels to an engine's host port.

The host reaches a VC709 over PCIe Gen3 x8 through Xilinx's DMA/Bridge Subsystem for PCI Express
(``xdma``, PG195) on the Virtex-7 Gen3 integrated block, generated in AXI4-Stream mode with one
host-to-card (H2C) and one card-to-host (C2H) channel, 256 bit at 250 MHz (``axi_aclk``; the board
build's :func:`wirereduce.boards.xdma_ip.xdma_ip_tcl`). The DMA streams carry whole wirereduce
frames, header first, with no Ethernet header: one AXI4-Stream packet (``tlast`` on its last beat)
per frame, byte ``k`` of a beat in ``tdata[8*k : 8*k+8]``, ``tkeep`` marking the valid bytes.

Blocks
------
:class:`AxisSignature`
    One XDMA AXI4-Stream channel (``tdata``/``tkeep``/``tlast``/``tvalid``/``tready``).
:class:`XdmaHostGlue`
    H2C: ``h2c`` (AXI4-Stream, ``pcie`` domain) → :class:`~amaranth.lib.fifo.AsyncFIFO` →
    :class:`~wirereduce.hdl.stream.widthconv.StreamDownsizer` → ``host_rx``
    (``FrameStream(width)``, ``sync``). C2H: ``host_tx`` (``sync``) →
    :class:`~wirereduce.hdl.stream.widthconv.StreamUpsizer` → ``AsyncFIFO`` → ``c2h`` (``pcie``).
    Both reduce to wires where the engine's host port is as wide as the DMA streams (256 bit,
    the VC709 PCIe top), leaving only the clock crossing.
:class:`Xdma`
    Black-box :class:`~amaranth.hdl.Instance` of the generated ``xdma`` core (the port names of
    its instantiation template for this configuration).

Sources: PG195 (DMA/Bridge Subsystem for PCI Express), "AXI4-Stream Interface" and the port list
of the ``xdma_0`` instantiation template (7-series Gen3, AXI-ST, one channel each way);
ARM IHI 0051 (AMBA AXI4-Stream: ``tkeep``, ``tlast``, the handshake).
"""

from __future__ import annotations

from amaranth import Const, Instance, Module, Signal
from amaranth.hdl import IOPort, ResetInserter
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout
from wirereduce.hdl.stream.widthconv import StreamDownsizer, StreamUpsizer, check_ratio

from wirereduce.config import check_width

__all__ = ["XDMA_WIDTH", "XDMA_LANES", "AXI_ACLK_HZ", "AxisSignature", "XdmaHostGlue", "Xdma"]

#: Width of the XDMA's AXI4-Stream data buses in bits for Gen3 x8 (PG195: 256 bit at 250 MHz).
XDMA_WIDTH = 256
#: PCIe lanes.
XDMA_LANES = 8
#: Frequency of ``axi_aclk`` (the ``pcie`` domain), Hz.
AXI_ACLK_HZ = 250_000_000


class AxisSignature(wiring.Signature):
    """One XDMA AXI4-Stream channel, as its source drives it (``m_axis_h2c_*`` of the XDMA;
    ``s_axis_c2h_*`` flipped).

    Members
    -------
    tdata : Out(width)
        Byte ``k`` of the beat is ``tdata[8*k : 8*k+8]``.
    tkeep : Out(width // 8)
        Valid bytes: all ones but on the last beat of a packet, where they are contiguous from 0.
    tlast : Out(1)
        Last beat of a packet (one packet = one wirereduce frame).
    tvalid : Out(1)
    tready : In(1)

    Parameters
    ----------
    width : int
        Data bits, a power of two from 64 to 1024 (:func:`wirereduce.config.check_width`).
    """

    def __init__(self, width: int = XDMA_WIDTH):
        self.width = check_width(width)
        super().__init__({"tdata": Out(width), "tkeep": Out(width // 8), "tlast": Out(1),
                          "tvalid": Out(1), "tready": In(1)})

    def __eq__(self, other):
        return type(other) is AxisSignature and other.width == self.width

    def __hash__(self):
        return hash((AxisSignature, self.width))

    def __repr__(self):
        return f"AxisSignature({self.width})"


class XdmaHostGlue(wiring.Component):
    """The XDMA's two AXI4-Stream channels (``pcie`` domain) to an engine's host port (``sync``).

    **H2C** (host → engine): beats of ``h2c`` are written as they come into an ``AsyncFIFO``
    (``pcie`` → ``sync``, ``fifo_depth`` beats of ``axis_width`` bits with ``tkeep``/``tlast``),
    read in ``sync`` by a :class:`StreamDownsizer` onto ``host_rx``. ``h2c.tready`` is the FIFO's
    ``w_rdy``: the engine back-pressures the DMA, nothing is dropped. ``bad`` is 0 (the DMA has no
    error flag on a stream).

    **C2H** (engine → host): ``host_tx`` beats are packed by a :class:`StreamUpsizer` in ``sync``
    and written into an ``AsyncFIFO`` (``sync`` → ``pcie``) whose output is ``c2h``; ``tkeep`` and
    ``tlast`` are kept. The engine sends no frame marked ``bad`` (its host FIFOs discard a result
    that went bad on a cable, :class:`~wirereduce.hdl.core.engine.PacketFifo`); one that came
    marked ``bad`` all the same would go to the host whole (the stream has no error flag), so
    ``c2h_bad`` (``sync``) pulses with its last beat for it to be counted.

    Resets: a ``pcie`` reset (``~axi_aresetn``, the link went down) empties the H2C FIFO (the
    ``AsyncFIFO`` write-domain reset, which reaches its read side as ``r_rst``, and resets the
    downsizer with it): a frame some of whose beats already left on ``host_rx`` is ended with
    one more beat, ``last`` and ``bad`` with ``keep`` 0, so the engine drops it as a cut-through
    frame found bad and the next frame starts clean (the DMA transfer it belonged to failed
    anyway). The
    C2H FIFO keeps what it holds (its read domain is ``pcie``; ``AsyncFIFO`` leaves the data on a
    read-domain reset) and delivers it when the link is back.

    Parameters
    ----------
    width : int
        The engine's host port width in bits (256 on the VC709 PCIe top: a plain crossing), ≤ ``axis_width``.
    axis_width : int
        The XDMA stream width in bits (:data:`XDMA_WIDTH`, 256).
    fifo_depth : int
        Entries of each ``AsyncFIFO`` (``axis_width``-bit beats), a power of two ≥ 4 (default 64:
        2 KiB; any depth is correct, the depth only sets how much of the clock ratio's jitter
        the crossing absorbs).

    Attributes
    ----------
    h2c : In(AxisSignature(axis_width)), in ``pcie``
        The XDMA's ``m_axis_h2c_*_0``.
    c2h : Out(AxisSignature(axis_width)), in ``pcie``
        To the XDMA's ``s_axis_c2h_*_0``.
    host_rx : Out(FrameStream(width)), in ``sync``
        To the engine's ``host_rx``.
    host_tx : In(FrameStream(width)), in ``sync``
        From the engine's ``host_tx``.
    c2h_bad : Out(1), in ``sync``
        One-cycle pulse per C2H frame whose last beat was marked ``bad``.

    Raises
    ------
    TypeError, ValueError
        On a bad width, ``width > axis_width``, or a ``fifo_depth`` that is not a power of two ≥ 4.
    """

    def __init__(self, width: int = 64, axis_width: int = XDMA_WIDTH, fifo_depth: int = 64):
        with rejecting(self):
            check_ratio(axis_width, width)
            if (not isinstance(fifo_depth, int) or isinstance(fifo_depth, bool) or fifo_depth < 4
                    or fifo_depth & (fifo_depth - 1)):
                raise ValueError(f"fifo_depth must be a power of two ≥ 4, not {fifo_depth!r}")
        self.width, self.axis_width, self.fifo_depth = width, axis_width, fifo_depth
        super().__init__({
            "h2c": In(AxisSignature(axis_width)),
            "c2h": Out(AxisSignature(axis_width)),
            "host_rx": Out(FrameStream(width)),
            "host_tx": In(FrameStream(width)),
            "c2h_bad": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.axis_width
        wide = beat_layout(aw)

        # --- H2C: pcie -> AsyncFIFO -> downsizer (sync) -> host_rx
        m.submodules.h2c_fifo = h2c_fifo = fifo.AsyncFIFO(width=wide.size, depth=self.fifo_depth,
                                                          r_domain="sync", w_domain="pcie")
        h2c_in = Signal(wide)
        m.d.comb += [
            h2c_in.data.eq(self.h2c.tdata), h2c_in.keep.eq(self.h2c.tkeep), h2c_in.last.eq(self.h2c.tlast),
            h2c_fifo.w_data.eq(h2c_in), h2c_fifo.w_en.eq(self.h2c.tvalid), self.h2c.tready.eq(h2c_fifo.w_rdy),
        ]
        down = StreamDownsizer(aw, self.width)
        # a pcie reset empties the FIFO (r_rst, also high for a while after start-up): nothing
        # passes while it is high, and the next beat starts at sub-beat 0
        m.submodules.h2c_down = ResetInserter(h2c_fifo.r_rst)(down)
        m.d.comb += [down.i.payload.eq(h2c_fifo.r_data), down.i.valid.eq(h2c_fifo.r_rdy & ~h2c_fifo.r_rst),
                     h2c_fifo.r_en.eq(down.i.ready & ~h2c_fifo.r_rst)]
        # A frame cut by a pcie reset after some of its beats left is ended with one more beat:
        # last = 1, bad = 1, keep = 0 (FrameStream's "turned out bad after its first beats had
        # already been passed on"), so it cannot run into the next frame.
        mid = Signal()          # a frame is part-way out on host_rx
        abort = Signal()        # the terminating beat is due
        ending = Signal()
        m.d.comb += ending.eq(abort | (h2c_fifo.r_rst & mid))
        rx = self.host_rx
        with m.If(ending):
            m.d.comb += [rx.valid.eq(1), rx.payload.last.eq(1), rx.payload.bad.eq(1), rx.payload.keep.eq(0)]
        with m.Else():
            m.d.comb += [rx.valid.eq(down.o.valid), rx.payload.eq(down.o.payload), down.o.ready.eq(rx.ready)]
        with m.If(h2c_fifo.r_rst & mid):
            m.d.sync += abort.eq(1)
        with m.If(rx.valid & rx.ready):
            m.d.sync += [mid.eq(~rx.payload.last), abort.eq(0)]

        # --- C2H: host_tx -> upsizer (sync) -> AsyncFIFO -> pcie
        m.submodules.c2h_up = up = StreamUpsizer(aw, self.width)
        wiring.connect(m, wiring.flipped(self.host_tx), up.i)
        m.d.comb += self.c2h_bad.eq(self.host_tx.valid & self.host_tx.ready & self.host_tx.payload.last
                                    & self.host_tx.payload.bad)
        m.submodules.c2h_fifo = c2h_fifo = fifo.AsyncFIFO(width=wide.size, depth=self.fifo_depth,
                                                          r_domain="pcie", w_domain="sync")
        m.d.comb += [c2h_fifo.w_data.eq(up.o.payload), c2h_fifo.w_en.eq(up.o.valid), up.o.ready.eq(c2h_fifo.w_rdy)]
        c2h_out = data.View(wide, c2h_fifo.r_data)
        m.d.comb += [
            self.c2h.tdata.eq(c2h_out.data), self.c2h.tkeep.eq(c2h_out.keep), self.c2h.tlast.eq(c2h_out.last),
            self.c2h.tvalid.eq(c2h_fifo.r_rdy), c2h_fifo.r_en.eq(self.c2h.tready),
        ]
        return m


class Xdma(wiring.Component):
    """The Vivado-generated ``xdma`` core (PG195) as a black-box :class:`~amaranth.hdl.Instance`.

    The IP must be generated as :func:`wirereduce.boards.xdma_ip.xdma_ip_tcl` writes it: 7-series
    Gen3 integrated block ``X0Y1`` (the GTH quads 114/115 the VC709's edge connector is wired to),
    Gen3 x8, AXI4-Stream, one H2C and one C2H channel, 256 bit at 250 MHz, no AXI4-Lite master,
    no configuration-management port, one user interrupt. The ports below are those of its
    instantiation template for that configuration.

    Clocks: ``sys_clk`` is the 100 MHz PCIe reference clock after an ``IBUFDS_GTE2`` (``ODIV2``
    unused); ``axi_aclk`` (250 MHz, from the core's PIPE clocking) clocks both streams and is
    exposed as ``aclk`` for the ``pcie`` domain, with ``aresetn`` (active low).

    Parameters
    ----------
    ip_name : str
        Module name of the generated IP (``xdma_0``).
    pads : object or None
        The edge connector's pins, with IO values ``rx.p``, ``rx.n`` (8 lanes, in), ``tx.p``,
        ``tx.n`` (8 lanes, out), as ``platform.request("pcie_x8", 0, dir={"rx": "-", "tx": "-"})``
        returns them; connected without buffers (GT pins). ``None`` makes top-level ports
        ``<ip_name>_pci_exp_*`` for conversion in tests.

    Attributes
    ----------
    sys_clk : In(1)
        100 MHz reference clock (from ``IBUFDS_GTE2`` ``O``).
    sys_rst_n : In(1)
        PERST# from the slot (active low).
    h2c : Out(AxisSignature(256)), in ``aclk``
    c2h : In(AxisSignature(256)), in ``aclk``
    aclk, aresetn : Out(1)
        ``axi_aclk`` / ``axi_aresetn``.
    link_up : Out(1)
        ``user_lnk_up``.
    """

    def __init__(self, ip_name: str = "xdma_0", pads=None):
        with rejecting(self):
            if not isinstance(ip_name, str) or not ip_name.isidentifier():
                raise ValueError(f"ip_name must be the Verilog module name of the generated IP, not {ip_name!r}")
        self.ip_name = ip_name
        if pads is None:
            class _Pair:
                def __init__(self, name, width):
                    self.p = IOPort(width, name=f"{name}p")
                    self.n = IOPort(width, name=f"{name}n")

            class _Pads:
                rx = _Pair(f"{ip_name}_pci_exp_rx", XDMA_LANES)
                tx = _Pair(f"{ip_name}_pci_exp_tx", XDMA_LANES)
            pads = _Pads()
        self.pads = pads
        super().__init__({
            "sys_clk": In(1), "sys_rst_n": In(1),
            "h2c": Out(AxisSignature(XDMA_WIDTH)), "c2h": In(AxisSignature(XDMA_WIDTH)),
            "aclk": Out(1), "aresetn": Out(1), "link_up": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        pads = self.pads
        m.submodules.core = Instance(
            self.ip_name,
            ("i", "pci_exp_rxp", pads.rx.p), ("i", "pci_exp_rxn", pads.rx.n),
            ("o", "pci_exp_txp", pads.tx.p), ("o", "pci_exp_txn", pads.tx.n),
            i_sys_clk=self.sys_clk,
            i_sys_rst_n=self.sys_rst_n,
            o_user_lnk_up=self.link_up,
            o_axi_aclk=self.aclk,
            o_axi_aresetn=self.aresetn,
            i_usr_irq_req=Const(0, 1),
            o_m_axis_h2c_tdata_0=self.h2c.tdata, o_m_axis_h2c_tkeep_0=self.h2c.tkeep,
            o_m_axis_h2c_tlast_0=self.h2c.tlast, o_m_axis_h2c_tvalid_0=self.h2c.tvalid,
            i_m_axis_h2c_tready_0=self.h2c.tready,
            i_s_axis_c2h_tdata_0=self.c2h.tdata, i_s_axis_c2h_tkeep_0=self.c2h.tkeep,
            i_s_axis_c2h_tlast_0=self.c2h.tlast, i_s_axis_c2h_tvalid_0=self.c2h.tvalid,
            o_s_axis_c2h_tready_0=self.c2h.tready,
        )
        return m
