"""Hostile and malformed frames for the fuzz suite: a seeded generator and what each must cost.

A :class:`FuzzCase` is one frame injected into one port of one node while a collective runs
(:mod:`wirereduce.sim.fuzz.cocotb_engine_fuzz`), built from the collective it lands in (:func:`build_frame`)
so that it fails exactly the check its ``kind`` names. The suite's oracle
(:func:`wirereduce.sim.fuzz.run.judge`) then asks of every case: no hang; no host holds a wrong
value (every result chunk is the golden sum or reported missing); the frame is counted in the
counters :data:`EXPECTED` names for its kind at the node it hit; and a fresh collective afterwards
is bit-exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from wirereduce.protocol import HEADER_BYTES, Codec, DType, Flag, Header, Opcode, frame

__all__ = ["KINDS", "EXPECTED", "FuzzCase", "make_cases", "build_frame", "engine_ports", "engine_routes",
           "case_inputs"]

#: What each kind of frame must be counted as at the node it hits (any one of the counters; the
#: ones that depend on timing, e.g. whether the frame's ``seq`` is the one the port expects at the
#: moment it arrives, list every possible outcome). ``None``: counted nowhere (the node answers).
#: ``"lost"``: the frame may be taken as the chunk it claims to be, marked bad (a forged LOST
#: placeholder): no counter need move, but that chunk must then be reported missing.
#: ``"taken"``: a CONTROL that arrives after the collective finished starts a new one (as any
#: CONTROL then does); the node's ``collective`` changes instead of ``control_refused``.
#: ``abort_mid`` is a valid CONTROL with ABORT from the node's own host (a rank that restarted, or
#: gave up on the collective early): it must be taken whatever runs, so that collective is lost
#: everywhere (reported missing, never wrong) and the next one is bit-exact.
EXPECTED: dict[str, tuple[str, ...] | None] = {
    "short": ("drop_short",),
    "version": ("drop_version",),
    "opcode": ("drop_opcode",),
    "collective": ("drop_collective",),
    "flags": ("drop_flags",),
    "dtype": ("drop_dtype",),
    "codec": ("drop_codec",),
    "seq_far": ("drop_seq",),
    "count_zero": ("drop_seq", "drop_count"),
    "count_big": ("drop_seq", "drop_count"),
    "payload_short": ("drop_seq", "drop_count", "drop_length"),
    "payload_long": ("drop_seq", "drop_count", "drop_length"),
    "header_only": ("drop_seq", "drop_count", "drop_length"),
    "oversize": ("drop_seq", "drop_count", "drop_oversize"),
    "lost_forged": ("drop_seq", "drop_flags", "lost"),
    "control_mid": ("control_refused", "taken"),
    "abort_mid": ("taken",),
    "stats_request": None,
    "garbage": ("drop_short", "drop_version", "drop_opcode", "drop_collective", "drop_flags", "drop_dtype",
                "drop_codec", "drop_seq", "drop_count", "drop_length", "drop_oversize"),
}
KINDS = tuple(EXPECTED)
_HOST_ONLY = ("control_mid", "abort_mid", "stats_request")


@dataclass(frozen=True)
class FuzzCase:
    """One injected frame: ``kind`` (a key of :data:`EXPECTED`) into ``port`` of ``node``, after
    ``after`` result chunks have reached that node's host (0: at the start), marked ``bad`` on its
    last beat if ``bad`` (network ports only: a frame spoilt on a cut-through link). ``port``:
    ``"host"`` or ``"net{p}"``, a cabled network port (:func:`engine_ports`)."""

    index: int
    kind: str
    node: int
    port: str
    after: int
    seed: int
    bad: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def engine_ports(topology) -> list[tuple[str, ...]]:
    """Where a frame can be injected at each node of a network of schedule engines on ``topology``
    (a :class:`~wirereduce.schedule.Topology`): ``"host"`` and ``"net{p}"`` for every cabled port p."""
    return [("host",) + tuple(f"net{p}" for p in range(len(links))) for links in topology.links]


def engine_routes(schedule, node: int, port: int) -> list[tuple[int, int]]:
    """The ``(opcode, flow)`` pairs a data frame may carry into network port ``port`` of ``node``
    under ``schedule`` (docs/protocol.md "Schedule engine frames"): a REDUCE of a flow whose terms
    include the port (a child's partial sum), a BROADCAST of a flow whose parent is on the port
    (its result). A frame of any other pair is dropped at the engine's gate as misrouted
    (``drop_opcode``) before the other checks could tell what else is wrong with it."""
    from wirereduce.table import node_entries

    entries = node_entries(schedule.tables[node], max(1, len(schedule.topology.links[node])))
    routes = [(int(Opcode.REDUCE), f) for f, e in enumerate(entries) if port in e.terms]
    routes += [(int(Opcode.BROADCAST), f) for f, e in enumerate(entries) if not e.is_root and e.unit == port]
    return routes


def make_cases(n: int, nodes: int, seed: int = 0, kinds: tuple[str, ...] = KINDS, *,
               ports: list[tuple[str, ...]]) -> list[FuzzCase]:
    """``n`` cases, every kind in turn (so any ``n ≥ len(kinds)`` covers each), ports, nodes and
    timing drawn from ``numpy.random.default_rng(seed)``.

    ``ports``: per node, the ports a frame may be injected into (:func:`engine_ports`).

    Raises
    ------
    ValueError
        If ``n`` < 1, ``nodes`` < 2, a kind is unknown or ``ports`` does not give every node "host".
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int ≥ 1, not {n!r}")
    if not isinstance(nodes, int) or nodes < 2:
        raise ValueError(f"nodes must be an int ≥ 2, not {nodes!r}")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fuzz kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if len(ports) != nodes or any("host" not in p for p in ports):
        raise ValueError(f"ports must list the ports of each of the {nodes} nodes, \"host\" among them")
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        node = int(rng.integers(nodes))
        port = "host" if kind in _HOST_ONLY else str(rng.choice(ports[node]))
        cases.append(FuzzCase(index=i, kind=kind, node=node, port=port,
                              after=int(rng.integers(0, 3)), seed=int(rng.integers(1 << 31)),
                              bad=bool(port != "host" and rng.random() < 0.25)))
    return cases


def build_frame(case: FuzzCase, *, collective: int, chunks: int, nodes: int, max_elements: int, mtu: int,
                flows: int, counts: list[int], routes: list[tuple[int, int]] | None = None,
                codec: int = Codec.NONE, eb_k: int = 0, dtype: int = DType.FP32) -> bytes:
    """The frame ``case`` injects into a collective ``collective`` of ``chunks`` chunks (``codec``/
    ``eb_k`` its codec) on a network of ``nodes`` schedule engines built for ``mtu``, running a
    schedule of ``flows`` flows; ``counts`` are the elements of each chunk g.

    Exactly one thing is wrong with it (the ``kind``); ``garbage`` is random bytes after a random
    header. On the host port its opcode is HOST_PUSH and its ``seq`` any chunk g, ``hop`` = its flow
    g mod F. On network port p (``case.port`` "net{p}") ``routes`` are the ``(opcode, flow)`` pairs
    the port takes (:func:`engine_routes`; empty: the port takes none of this schedule's frames, and
    a REDUCE of a random flow goes in, dropped as misrouted); the frame's ``seq`` is a chunk g of its
    flow f (g mod F = f) and ``hop`` = f. A CONTROL's ``hop`` is F, and an ``opcode`` kind never
    carries REDUCE or BROADCAST (either may be valid on that port for some flow). ``dtype`` is the
    collective's dtype byte.

    Raises
    ------
    ValueError
        A network port without its ``routes``, or ``counts`` not one per chunk.
    """
    if case.port != "host" and routes is None:
        raise ValueError(f"a frame into {case.port} needs that port's routes (engine_routes)")
    if len(counts) != chunks:
        raise ValueError(f"counts must give the elements of each of the {chunks} chunks, not {len(counts)}")
    rng = np.random.default_rng(case.seed)
    if case.port != "host":
        op, flow = routes[int(rng.integers(len(routes)))] if routes else (int(Opcode.REDUCE), int(rng.integers(flows)))
        own = [g for g in range(chunks) if g % flows == flow]
        seq = int(rng.choice(own)) if own else int(rng.integers(chunks))
    else:
        op = Opcode.HOST_PUSH
        seq = int(rng.integers(chunks))
        flow = seq % flows
    count = counts[seq]
    hop, src = flow, int(rng.integers(nodes))
    hdr = Header(opcode=op, collective=collective, seq=seq, count=count, src=src, hop=hop, codec=codec, eb_k=eb_k,
                 dtype=dtype)
    payload = rng.standard_normal(count).astype(np.float32)
    if codec != Codec.NONE:
        # compressed as the collective's pushes are, so that the engine's codec stage (in front of its
        # gate) decodes it and the one thing wrong with it is the kind's (raw floats under a codec
        # header fail the codec's tag check first: drop_length)
        from wirereduce.codec import encode

        payload = encode(payload, eb_k)
    body = len(payload) if isinstance(payload, bytes) else 4 * count
    k = case.kind
    if k == "short":
        return hdr.pack()[:int(rng.integers(1, HEADER_BYTES))]
    if k == "version":
        return frame(hdr.replace(version=int(rng.choice([0, 2, 0x81, 0xFF]))), payload)
    if k == "opcode":
        taken = (op, Opcode.CONTROL, Opcode.STATS_REQUEST, Opcode.REDUCE, Opcode.BROADCAST)
        bad_ops = [o for o in range(256) if o not in taken]
        return frame(hdr.replace(opcode=int(rng.choice(bad_ops))), payload)
    if k == "collective":
        return frame(hdr.replace(collective=(collective + int(rng.integers(1, 1 << 16))) & 0xFFFF), payload)
    if k == "flags":
        allowed = 0 if op == Opcode.HOST_PUSH else int(Flag.LOST)
        bits = int(rng.integers(1, 256)) & ~allowed or 0x80
        return frame(hdr.replace(flags=bits), payload)
    if k == "dtype":
        return frame(hdr.replace(dtype=int(rng.choice([d for d in (0, 1, 2, 3, 0xFF) if d != dtype]))), payload)
    if k == "codec":
        if codec == Codec.NONE:
            return frame(hdr.replace(codec=Codec.INCEPTIONN_V1, eb_k=int(rng.integers(4, 25))), payload)
        return frame(hdr.replace(eb_k=(eb_k + int(rng.integers(1, 20))) % 25), payload)
    if k == "seq_far":
        return frame(hdr.replace(seq=chunks + int(rng.integers(0, 1 << 20))), payload)
    if k == "count_zero":
        return frame(hdr.replace(count=0), b"")
    if k == "count_big":
        big = int(rng.integers(max_elements + 1, 1 << 16))
        return frame(hdr.replace(count=big), payload)
    if k == "payload_short":
        data = frame(hdr, payload)
        return data[:-int(rng.integers(1, body + 1))]
    if k == "payload_long":
        return frame(hdr, payload) + rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    if k == "header_only":
        return hdr.pack()
    if k == "oversize":
        extra = mtu + 1 - (HEADER_BYTES + body) + int(rng.integers(0, 512))
        return frame(hdr, payload) + rng.integers(0, 256, extra, dtype=np.uint8).tobytes()
    if k == "lost_forged":
        return hdr.replace(count=0, flags=Flag.LOST).pack()
    if k == "control_mid":
        return Header(opcode=Opcode.CONTROL, collective=(collective + 100) & 0xFFFF, src=int(rng.integers(nodes)),
                      hop=flows, seq=chunks, count=int(rng.integers(1 << 16)), codec=codec,
                      eb_k=eb_k, dtype=dtype).pack()
    if k == "abort_mid":
        return Header(opcode=Opcode.CONTROL, collective=(collective + 100) & 0xFFFF, src=case.node,
                      hop=flows, seq=chunks, count=int(rng.integers(1 << 16)), codec=codec,
                      eb_k=eb_k, dtype=dtype, flags=Flag.ABORT).pack()
    if k == "stats_request":
        return Header(opcode=Opcode.STATS_REQUEST, count=int(rng.integers(1 << 16))).pack()
    if k == "garbage":
        n = int(rng.integers(1, mtu + 200))
        if n == body:  # a well-formed frame with a random payload is a forgery, not a malformed frame
            n += 1
        body = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        head = bytearray(hdr.pack())
        head[int(rng.integers(HEADER_BYTES))] ^= 1 << int(rng.integers(8))
        return bytes(head) + body
    raise ValueError(f"unknown fuzz kind {k!r}")


def case_inputs(inputs, case_dict: dict, nodes: int) -> tuple[FuzzCase, list, list, dict]:
    """A testbench's view of one case of ``$WIREREDUCE_FUZZ``: the :class:`FuzzCase`, the arrays of
    its collective and of the fresh one after it (from the ``inputs`` npz :func:`~wirereduce.sim.fuzz.run.run_fuzz`
    wrote), and its record so far."""
    case = FuzzCase(**case_dict)
    i = case.index
    arrays = [inputs[f"node{k}_case{i}"] for k in range(nodes)]
    fresh = [inputs[f"node{k}_fresh{i}"] for k in range(nodes)]
    return case, arrays, fresh, {"case": case.as_dict()}
