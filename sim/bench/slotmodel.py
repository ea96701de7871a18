"""Slot model of the schedule engine: how close a unit-ordering rule lets a schedule get to its link bound.

The schedule engine (:mod:`wirereduce.hdl.core.engine`) measured at the NTT ring's rate on every
schedule (docs/architecture.md "Schedule benchmark"). This model finds out why without a gateware
run, and which change would help: it plays a schedule's flows through an abstract engine in which
every frame takes exactly one **slot** (one frame time) on a link, and asks how many slots ``K``
rounds of chunks (``K`` chunks per flow, chunk g = k·F + f as in :mod:`wirereduce.table`) take.

What is modelled (the engine's rules, docs/architecture.md "Schedule engine"):

- every node has one summation unit per parent port and a root unit; a unit starts at most one
  chunk per slot, and a chunk's sum leaves as one frame on the parent port (or, at the root, one
  multicast frame on every forward port at once: all or nothing, like the engine's allocator);
- ``in_order=True``: a unit takes its chunks in increasing g (the engine's first rule);
  ``in_order=False``: any of its chunks whose terms have all arrived (out-of-order units), or with
  ``lookahead=D`` any of its D oldest chunks not yet summed (the engine's ``EngineConfig.lookahead``,
  default D = 2);
- a BROADCAST frame waits in the queue of the port it arrived on, in arrival order (FIFO), and is
  forwarded to its flow's forward ports at once;
- a directed link carries at most one frame per slot;
- ``cut_through=True``: a frame that starts on a link in slot t can be summed or forwarded by the
  next node in the same slot (the chain streams through, as the engine's cut-through hops do);
  ``cut_through=False``: from slot t + 1 (store and forward);
- ``priority``: who wins a contended output port: ``"unit"`` (partial sums first, the engine's
  allocator) or ``"broadcast"`` (forwarded results and roots first); ties go to the lower g;
- the host link is never the bottleneck (local chunks are always there; results leave at once).

What is not: frame lengths other than one slot, hop latency, partially overlapping frames (the
real engine's frames start at any cycle, so its links fragment and it does a little worse than
the model; on the 4 × 4 torus the two agree: in-order units reach 0.51 of the trees' bound in
both, docs/architecture.md "Why the engine stays at the ring's rate").

The bound is the busiest directed link's frames per round times ``K`` (:func:`link_frames_per_round`):
no engine, however it orders its work, finishes in fewer slots.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from wirereduce.schedule import Schedule

__all__ = ["SlotResult", "link_frames_per_round", "slot_model", "run_slot_model", "run_drift_model", "PRIORITIES",
           "MODEL_ROWS", "DRIFT_ROWS"]

#: Allocator priorities the model knows.
PRIORITIES = ("unit", "broadcast")


@dataclass(frozen=True)
class SlotResult:
    """One model run.

    Attributes
    ----------
    slots : int or float
        Slots (frame times) until every node holds every chunk's result.
    rounds : int
        Chunks per flow (K).
    bound_slots : int
        The busiest link's frames per round × K: the fewest slots any engine can take.
    """

    slots: int
    rounds: int
    bound_slots: int

    @property
    def of_bound(self) -> float:
        """``bound_slots / slots`` (1.0 = every slot of the busiest link used)."""
        return self.bound_slots / self.slots


def link_frames_per_round(schedule: Schedule) -> dict[tuple[int, int], int]:
    """Frames each directed link ``(node, port)`` carries per round (one chunk of every flow).

    A tree edge carries the child's partial sum up (on the child's port) and the result down (on
    the parent's port).
    """
    load: dict[tuple[int, int], int] = defaultdict(int)
    for fl in schedule.flows:
        for e in fl.edges:
            load[(e.child, e.child_port)] += 1
            load[(e.parent, e.parent_port)] += 1
    return dict(load)


def slot_model(schedule: Schedule, rounds: int, *, in_order: bool = True, cut_through: bool = True,
               priority: str = "unit", lookahead: int | None = None, window: int | None = None,
               ticks: int = 1, latency: int = 0, multicast: str = "all", max_slots: int = 1_000_000) -> SlotResult:
    """Play ``rounds`` chunks of every flow of ``schedule`` through the model (module docstring).

    ``lookahead`` (with ``in_order=False``): a unit considers only its ``lookahead`` oldest chunks not
    yet summed (2 is what the engine builds); ``None``: all of them.

    ``window`` (the host window, :class:`~wirereduce.host.engine.EngineSession`): a node's local
    chunk g is there only once its host holds g − window + 1 results (push g waits for them, and the
    engine's local buffer has as many slots); ``None``: always there. Results reach the host in the
    slot they reach the node (no host-link time).

    ``ticks``, ``latency`` (the misaligned model): a frame time is ``ticks`` ticks, and a frame may
    start at any tick; a cut-through frame can be summed or forwarded by the next node ``latency``
    ticks after it started on the link (the hop latency; store and forward: ``ticks``). A link, a
    unit and a broadcast queue carry one frame at a time. With ``latency`` ≥ 1 the frames drift
    off the slot grid, as the engine's do (its frames start at any cycle), and an all-or-nothing
    multicast (a root's result, a forwarded broadcast) waits until *every* port it goes out on is
    free, idling the ports that freed up first. ``ticks = 1, latency = 0`` is the slot model above.
    ``slots`` is then the ticks taken ÷ ``ticks`` (a float).

    ``multicast``: ``"all"`` (the engine's rule: a frame that goes out on several ports starts on
    all of them at once, from the queue of the port it came in on) or ``"each"`` (output queues: a
    broadcast that arrives, or a root's result, is queued once per port it goes out on, and each
    port sends it when that port is free, in arrival order; a root unit no longer waits for its
    ports).

    Raises
    ------
    ValueError
        ``rounds`` < 1, an unknown ``priority``, bad ``ticks``/``latency``, or no progress within
        ``max_slots`` (a model deadlock: that cannot happen with these rules, so it would be a bug).
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, not {rounds!r}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, not {window!r}")
    if lookahead is not None and (not isinstance(lookahead, int) or lookahead < 1):
        raise ValueError(f"lookahead must be a positive int or None, not {lookahead!r}")
    if multicast not in ("all", "each"):
        raise ValueError(f"multicast must be 'all' or 'each', not {multicast!r}")
    if not isinstance(ticks, int) or ticks < 1 or not isinstance(latency, int) or not 0 <= latency <= ticks:
        raise ValueError(f"ticks must be an int ≥ 1 and latency 0 … ticks, not {ticks!r} and {latency!r}")
    look = 1 if in_order else lookahead
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    topo = schedule.topology
    F = len(schedule.flows)
    entry = {(t.node, e.flow): e for t in schedule.tables for e in t.entries}
    unit_flows: dict[tuple[int, object], list[int]] = defaultdict(list)
    for (u, f), e in entry.items():
        unit_flows[(u, e.parent.port if e.parent else "root")].append(f)
    todo = {k: sorted(r * F + f for r in range(rounds) for f in fl) for k, fl in unit_flows.items()}
    arrived: dict[tuple[int, int, int], int] = {}   # (node, g, in port) -> slot the partial sum started
    # Broadcast queues: (node, in port) ("all") or (node, out port) ("each") -> [(g, tick it may start)]
    bq: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    results = 0
    got = [0] * schedule.nodes   # results each node holds (the window)
    want = schedule.nodes * F * rounds
    bound = max(link_frames_per_round(schedule).values()) * rounds
    unit_rank, bcast_rank = (0, 1) if priority == "unit" else (1, 0)
    free_at: dict = defaultdict(int)   # link (node, port) or source (kind, key) -> first tick it is free
    delay = latency if cut_through else ticks
    t = -1
    while results < want:
        t += 1
        if t > max_slots * ticks:
            raise ValueError(f"no progress after {max_slots} slots ({results} of {want} results)")

        def ready(a: int, now: int = t) -> bool:
            return a + delay <= now

        progress = True
        while progress:
            progress = False
            cands = []
            for key, gs in todo.items():
                if free_at[("unit", key)] > t or not gs:
                    continue
                u = key[0]
                for g in (gs if look is None else gs[:look]):
                    if window is not None and g >= got[u] + window:
                        break   # not pushed yet (the window); later chunks are not either
                    e = entry[(u, g % F)]
                    if all((u, g, c.port) in arrived and ready(arrived[(u, g, c.port)]) for c in e.children):
                        ports = ([e.parent.port] if e.parent else
                                 [p.port for p in e.forward] if multicast == "all" else [])
                        cands.append((unit_rank, g, "unit", key, ports))
                        break
            for key, q in bq.items():
                if free_at[("bcast", key)] > t or not q or q[0][1] > t:
                    continue
                g = q[0][0]
                ports = [p.port for p in entry[(key[0], g % F)].forward] if multicast == "all" else [key[1]]
                cands.append((bcast_rank, g, "bcast", key, ports))
            cands.sort(key=lambda c: (c[0], c[1]))
            for _, g, kind, key, ports in cands:
                u = key[0]
                if free_at[(kind, key)] > t or any(free_at[(u, p)] > t for p in ports):
                    continue
                free_at[(kind, key)] = t + ticks
                for p in ports:
                    free_at[(u, p)] = t + ticks
                progress = True
                e = entry[(u, g % F)]
                if kind == "unit":
                    todo[key].remove(g)
                    if e.parent is not None:
                        v, q = topo.links[u][e.parent.port]
                        arrived[(v, g, q)] = t
                        continue
                    results += 1   # the root holds the result
                    got[u] += 1
                    if multicast == "each":
                        for p in e.forward:
                            bq[(u, p.port)].append((g, t))
                else:
                    bq[key].pop(0)
                for p in ports:
                    v, q = topo.links[u][p]
                    results += 1
                    got[v] += 1
                    fwd = entry[(v, g % F)].forward
                    if fwd and multicast == "all":
                        bq[(v, q)].append((g, t + delay))
                    for f in (fwd if multicast == "each" else ()):
                        bq[(v, f.port)].append((g, t + delay))
            if delay:
                break
    t += ticks   # ticks taken: the last frame started in tick t and takes a frame time
    return SlotResult(t if ticks == 1 else t / ticks, rounds, bound)


#: (topology, algorithm, rounds) the model runs by default (``wirereduce slot-model``).
MODEL_ROWS = (("ring:4", "biring", 32), ("ring:8", "biring", 32), ("torus:4x4", "ring", 32),
              ("torus:4x4", "multitree", 32), ("torus:4x4", "multitree-balanced", 32),
              ("hypercube:8", "multitree", 32), ("hypercube:8", "multitree-balanced", 32),
              ("mesh:3x3", "multitree", 32), ("mesh:3x3", "multitree-balanced", 32))


def run_slot_model(rows=MODEL_ROWS, out: str | None = "bench/results/slot-model.json",
                   window: int | None = None) -> list[dict]:
    """Every (row, ordering rule, cut-through, priority): print a table, write JSON records to ``out``.

    Each record: ``topology``, ``algorithm``, ``rounds``, ``in_order``, ``cut_through``, ``priority``,
    ``slots``, ``bound_slots``, ``of_bound`` and ``vs_ring`` (chunks per slot ÷ the NTT ring's one chunk
    per slot: the algbw ratio against the ring on the same nodes, with 50G hosts), and ``window``
    (the host window of every run, :func:`slot_model`; None: unlimited).
    """
    import json
    from itertools import product
    from pathlib import Path

    from wirereduce import schedule as sched

    recs = []
    print(f"{'topology':>12} {'algorithm':>18} {'units':>12} {'hops':>14} {'priority':>9} {'slots':>6} "
          f"{'bound':>6} {'of bound':>8} {'vs ring':>7}")
    for topo, alg, k in rows:
        s = sched.build(topo, alg)
        for (in_order, look), ct, prio in product(((True, 1), (False, 2), (False, None)), (True, False), PRIORITIES):
            r = slot_model(s, k, in_order=in_order, cut_through=ct, priority=prio, lookahead=look, window=window)
            chunks = k * len(s.flows)
            rec = {"kind": "slot-model", "topology": s.topology.name, "algorithm": alg, "rounds": k,
                   "flows": len(s.flows), "in_order": in_order, "lookahead": look, "cut_through": ct, "priority": prio,
                   "slots": r.slots, "bound_slots": r.bound_slots, "of_bound": r.of_bound,
                   "vs_ring": chunks / r.slots, "window": window}
            recs.append(rec)
            units = "in order" if in_order else ("lookahead 2" if look == 2 else "out of order")
            print(f"{s.topology.name:>12} {alg:>18} {units:>12} "
                  f"{'cut-through' if ct else 'store-forward':>14} {prio:>9} {r.slots:>6} {r.bound_slots:>6} "
                  f"{r.of_bound:>8.2f} {rec['vs_ring']:>7.2f}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(recs, indent=1) + "\n")
    return recs


#: (topology, algorithm, host window) the drift study runs by default (``wirereduce slot-model --drift``):
#: the windows are the engines' slots in the schedule benchmark.
DRIFT_ROWS = (("ring:4", "biring", 16), ("ring:8", "biring", 16), ("torus:4x4", "multitree", 32),
              ("torus:4x4", "multitree-balanced", 32), ("hypercube:8", "multitree", 16),
              ("hypercube:8", "multitree-balanced", 16))


def run_drift_model(rows=DRIFT_ROWS, rounds: int = 32, ticks: int = 64, latencies=(0, 1, 2),
                    out: str | None = "bench/results/slot-model-drift.json") -> list[dict]:
    """Frames off the slot grid (:func:`slot_model` with ``ticks``/``latency``), with the engine's
    all-or-nothing multicast and with output queues (``multicast="each"``): print a table, write
    JSON records to ``out``.

    Every run has lookahead-2 units, the engine's allocator priority (``"auto"``: partial sums first
    at P = 2, broadcasts first above) and the row's host window. ``latency`` is the hop latency in
    ticks of a frame time of ``ticks`` (the engine's 16-cycle hop is about 1/60 of a 1,500-byte
    frame at 10 Gbit/s behind a 50G host: ``latency = 1`` of 64). Each record: ``topology``,
    ``algorithm``, ``rounds``, ``window``, ``ticks``, ``latency``, ``multicast``, ``slots``,
    ``bound_slots``, ``of_bound``.
    """
    import json
    from pathlib import Path

    from wirereduce import schedule as sched

    recs = []
    print(f"{'topology':>12} {'algorithm':>18} {'window':>6} {'latency':>7} {'multicast':>9} {'slots':>8} "
          f"{'bound':>6} {'of bound':>8}")
    for topo, alg, window in rows:
        s = sched.build(topo, alg)
        prio = "unit" if s.topology.degree <= 2 else "broadcast"
        for lat in latencies:
            for mc in ("all", "each"):
                r = slot_model(s, rounds, in_order=False, lookahead=2, priority=prio, window=window,
                               ticks=ticks, latency=lat, multicast=mc)
                recs.append({"kind": "slot-model-drift", "topology": s.topology.name, "algorithm": alg,
                             "rounds": rounds, "window": window, "priority": prio, "ticks": ticks, "latency": lat,
                             "multicast": mc, "slots": r.slots, "bound_slots": r.bound_slots,
                             "of_bound": r.of_bound})
                print(f"{s.topology.name:>12} {alg:>18} {window:>6} {f'{lat}/{ticks}':>7} {mc:>9} "
                      f"{r.slots:>8.2f} {r.bound_slots:>6} {r.of_bound:>8.3f}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(recs, indent=1) + "\n")
    return recs
