"""Elaboration-time parameters every layer shares: datapath width, MTU, buffer slots, codec.

The MTU travels as one :class:`NodeConfig` from the command line to the gateware, the simulated
network (``EngineSetup.config``, :class:`~wirereduce.config.EngineConfig` extends it) and the host
side (:class:`~wirereduce.host.engine.EngineSession`, which chunks by
:attr:`NodeConfig.max_elements`); :func:`check_mtu` is the only place its range is decided and
:func:`wirereduce.protocol.max_elements` the only place its elements per frame are.
"""

from __future__ import annotations

from dataclasses import dataclass

from wirereduce.formats import FORMATS, check_formats
from wirereduce.protocol import HEADER_BYTES, max_elements

__all__ = ["MTU_MIN", "MTU_MAX", "check_width", "check_mtu", "deep_lanes", "flows_room", "DEEP_LANES_WIDTH",
           "NodeConfig", "EngineConfig", "PRIORITIES", "MAX_LOOKAHEAD", "CODEC_LOOKAHEAD"]

#: Smallest MTU: the 16-byte header and one fp32 element.
MTU_MIN = HEADER_BYTES + 4
#: Largest MTU: the largest jumbo frame every port of the design accepts. The 100G CMAC's
#: ``ctl_rx_max_packet_len`` stops at 16,383 bytes of Ethernet frame (PG203), so 16,000 bytes of
#: payload leave room for the Ethernet header, FCS and a VLAN tag; the 10G MAC and the node's
#: buffer slots are sized from the same number.
MTU_MAX = 16000


def check_mtu(mtu: int) -> int:
    """Validate an MTU in bytes (the wirereduce frame, header + payload = the Ethernet payload).

    Returns it.

    Raises
    ------
    ValueError
        If ``mtu`` is not an int from :data:`MTU_MIN` (20) to :data:`MTU_MAX` (16,000) bytes.
    """
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not MTU_MIN <= mtu <= MTU_MAX:
        raise ValueError(f"mtu must be an int number of bytes from {MTU_MIN} to {MTU_MAX} (the wirereduce frame, "
                         f"i.e. the Ethernet payload; 1500, or 9000 for jumbo frames), not {mtu!r}")
    return mtu


def check_width(width: int) -> int:
    """Validate a datapath width in bits; returns it.

    Raises
    ------
    TypeError
        If ``width`` is not an int.
    ValueError
        If ``width`` is not a power of two between 64 and 1024 (the header's first 8 bytes,
        which hold opcode, src and hop, must sit in beat 0, and fp32 lanes must tile a beat).
    """
    if not isinstance(width, int) or isinstance(width, bool):
        raise TypeError(f"width must be an int number of bits, not {width!r}")
    if width < 64 or width > 1024 or width & (width - 1):
        raise ValueError(f"width must be a power of two from 64 to 1024 bits (64 for 10G, 512 for 100G), "
                         f"not {width}")
    return width


#: Narrowest datapath (bits) whose adder lanes are built deep (:func:`deep_lanes`).
DEEP_LANES_WIDTH = 512


def deep_lanes(width: int) -> bool:
    """Whether the adder lanes of a ``width``-bit datapath are the seven-stage ones (``deep=True`` of
    :class:`~wirereduce.hdl.arith.fp32.FloatAdder`, :class:`~wirereduce.hdl.arith.fp32.AdderLanes` and
    :class:`~wirereduce.hdl.arith.lanes.ReduceLanes`): from :data:`DEEP_LANES_WIDTH` (512) bits up.

    The one place this is decided; the ring node's reduce pipeline and the engine's summation units
    ask it. The rule is the timing budget (docs/architecture.md "Timing budgets"): a 512-bit
    datapath runs at 322.27 MHz on UltraScale+ (≤ 5 LUT levels between registers), where the
    six-stage lanes measure 8; the seven-stage ones measure 5, at one cycle more per adder. A 64-bit
    datapath (156.25 MHz on 7-series, ≤ 9 levels) keeps the six stages. Widths from 128 to 256
    have no clock of their own in this project and keep six stages as well.

    Raises
    ------
    TypeError, ValueError
        As :func:`check_width`.
    """
    return check_width(width) >= DEEP_LANES_WIDTH


def flows_room(flows: int) -> int:
    """The ``max_flows`` an engine gets for a schedule of ``flows`` flows: the smallest power of two
    ≥ ``flows``, at least 8 (table entries, :class:`EngineConfig`)."""
    return max(8, 1 << (flows - 1).bit_length())


@dataclass(frozen=True, repr=False)
class NodeConfig:
    """Elaboration-time parameters of a node (immutable; equal when the parameters are).

    Parameters
    ----------
    width : int
        Datapath width in bits: 64 (10G at 156.25 MHz) or 512 (100G at ~322 MHz).
    mtu : int
        Largest wirereduce frame (header + payload) in bytes, i.e. the Ethernet payload MTU:
        1500 or 9000 (jumbo); :func:`check_mtu` gives the range.
    slots : int
        Chunks of the host's gradient the local buffer holds (power of two, ≥ 1).
    codec : bool
        Put the INCEPTIONN-style codec (``docs/codec.md``) at every port
        (:mod:`wirereduce.hdl.codec.port`): frames with ``codec = INCEPTIONN_V1`` are
        decompressed as they arrive and compressed with their header's ``eb_k`` as they leave,
        so every hop decompresses, adds and recompresses. Default False (no codec logic).

    Raises
    ------
    ValueError, TypeError
        On a bad width (:func:`check_width`), a bad MTU (:func:`check_mtu`), ``slots`` not a power of two or
        ``codec`` not a bool.
    """

    width: int = 64
    mtu: int = 1500
    slots: int = 8
    codec: bool = False

    def __post_init__(self):
        check_width(self.width)
        check_mtu(self.mtu)
        slots = self.slots
        if not isinstance(slots, int) or slots < 1 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, not {slots!r}")
        if not isinstance(self.codec, bool):
            raise TypeError(f"codec must be True or False, not {self.codec!r}")

    @property
    def bytes_per_beat(self) -> int:
        return self.width // 8

    @property
    def deep_lanes(self) -> bool:
        """Whether the adder lanes are built deep (seven stages): :func:`deep_lanes` of the width."""
        return deep_lanes(self.width)

    @property
    def max_beats(self) -> int:
        """Beats of the longest frame."""
        return -(-self.mtu // self.bytes_per_beat)

    @property
    def slot_beats(self) -> int:
        """Beats a buffer slot holds: the longest frame rounded up to a power of two."""
        return 1 << (self.max_beats - 1).bit_length()

    @property
    def max_elements(self) -> int:
        """fp32 elements in the largest frame (:func:`wirereduce.protocol.max_elements` of the MTU)."""
        return max_elements(self.mtu)

    def __repr__(self):
        codec = ", codec=True" if self.codec else ""
        return f"NodeConfig(width={self.width}, mtu={self.mtu}, slots={self.slots}{codec})"


#: Port priorities of :class:`EngineConfig` (who wins a contended output port).
PRIORITIES = ("broadcast", "unit")
#: Largest lookahead of a summation unit (:class:`EngineConfig`): the slot model's range (docs/architecture.md
#: "Why the engine stays at the ring's rate"); each candidate costs its own readiness logic.
MAX_LOOKAHEAD = 4
#: Default lookahead of a codec engine's summation units (``EngineConfig(codec=True)``); 2 without the
#: codec. Measured: docs/codec.md "On the schedule engine"; D = 4 gave the same times as 3.
CODEC_LOOKAHEAD = 3


@dataclass(frozen=True, repr=False)
class EngineConfig(NodeConfig):
    """Elaboration-time parameters of a schedule engine (:mod:`wirereduce.hdl.core.engine`).

    Everything of :class:`NodeConfig` (``codec``: a
    :class:`~wirereduce.hdl.codec.port.CodecIn` behind the host port and every network input and a
    :class:`~wirereduce.hdl.codec.port.CodecOut` in front of every output, as on the ring node, so
    every hop of a compressed collective decompresses, sums and recompresses; docs/codec.md
    "On the schedule engine"), plus:

    Parameters
    ----------
    ports : int
        Network ports P, 1 … 6 (:data:`wirereduce.table.MAX_PORTS`): 2 for a ring, 4 for a 2-D
        torus, 3 for a hypercube of 8.
    max_flows : int
        Table entries (flows) the engine holds, a power of two ≤ 256.
    priority : {"auto", "broadcast", "unit"}
        Who wins an output port two frames want at once (each port's fixed order between its
        output queue and its unit): ``"broadcast"`` the output queue (the root's results and
        forwarded BROADCAST frames) first, then the summation unit's partial sums; ``"unit"`` the
        partial sums first; ``"auto"`` (default)
        becomes ``"unit"`` for ``ports`` ≤ 2 (rings) and ``"broadcast"`` above (tori, meshes,
        hypercubes). Results never depend on it, only the time. In the slot model
        (docs/architecture.md "Balanced trees and broadcasts first") broadcasts first is much
        faster on tori and meshes (4x4 torus, balanced trees: 0.94 of the busiest link's bound
        against 0.70) and slightly slower on rings; measured on ring:4 biring at 4 MiB it gives
        12.30 Gbit/s against 12.85 with units first.
    lookahead : int or None
        Chunks D, 1 … :data:`MAX_LOOKAHEAD` (4), each summation unit may choose from: the D oldest
        of its order it has not summed; it takes the first that is ready
        (:class:`~wirereduce.hdl.core.sumunit.SumUnit`). 1 is strictly in order. Default (None):
        :data:`CODEC_LOOKAHEAD` (3) with the codec, 2 without. Results never depend on it, only
        the time: in the slot model (``slot_model(..., lookahead=D)``, 32 rounds) D = 3 lifts the
        4x4 torus with ``multitree-balanced`` trees and broadcasts first from 0.94 to 0.98 of its
        busiest link's bound, but on the engine (32 slots, 1 MiB) D = 3 gave 17.05 Gbit/s and
        D = 2 17.01: the same within 0.2 %. With the codec every hop stores a frame (twice until 2026-12-01), the
        children's frames of a unit's oldest chunk come late, and D = 3 pays: ring:4 ``biring``,
        1 MiB, k = 8, 16 slots, 50G hosts took 156,141 cycles against 216,392 with D = 2
        (docs/codec.md "On the schedule engine").
    formats : tuple of str
        Element formats the summation units' reduce lanes
        (:class:`~wirereduce.hdl.arith.lanes.ReduceLanes`) are built for: names of
        :data:`wirereduce.formats.FORMATS`, each once, ``"fp32"`` always among them
        (:func:`wirereduce.formats.check_formats`; kept in ``FORMATS`` order). Default all four.
        Each format costs, per 32-bit payload word of each of the engine's P² lane sets (P − 1
        per parent-port unit, P for the root unit), its adders (fp32 one binary32 adder, bf16 and
        fp16 two 16-bit float adders, int32 one 32-bit integer adder) and its MAX/MIN comparator,
        plus a leg of the output select. A CONTROL whose ``dtype`` byte names another format is
        refused (``control_refused``), so no frame of it reaches the lanes, and the host side
        (:class:`~wirereduce.host.engine.EngineSession`) refuses arrays of it before sending anything.

    The receive queues of every network port hold 2·``slots`` REDUCE frames and ``slots``
    BROADCAST frames: with the driver's window ≤ ``slots`` they can never overflow
    (docs/architecture.md "Why the engine cannot deadlock").

    Raises
    ------
    ValueError, TypeError
        Everything :class:`NodeConfig` raises; ``ports``, ``max_flows`` or ``lookahead`` out of range;
        ``formats`` (:func:`~wirereduce.formats.check_formats`).
    """

    ports: int = 4
    max_flows: int = 64
    priority: str = "auto"
    lookahead: int | None = None
    formats: tuple[str, ...] = tuple(FORMATS)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.ports, int) or isinstance(self.ports, bool) or not 1 <= self.ports <= 6:
            raise ValueError(f"ports must be an int from 1 to 6, not {self.ports!r}")
        f = self.max_flows
        if not isinstance(f, int) or isinstance(f, bool) or f < 1 or f > 256 or f & (f - 1):
            raise ValueError(f"max_flows must be a power of two from 1 to 256, not {f!r}")
        if self.priority not in PRIORITIES + ("auto",):
            raise ValueError(f"priority must be one of 'auto', {', '.join(map(repr, PRIORITIES))}, "
                             f"not {self.priority!r}")
        if self.priority == "auto":
            object.__setattr__(self, "priority", "unit" if self.ports <= 2 else "broadcast")
        if self.lookahead is None:
            object.__setattr__(self, "lookahead", CODEC_LOOKAHEAD if self.codec else 2)
        d = self.lookahead
        if not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be an int from 1 to {MAX_LOOKAHEAD} (chunks a summation unit "
                             f"may choose from), not {d!r}")
        object.__setattr__(self, "formats", check_formats(self.formats))   # frozen: the canonical order

    def __repr__(self):
        formats = f", formats={self.formats!r}" if self.formats != tuple(FORMATS) else ""
        codec = ", codec=True" if self.codec else ""
        return (f"EngineConfig(width={self.width}, ports={self.ports}, mtu={self.mtu}, slots={self.slots}, "
                f"max_flows={self.max_flows}, priority={self.priority!r}, lookahead={self.lookahead}{formats}"
                f"{codec})")
