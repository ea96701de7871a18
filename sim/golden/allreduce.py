"""numpy golden models of the allreduce, in the exact summation order of the hardware.

fp32 addition is not associative, so "the sum" is only defined together with an order. The NTT ring
schedule (``ring:N``, ``ring``, one flow on the schedule engine) adds rank by rank: rank 0's chunk
enters the ring unchanged, rank 1 computes ``g0 + g1``, rank 2 ``(g0 + g1) + g2``, …, and rank N-1's
result is broadcast to everyone. numpy's float32 ``+`` is IEEE 754 binary32 addition with
round-to-nearest-even and subnormals kept, the arithmetic docs/arithmetic.md fixes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wirereduce.arrays import check_inputs

__all__ = ["check_inputs", "ring_allreduce", "bit_mismatches"]


def ring_allreduce(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The sum every node receives from the ring schedule: ``((g0 + g1) + g2) + …`` in float32.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, float32, shape (n,), one per rank in rank order

    Returns
    -------
    numpy.ndarray, float32, shape (n,)

    Raises
    ------
    ValueError
        As :func:`check_inputs`.
    """
    arrays = check_inputs(arrays)
    acc = arrays[0].copy()
    with np.errstate(all="ignore"):  # overflow to Inf and Inf - Inf = NaN are defined results
        for a in arrays[1:]:
            acc = np.add(acc, a, dtype=np.float32)
    return acc


def bit_mismatches(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Indices where ``got`` and ``want`` (float32) differ bit for bit; any NaN matches any NaN.

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape} differs from the expected {want.shape}")
    both_nan = np.isnan(got) & np.isnan(want)
    return np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)) & ~both_nan)
