"""numpy golden model of an allreduce run by the schedule engine, in the schedule's summation order.

:func:`allreduce` follows the node tables of a :class:`wirereduce.schedule.Schedule` and nothing
else: for every flow, each node's partial sum is its table's terms added left to right in
float32 (the children's partial sums, in table order, and its local chunk where the table puts
it); the root's sum is the flow's result, and the gather copies it, unchanged, along the
tables' forward ports to every node. fp32 addition is not associative, so this order is what
"bit-exact" in docs/arithmetic.md means for tree schedules; numpy's float32 ``+`` is IEEE 754 binary32 with
round-to-nearest-even and subnormals kept.

Every format and operation of :mod:`wirereduce.formats` (fp32, bf16, fp16, int32 × SUM, MAX, MIN)
is computed the same way, on the payload words the frames carry: flows split the message by
32-bit words (two bf16/fp16 elements each) and each word's elements are combined with
:func:`wirereduce.formats.combine` (NaNs canonical, as the lanes give them).

With ``compression=k`` (fp32 only) it is the compressed collective of codec engines
(``EngineConfig(codec=True)``, docs/codec.md "On the schedule engine"): the hosts push
``quantize(x, k)``, every partial sum leaves its node compressed, so its parent adds
``quantize(partial, k)``, and the root's sum is compressed once more on its way to every host
(``quantize`` is idempotent, so the broadcast hops change nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wirereduce.formats import Op, check_typed_inputs, combine_words, from_words, to_words
from wirereduce.schedule import Schedule

__all__ = ["allreduce", "flow_result", "mismatches"]


def _quantized(w: np.ndarray, k: int) -> np.ndarray:
    """fp32 payload words (uint32) as a receiver of them compressed with ``k`` sees them."""
    from wirereduce.codec import quantize

    return quantize(w.view(np.float32), k).view(np.uint32)


def flow_result(words: Sequence[np.ndarray], schedule: Schedule, flow: int, fmt="fp32",
                op: Op | str = Op.SUM, compression: int | None = None,
                partials: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """The finished result of one flow (its share of the payload words), as its root computes it.

    ``words`` are the nodes' payload words (uint32, :func:`wirereduce.formats.to_words`), one
    array per node; returns uint32 words. ``compression``: as :func:`allreduce` (the root's sum
    before its last compression). ``partials``: if given, filled with every node's partial sum of
    the flow (uint32 words, before it is compressed on its way to the parent), by node.
    """
    op = Op[op.upper()] if isinstance(op, str) else Op(op)
    k = compression
    sl = schedule.split(words[0].size)[flow]
    entries = [t.entries[flow] for t in schedule.tables]
    partial: dict[int, np.ndarray] = {} if partials is None else partials

    def compute(u: int, depth: int) -> np.ndarray:
        if u in partial:
            return partial[u]
        if depth > schedule.nodes:
            raise ValueError(f"flow {flow}: the tables' children form a cycle")
        acc = None
        for term in entries[u].terms():
            if term is None:
                x = words[u][sl]
                if k is not None:
                    x = _quantized(x, k)   # the hosts push compressed
            else:   # a child's partial sum arrives compressed
                x = compute(term.node, depth + 1)
                if k is not None:
                    x = _quantized(x, k)
            acc = x.copy() if acc is None else combine_words(acc, x, fmt, op)
        if acc is None:
            raise ValueError(f"flow {flow}: node {u} adds nothing (no children, no local chunk)")
        partial[u] = acc
        return acc

    roots = [u for u, e in enumerate(entries) if e.parent is None]
    if len(roots) != 1:
        raise ValueError(f"flow {flow}: the tables name {len(roots)} roots")
    return compute(roots[0], 0)


def allreduce(arrays: Sequence[np.ndarray], schedule: Schedule, op: Op | str = Op.SUM,
              compression: int | None = None) -> list[np.ndarray]:
    """Every node's result of the allreduce ``schedule`` runs on ``arrays`` (one array per node).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, shape (n,), all float32, ml_dtypes.bfloat16, float16 or int32
    schedule : Schedule
    op : ``"sum"``, ``"max"``, ``"min"`` or :class:`~wirereduce.formats.Op`
    compression : int, optional
        Error-bound exponent k (4 … 24) of a compressed collective (module docstring): the hosts
        push ``quantize(x, k)``, every hop decompresses, combines and recompresses. fp32 only.

    Returns
    -------
    list of numpy.ndarray, the arrays' dtype, shape (n,), one per node
        Word range ``schedule.split(words)[f]`` holds flow f's result as it reached that node
        through the gather.

    Raises
    ------
    ValueError
        Bad inputs (:func:`wirereduce.formats.check_typed_inputs`, one array per node), or tables that
        do not describe a reduce and a gather reaching every node once; ``compression`` out of
        range or on another format than fp32.
    """
    fmt, arrays = check_typed_inputs(arrays, schedule.nodes)
    if compression is not None:
        from wirereduce.codec import check_k

        compression = check_k(compression)
        if fmt.name != "fp32":
            raise ValueError(f"compression is fp32-only (docs/codec.md); the arrays are {fmt.name}")
    words = [to_words(a, fmt) for a in arrays]
    n = words[0].size
    out = [np.empty(n, dtype=np.uint32) for _ in range(schedule.nodes)]
    for f, sl in enumerate(schedule.split(n)):
        result = flow_result(words, schedule, f, fmt, op, compression)
        if compression is not None:
            result = _quantized(result, compression)   # the root's sum leaves it compressed
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
    return [from_words(w, fmt, arrays[0].size) for w in out]


def mismatches(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Indices where ``got`` and ``want`` (arrays of one format) differ bit for bit.

    Both sides' NaNs are compared as bits: the golden model gives the canonical NaN the lanes give.

    Raises
    ------
    ValueError
        If the shapes or dtypes differ.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ValueError(f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
    u = np.uint32 if got.dtype.itemsize == 4 else np.uint16
    return np.flatnonzero(got.view(u) != want.view(u))
