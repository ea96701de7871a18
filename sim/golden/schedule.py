"""numpy golden model of an allreduce run by the schedule engine, in the schedule's summation order.

:func:`allreduce` follows the node tables of a :class:`wirereduce.schedule.Schedule` and nothing
else: for every flow, each node's partial sum is its table's terms added left to right in
float32 (the children's partial sums, in table order, and its local chunk where the table puts
it); the root's sum is the flow's result, and the gather copies it, unchanged, along the
tables' forward ports to every node. fp32 addition is not associative, so this order is what
"bit-exact" in docs/arithmetic.md means for tree schedules; numpy's float32 ``+`` is IEEE 754 binary32 with
round-to-nearest-even and subnormals kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wirereduce.arrays import check_inputs
from wirereduce.schedule import Schedule

__all__ = ["allreduce", "flow_result"]


def flow_result(arrays: Sequence[np.ndarray], schedule: Schedule, flow: int) -> np.ndarray:
    """The finished sum of one flow (its share of the elements), as its root computes it.

    ``arrays`` are already checked float32 arrays, one per node.
    """
    sl = schedule.split(arrays[0].size)[flow]
    entries = [t.entries[flow] for t in schedule.tables]
    partial: dict[int, np.ndarray] = {}

    def compute(u: int, depth: int) -> np.ndarray:
        if u in partial:
            return partial[u]
        if depth > schedule.nodes:
            raise ValueError(f"flow {flow}: the tables' children form a cycle")
        acc = None
        for term in entries[u].terms():
            x = arrays[u][sl] if term is None else compute(term.node, depth + 1)
            acc = x.copy() if acc is None else np.add(acc, x, dtype=np.float32)
        if acc is None:
            raise ValueError(f"flow {flow}: node {u} adds nothing (no children, no local chunk)")
        partial[u] = acc
        return acc

    roots = [u for u, e in enumerate(entries) if e.parent is None]
    if len(roots) != 1:
        raise ValueError(f"flow {flow}: the tables name {len(roots)} roots")
    with np.errstate(all="ignore"):  # overflow to Inf and Inf - Inf = NaN are defined results
        return compute(roots[0], 0)


def allreduce(arrays: Sequence[np.ndarray], schedule: Schedule) -> list[np.ndarray]:
    """Every node's result of the allreduce ``schedule`` runs on ``arrays`` (one float32 array per node).

    Returns
    -------
    list of numpy.ndarray, float32, one per node
        Element range ``schedule.split(n)[f]`` holds flow f's sum as it reached that node
        through the gather.

    Raises
    ------
    ValueError
        Bad inputs (:func:`wirereduce.arrays.check_inputs`, one array per node), or tables that
        do not describe a reduce and a gather reaching every node once.
    """
    arrays = check_inputs(arrays, schedule.nodes)
    n = arrays[0].size
    out = [np.empty(n, dtype=np.float32) for _ in range(schedule.nodes)]
    for f, sl in enumerate(schedule.split(n)):
        result = flow_result(arrays, schedule, f)
        entries = [t.entries[f] for t in schedule.tables]
        root = next(u for u, e in enumerate(entries) if e.parent is None)
        got = {root: result}
        queue = [root]
        while queue:
            u = queue.pop()
            for t in entries[u].forward:
                if t.node in got:
                    raise ValueError(f"flow {f}: node {t.node} receives the result twice")
                got[t.node] = got[u]
                queue.append(t.node)
        for u in range(schedule.nodes):
            if u not in got:
                raise ValueError(f"flow {f}: the result never reaches node {u}")
            if entries[u].deliver:
                out[u][sl] = got[u]
    return out
