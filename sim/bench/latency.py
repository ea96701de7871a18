"""Per-hop latency of the schedule engine, measured in ``amaranth.sim``.

The figure is the ``L_red`` / ``L_bc`` node term of the time model in ``docs/architecture.md``
(without the link): how long a frame's head spends inside one engine on its way through.
"""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from wirereduce.protocol import Header, Opcode, frame, max_elements

__all__ = ["hop_latency", "engine_hop_latency", "PATHS"]

#: Paths :func:`engine_hop_latency` measures: a reduce hop (children's partial sums in, the sum out
#: to the parent) and a broadcast hop (the result in from the parent, forwarded to a child).
PATHS = {"reduce": Opcode.REDUCE, "broadcast": Opcode.BROADCAST}

_COLLECTIVE = 1
_RANK = 1
_TIMEOUT = 2000


def _beats(data: bytes, width: int):
    b = width // 8
    for off in range(0, len(data), b):
        part = data[off:off + b]
        yield int.from_bytes(part.ljust(b, b"\0"), "little"), (1 << len(part)) - 1, int(off + b >= len(data))


def hop_latency(width: int = 64, mtu: int = 1500, path: str = "reduce") -> int:
    """Cut-through latency of one ring hop, in clock cycles: :func:`engine_hop_latency` of the P = 2
    engine (the ring's, what every board top carries) summing two terms on a reduce hop (its local
    chunk and its neighbour's partial sum), or forwarding a BROADCAST frame; first beat accepted on
    the input to first beat valid on the output, no link. The ``L_red`` / ``L_bc`` node term of the
    time model in ``docs/architecture.md``.

    Raises
    ------
    ValueError
        ``path`` not ``"reduce"`` or ``"broadcast"``, a bad width or MTU.
    RuntimeError
        If the frame does not come out within 2000 cycles.
    """
    return engine_hop_latency(width, ports=2, terms=2, path=path, mtu=mtu)


def engine_hop_latency(width: int = 64, ports: int = 4, terms: int = 2, path: str = "reduce", mtu: int = 1500,
                       codec: bool = False) -> int:
    """Cut-through latency of one hop through the schedule engine (:mod:`wirereduce.hdl.core.engine`),
    in clock cycles: first beat accepted on the input to first beat valid on the output; no link.

    A lone ``Engine(EngineConfig(width, mtu, ports=ports))`` is loaded with a one-flow table. For
    ``"reduce"`` the node sums ``terms`` terms — the local chunk and ``terms - 1`` children's
    frames, which arrive on ports 0, 2, 3, … in the same cycle — and sends the sum on port 1; for
    ``"broadcast"`` the node first sends its local chunk as the partial sum on port 0 (to its parent),
    then the result, a BROADCAST frame, arrives on port 0 and is forwarded on port 1 (and delivered
    to the host). ``codec``: an engine with the codec at its ports (``EngineConfig(codec=True)``),
    the frames uncompressed (they pass its ``CodecIn`` and ``CodecOut`` untransformed).

    Raises
    ------
    ValueError
        ``path`` unknown, ``terms`` not 2 … ``ports`` (port 1 is the parent), bad width or MTU.
    RuntimeError
        If the frame does not come out within 2000 cycles.
    """
    from wirereduce.hdl.core.engine import Engine

    from wirereduce.config import EngineConfig
    from wirereduce.table import LOCAL, EngineEntry, encode_entry

    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, not {path!r}")
    if ports < 2 or not 2 <= terms <= ports:
        raise ValueError(f"terms must be 2 … ports ({ports}) and ports ≥ 2, not terms={terms}")
    cfg = EngineConfig(width, mtu, slots=8, ports=ports, max_flows=8, codec=bool(codec))
    children = [p for p in range(ports) if p != 1][:terms - 1]
    if path == "reduce":
        entry = EngineEntry(1, tuple(children) + (LOCAL,), 0, 1, 0, True)
        ins = children
    else:
        entry = EngineEntry(0, (LOCAL,), 0, 1, 0b10, True)
        ins = [0]
    n = min(16, max_elements(mtu))
    local = np.arange(1, n + 1, dtype=np.float32)
    incoming = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    dut = Engine(cfg)
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
        for p in range(ports):
            ctx.set(getattr(dut, f"net{p}_out").ready, 1)
        sched = Header(opcode=Opcode.SCHEDULE, seq=0, count=2)
        await send(ctx, dut.host_rx, sched.pack() + encode_entry(entry).to_bytes(8, "little"))
        await ctx.tick().repeat(40)
        control = Header(opcode=Opcode.CONTROL, collective=_COLLECTIVE, src=_RANK, hop=1, seq=1)
        await send(ctx, dut.host_rx, control.pack())
        await ctx.tick().repeat(40)
        # the local chunk: the term of the reduce hop; for the broadcast hop, the partial sum the
        # node sends to its parent on port 0 first (a result is taken only for a chunk whose partial
        # sum is out: docs/protocol.md "Schedule engine frames")
        push = Header(opcode=Opcode.HOST_PUSH, collective=_COLLECTIVE, seq=0, count=n, src=_RANK)
        await send(ctx, dut.host_rx, frame(push, local))
        await ctx.tick().repeat(8 if path == "reduce" else 200)
        seen["go"] = True

    async def net(ctx):
        port_out = dut.net1_out
        while "go" not in seen:
            await ctx.tick()
        opcode = Opcode.REDUCE if path == "reduce" else Opcode.BROADCAST
        hdr = Header(opcode=opcode, collective=_COLLECTIVE, seq=0, count=n, src=_RANK - 1)
        beats = list(_beats(frame(hdr, incoming), width))
        port_ins = [getattr(dut, f"net{p}_in") for p in ins]

        def put(k):
            for pin in port_ins:
                word, keep, last = beats[k]
                ctx.set(pin.payload.data, word)
                ctx.set(pin.payload.keep, keep)
                ctx.set(pin.payload.last, last)
                ctx.set(pin.valid, 1)

        put(0)
        cycle, accepted, k = 0, None, 0
        while cycle < _TIMEOUT:
            _, _, ready, out_valid = await ctx.tick().sample(port_ins[0].ready, port_out.valid)
            if k < len(beats) and ready:   # every child port takes its beats in the same cycles
                if k == 0:
                    accepted = cycle
                k += 1
                if k < len(beats):
                    put(k)
                else:
                    for pin in port_ins:
                        ctx.set(pin.valid, 0)
            if out_valid:
                seen["latency"] = cycle - accepted
                break
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host)
    sim.add_testbench(net)
    sim.run()
    if "latency" not in seen:
        raise RuntimeError(f"no frame on net1_out within {_TIMEOUT} cycles ({path}, width {width}, {terms} terms)")
    return seen["latency"]
