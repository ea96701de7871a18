"""Per-hop latency of one node, measured in ``amaranth.sim``.

The figure is the ``L_red`` / ``L_bc`` node term of the time model in ``docs/architecture.md``
(without the link): how long a frame's head spends inside a middle rank of the ring.
"""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator
from wirereduce.hdl.core.node import Node

from wirereduce.config import NodeConfig, check_width
from wirereduce.protocol import Header, Opcode, frame, max_elements

__all__ = ["hop_latency", "PATHS"]

#: Paths :func:`hop_latency` measures: input port, output port and opcode of the frame.
PATHS = {
    "reduce": ("cw_in", "cw_out", Opcode.REDUCE),
    "broadcast": ("ccw_in", "ccw_out", Opcode.BROADCAST),
}

_COLLECTIVE = 1
_RANK, _NODES = 1, 3
_TIMEOUT = 2000


def _beats(data: bytes, width: int):
    b = width // 8
    for off in range(0, len(data), b):
        part = data[off:off + b]
        yield int.from_bytes(part.ljust(b, b"\0"), "little"), (1 << len(part)) - 1, int(off + b >= len(data))


def hop_latency(width: int = 64, mtu: int = 1500, path: str = "reduce") -> int:
    """Cut-through latency of one ring hop through a middle rank, in clock cycles.

    A lone :class:`~wirereduce.hdl.core.node.Node` (``NodeConfig(width, mtu, slots=8)``) is configured
    by a CONTROL frame as rank 1 of 3, and its host pushes the local chunk. Then one frame of
    16 elements (fewer if the MTU allows fewer) enters the ring input, with every output's
    ``ready`` held high. The result is the number of clock cycles from the edge on which the
    frame's first beat is accepted on the input (``valid`` and ``ready`` both high) to the edge
    on which the first beat of that frame is ``valid`` on the output: 0 would be a combinational
    path, 1 a single register. It includes the frame gate and, for ``"reduce"``, the reduce
    pipeline (buffer read and fp32 adders); it excludes any link, MAC or PHY. It does not depend
    on the frame length, since beats are forwarded while the frame is still arriving.

    Parameters
    ----------
    width : int
        Datapath width in bits: 64 (10G) or 512 (100G); any width
        :func:`~wirereduce.hdl.stream.frame.check_width` accepts.
    mtu : int
        Largest frame in bytes (1500 or 9000), as for :class:`~wirereduce.hdl.core.node.NodeConfig`.
    path : str
        ``"reduce"``: REDUCE frame, ``cw_in`` → ``cw_out`` (the local chunk is added);
        ``"broadcast"``: BROADCAST frame, ``ccw_in`` → ``ccw_out`` (also delivered to the host).

    Returns
    -------
    int
        Latency in clock cycles of the datapath clock (6.4 ns at 64 bit / 156.25 MHz,
        about 3.1 ns at 512 bit / 322 MHz).

    Raises
    ------
    ValueError
        If ``path`` is not ``"reduce"`` or ``"broadcast"``, if ``width`` is not a supported
        datapath width, or if ``mtu`` is out of range.
    RuntimeError
        If the frame does not come out within 2000 cycles.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, not {path!r}")
    try:
        check_width(width)
    except TypeError as e:
        raise ValueError(str(e)) from None
    cfg = NodeConfig(width, mtu, slots=8)
    in_name, out_name, opcode = PATHS[path]
    n = min(16, max_elements(mtu))
    local = np.arange(1, n + 1, dtype=np.float32)
    incoming = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    dut = Node(cfg)
    seen = {}

    async def send(ctx, port, data):
        for word, keep, last in _beats(data, width):
            ctx.set(port.payload.data, word)
            ctx.set(port.payload.keep, keep)
            ctx.set(port.payload.last, last)
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def host(ctx):
        ctx.set(dut.host_tx.ready, 1)
        control = Header(opcode=Opcode.CONTROL, collective=_COLLECTIVE, src=_RANK, hop=_NODES, seq=1)
        await send(ctx, dut.host_rx, control.pack())
        push = Header(opcode=Opcode.HOST_PUSH, collective=_COLLECTIVE, seq=0, count=n, src=_RANK)
        await send(ctx, dut.host_rx, frame(push, local))
        await ctx.tick().repeat(8)  # the STATS answer and the pushed chunk settle
        seen["go"] = True

    async def ring(ctx):
        port_in, port_out = getattr(dut, in_name), getattr(dut, out_name)
        ctx.set(port_out.ready, 1)
        while "go" not in seen:
            await ctx.tick()
        hdr = Header(opcode=opcode, collective=_COLLECTIVE, seq=0, count=n, src=_RANK - 1, hop=1)
        beats = list(_beats(frame(hdr, incoming), width))
        word, keep, last = beats[0]
        ctx.set(port_in.payload.data, word)
        ctx.set(port_in.payload.keep, keep)
        ctx.set(port_in.payload.last, last)
        ctx.set(port_in.valid, 1)
        cycle, accepted, k = 0, None, 0
        while cycle < _TIMEOUT:
            _, _, ready, out_valid = await ctx.tick().sample(port_in.ready, port_out.valid)
            if k < len(beats) and ready:
                if k == 0:
                    accepted = cycle
                k += 1
                if k < len(beats):
                    word, keep, last = beats[k]
                    ctx.set(port_in.payload.data, word)
                    ctx.set(port_in.payload.keep, keep)
                    ctx.set(port_in.payload.last, last)
                else:
                    ctx.set(port_in.valid, 0)
            if out_valid:
                if accepted is None:
                    raise RuntimeError(f"{out_name} was valid before {in_name} took the frame")
                seen["latency"] = cycle - accepted
                break
            cycle += 1
        ctx.set(port_in.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host)
    sim.add_testbench(ring)
    sim.run()
    if "latency" not in seen:
        raise RuntimeError(f"no frame on {out_name} within {_TIMEOUT} cycles ({path}, width {width})")
    return seen["latency"]
