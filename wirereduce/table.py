"""The schedule engine's run-time table and chunk numbering: the contract between the gateware
(:mod:`wirereduce.hdl.core.engine`), the host driver and the golden model.

A :class:`~wirereduce.schedule.Schedule` is plain data; this module turns one node's
:class:`~wirereduce.schedule.NodeTable` into the 64-bit words a SCHEDULE frame loads into the
engine (docs/architecture.md "Schedule engine"), and fixes how a message is cut into chunks.

Chunk numbering
---------------
A message of ``n`` elements is split into the schedule's F flows (:meth:`Schedule.split`:
contiguous ranges, the first ``n % F`` one element longer); flow f's range is cut into frames of
``elements_per_frame`` elements, chunk k of flow f covering ``[start_f + k·E, start_f + (k+1)·E)``
(or, with a chunk profile E_0, E_1, …, the last size repeated, ``[start_f + E_0 + … + E_(k-1), … + E_k)``,
clipped to the flow's range).
Chunks are numbered round-robin over the flows, **g = k·F + f**, so consecutive chunks belong to
different flows and every tree is busy at once. Because the longer flows are the first ones, the
chunk numbers in use are exactly 0 … C-1 (:func:`plan`). A data frame carries ``seq`` = g and
``hop`` = f (docs/protocol.md "Schedule engine frames").

Table entry (one per flow, a little-endian u64 in a SCHEDULE frame's payload)
---------------------------------------------------------------------------
===========  =====================================================================================
bits         field
===========  =====================================================================================
0–2          ``unit``: the summation unit that computes this node's partial sum: the parent port
             0 … P-1, or :data:`ROOT` (7) at the flow's root
3–23         ``terms``: 7 codes of 3 bits, the summation order, left to right: port 0 … 5 (a
             child's partial sum arriving on that port), :data:`LOCAL` (6, the host's chunk) or
             :data:`NONE` (7, unused; only after the last term)
24–31        ``next_flow``: the next flow (in chunk order) this node's same unit handles
32–39        ``gap``: chunks from this flow's chunk to that one (1 … F; F if the unit has one flow)
40–45        ``forward``: mask of the ports the finished sum is sent on (the children in the tree)
46           ``deliver``: the result goes to the host
47–63        0
===========  =====================================================================================

A unit handles its chunks in increasing g, following ``next_flow``/``gap``; this order is what
makes the engine deadlock-free (docs/architecture.md "Why the engine cannot deadlock").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wirereduce.schedule import FlowEntry, NodeTable, Schedule

__all__ = [
    "ROOT", "LOCAL", "NONE", "MAX_TERMS", "MAX_PORTS", "MAX_FLOWS", "ENTRY_BYTES",
    "EngineEntry", "node_entries", "encode_entry", "decode_entry", "Chunk", "plan", "table_frames_payloads",
]

#: ``unit`` of the flow's root.
ROOT = 7
#: Term code of the local chunk.
LOCAL = 6
#: Term code of an unused term.
NONE = 7
#: Terms an entry holds.
MAX_TERMS = 7
#: Most network ports an engine may have (term codes 0 … 5).
MAX_PORTS = 6
#: Most flows a table may hold (``next_flow`` and ``hop`` are 8 bits).
MAX_FLOWS = 256
#: Bytes of one table entry.
ENTRY_BYTES = 8


@dataclass(frozen=True)
class EngineEntry:
    """One decoded table entry (module docstring)."""

    unit: int
    terms: tuple[int, ...]
    next_flow: int
    gap: int
    forward: int
    deliver: bool

    @property
    def is_root(self) -> bool:
        return self.unit == ROOT


def _unit(entry: FlowEntry) -> int:
    return ROOT if entry.parent is None else entry.parent.port


def node_entries(table: NodeTable, ports: int) -> list[EngineEntry]:
    """The engine entries of one node's table, for an engine with ``ports`` network ports.

    Raises
    ------
    ValueError
        The node has more ports than the engine, a flow has more than :data:`MAX_TERMS` terms,
        or there are more than :data:`MAX_FLOWS` flows.
    """
    if not 1 <= ports <= MAX_PORTS:
        raise ValueError(f"an engine has 1 … {MAX_PORTS} network ports, not {ports}")
    if len(table.ports) > ports:
        raise ValueError(f"node {table.node} has {len(table.ports)} ports; the engine has only {ports}: "
                         f"build it with ports ≥ {len(table.ports)}")
    flows = len(table.entries)
    if not 1 <= flows <= MAX_FLOWS:
        raise ValueError(f"a table holds 1 … {MAX_FLOWS} flows, not {flows}")
    units = [_unit(e) for e in table.entries]
    out = []
    for f, e in enumerate(table.entries):
        terms = tuple(LOCAL if t is None else t.port for t in e.terms())
        if not 1 <= len(terms) <= MAX_TERMS:
            raise ValueError(f"node {table.node} flow {f}: {len(terms)} terms; an entry holds 1 … {MAX_TERMS}")
        gap = next(d for d in range(1, flows + 1) if units[(f + d) % flows] == units[f])
        fwd = 0
        for p in e.forward:
            fwd |= 1 << p.port
        out.append(EngineEntry(units[f], terms, (f + gap) % flows, gap, fwd, bool(e.deliver)))
    return out


def encode_entry(e: EngineEntry) -> int:
    """The 64-bit word of entry ``e`` (module docstring)."""
    terms = list(e.terms) + [NONE] * (MAX_TERMS - len(e.terms))
    word = e.unit & 7
    for i, t in enumerate(terms):
        word |= (t & 7) << (3 + 3 * i)
    word |= (e.next_flow & 0xFF) << 24
    word |= (e.gap & 0xFF) << 32
    word |= (e.forward & 0x3F) << 40
    word |= int(e.deliver) << 46
    return word


def decode_entry(word: int) -> EngineEntry:
    """Inverse of :func:`encode_entry` (trailing NONE terms dropped)."""
    terms = [(word >> (3 + 3 * i)) & 7 for i in range(MAX_TERMS)]
    while terms and terms[-1] == NONE:
        terms.pop()
    return EngineEntry(word & 7, tuple(terms), (word >> 24) & 0xFF, ((word >> 32) & 0xFF) or 256,
                       (word >> 40) & 0x3F, bool((word >> 46) & 1))


@dataclass(frozen=True)
class Chunk:
    """Chunk ``seq`` = k·F + ``flow``: ``count`` elements from element ``start`` of the message."""

    seq: int
    flow: int
    start: int
    count: int


def plan(n: int, schedule: Schedule, elements_per_frame: int | Sequence[int]) -> list[Chunk]:
    """The chunks of a message of ``n`` elements, in ``seq`` order 0 … C-1 (module docstring).

    ``elements_per_frame``: the chunk size in elements (words), or a *chunk profile*: one size per
    round k (chunk k of every flow), the last size repeated for the rounds after it; for example
    ``(64, 128, 371)`` cuts each flow into a chunk of 64, one of 128, then chunks of 371 (the last
    one shorter). Every node plans the same chunks, so the sizes only have to fit a frame.

    Raises ValueError if ``n`` < 1, or a size is < 1 (or the profile is empty).
    """
    if n < 1:
        raise ValueError(f"a message has at least one element, not {n}")
    profile = (elements_per_frame,) if isinstance(elements_per_frame, int) else tuple(elements_per_frame)
    if not profile or any(not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in profile):
        raise ValueError(f"elements_per_frame must be ≥ 1 (or a non-empty sequence of such sizes), "
                         f"not {elements_per_frame!r}")
    flows = len(schedule.flows)
    ranges = schedule.split(n)
    longest = max(r.stop - r.start for r in ranges)
    bounds = [0]  # round k covers [bounds[k], bounds[k+1]) of every flow's range
    while bounds[-1] < longest:
        bounds.append(bounds[-1] + profile[min(len(bounds) - 1, len(profile) - 1)])
    chunks = []
    for k in range(len(bounds) - 1):
        for f, r in enumerate(ranges):
            start = r.start + bounds[k]
            if start < r.stop:
                chunks.append(Chunk(k * flows + f, f, start, min(bounds[k + 1] - bounds[k], r.stop - start)))
    if [c.seq for c in chunks] != list(range(len(chunks))):  # holds by construction (longer flows first)
        raise AssertionError("chunk numbers are not contiguous")
    return chunks


def table_frames_payloads(schedule: Schedule, node: int, ports: int, entries_per_frame: int) -> list[tuple[int, bytes]]:
    """Node ``node``'s table as SCHEDULE frame payloads: ``(first flow, payload bytes)`` each, at
    most ``entries_per_frame`` entries (8 bytes each) per frame."""
    words = [encode_entry(e) for e in node_entries(schedule.tables[node], ports)]
    out = []
    for i in range(0, len(words), entries_per_frame):
        out.append((i, b"".join(w.to_bytes(8, "little") for w in words[i:i + entries_per_frame])))
    return out
