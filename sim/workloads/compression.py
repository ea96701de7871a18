"""Compression ratios of the demo CNN's real gradients at the start, middle and end of training.

``wirereduce workload compression-ratios`` prints the table.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
from wirereduce.sim.golden.codec import ring_allreduce_compressed, ring_payloads

from wirereduce.codec import check_k, compression_ratio, encoded_size, tags

__all__ = ["compression_table", "format_table"]

# --------------------------------------------------------------------------------------------------
# compression ratios of real gradients


def _ratio_record(payloads: Sequence[np.ndarray], k: int) -> dict[str, float]:
    raw = sum(4 * p.size for p in payloads)
    size = sum(encoded_size(p, k) for p in payloads)
    counts = np.zeros(4, dtype=np.int64)
    for p in payloads:
        counts += np.bincount(tags(p, k), minlength=4)
    rec: dict[str, float] = {"ratio": raw / size}
    total = counts.sum()
    for t in range(4):
        rec[f"tag{t}"] = float(counts[t] / total)
    return rec


def compression_table(
    ks: Sequence[int] = (8, 10, 12, 14),
    nodes: int = 4,
    epochs: int = 20,
    seed: int = 0,
    batch: int = 64,
) -> list[dict[str, Any]]:
    """Compression ratios of the demo CNN's real gradients at the start, middle and end of training.

    Trains the demo model (:mod:`wirereduce.sim.workloads.gradients`: 3,818-parameter CNN on scikit-learn's
    digits, data-parallel SGD over ``nodes`` workers, exact numpy-float32 allreduce) for ``epochs``
    epochs and records the per-worker gradients of the first step, the middle step and the last
    step. For each of those steps and each ``k`` it reports three ratios (raw fp32 payload bytes
    over compressed payload bytes; headers and framing not counted):

    * ``worker``: the N per-worker gradients, each compressed on its own (the first ring hop
      carries one of them);
    * ``sum``: the final sum of the compressed ring (what the N-1 broadcast hops carry);
    * ``ring``: all 2(N-1) ring hops of :func:`ring_allreduce_compressed` together (N-1 reduce hops
      carrying the growing partial sums, then N-1 broadcast hops carrying the final sum),

    and the fraction of each tag over the ring's hops.

    Parameters
    ----------
    ks : sequence of int
        Error-bound exponents, each 4 ≤ k ≤ 24.
    nodes : int
        Workers ``N`` >= 2.
    epochs : int
        Training epochs, >= 2 (one epoch is ``ceil((1438 // N) / batch)`` steps).
    seed : int
        Seed of the data split, initialisation and batch order (same seed, same numbers).
    batch : int
        Mini-batch size per worker.

    Returns
    -------
    list of dict
        One record per (phase, k), phases in the order start, middle, end: ``"phase"`` (str),
        ``"step"`` (int, 0-based training step), ``"k"`` (int), ``"worker_ratio"``,
        ``"sum_ratio"``, ``"ring_ratio"`` (float), ``"tag0"`` … ``"tag3"`` (float fractions of the
        ring's elements, summing to 1), ``"rel_error"`` (float, ``max|ring_allreduce_compressed -
        exact sum| / max|exact sum|``) and ``"test_accuracy"`` (float, of the exactly trained
        model after all epochs; the same in every record).

    Raises
    ------
    ValueError
        On an out-of-range ``k``, ``nodes`` < 2 or ``epochs`` < 2.
    RuntimeError
        If PyTorch or scikit-learn is not installed.
    """
    from wirereduce.sim.golden.allreduce import ring_allreduce
    from wirereduce.sim.workloads import gradients as G

    ks = [check_k(k) for k in ks]
    if operator.index(nodes) < 2:
        raise ValueError(f"nodes must be >= 2 for a ring, got {nodes}")
    if operator.index(epochs) < 2:
        raise ValueError(f"epochs must be >= 2 to have a start, a middle and an end, got {epochs}")

    captured: list[list[np.ndarray]] = []

    def allreduce(grads: list[np.ndarray]) -> np.ndarray:
        captured.append([np.array(g, dtype=np.float32, copy=True) for g in grads])
        return ring_allreduce(grads)

    history = G.train_data_parallel(nodes, epochs, allreduce, seed=seed, batch=batch)
    steps = len(captured)
    phases = (("start", 0), ("middle", steps // 2), ("end", steps - 1))
    records: list[dict[str, Any]] = []
    for phase, step in phases:
        grads = captured[step]
        exact = ring_allreduce(grads)
        scale = float(np.max(np.abs(exact.astype(np.float64))))
        for k in ks:
            ring = _ratio_record(ring_payloads(grads, k), k)
            comp = ring_allreduce_compressed(grads, k)
            err = float(np.max(np.abs(comp.astype(np.float64) - exact.astype(np.float64))))
            records.append({
                "phase": phase,
                "step": step,
                "k": k,
                "worker_ratio": _ratio_record(grads, k)["ratio"],
                "sum_ratio": compression_ratio(comp, k),
                "ring_ratio": ring["ratio"],
                **{f"tag{t}": ring[f"tag{t}"] for t in range(4)},
                "rel_error": err / scale if scale else 0.0,
                "test_accuracy": float(history[-1]["test_accuracy"]),
            })
    return records


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Render :func:`compression_table` records as a fixed-width text table."""
    head = (f"{'phase':<7} {'step':>4} {'k':>3} {'worker':>7} {'sum':>7} {'ring':>7} "
            f"{'tag0':>6} {'tag1':>6} {'tag2':>6} {'tag3':>6} {'rel_err':>9}")
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['phase']:<7} {r['step']:>4} {r['k']:>3} {r['worker_ratio']:>6.2f}x {r['sum_ratio']:>6.2f}x "
            f"{r['ring_ratio']:>6.2f}x {r['tag0']:>6.1%} {r['tag1']:>6.1%} {r['tag2']:>6.1%} {r['tag3']:>6.1%} "
            f"{r['rel_error']:>9.2e}"
        )
    return "\n".join(lines)
