"""numpy golden models of the allreduce, in the exact summation order of the hardware.

fp32 addition is not associative, so "the sum" is only defined together with an order. The
ring schedule of :mod:`wirereduce.hdl.node` adds rank by rank: rank 0's chunk enters the ring
unchanged, rank 1 computes ``g0 + g1``, rank 2 ``(g0 + g1) + g2``, …, and rank N-1's result is
broadcast to everyone. numpy's float32 ``+`` is IEEE 754 binary32 addition with
round-to-nearest-even and subnormals kept, the arithmetic SPEC.md fixes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["check_inputs", "ring_allreduce", "bit_mismatches"]


def check_inputs(arrays: Sequence[np.ndarray], nodes: int | None = None) -> list[np.ndarray]:
    """Validate one allreduce's inputs: one 1-D float32 array per node, all of equal length.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, each float32 of shape (n,)
    nodes : int, optional
        If given, the number of arrays required.

    Returns
    -------
    list of numpy.ndarray
        The arrays as contiguous little-endian float32.

    Raises
    ------
    ValueError
        On a wrong count of arrays, an array that is not float32, not 1-D, empty, or of another
        length than the first. Every message names the offending node.
    """
    arrays = [np.asarray(a) for a in arrays]
    if nodes is not None and len(arrays) != nodes:
        raise ValueError(f"expected {nodes} arrays (one per node), got {len(arrays)}")
    if len(arrays) < 2:
        raise ValueError(f"an allreduce needs at least 2 nodes, got {len(arrays)} array(s)")
    out = []
    for k, a in enumerate(arrays):
        if a.dtype.kind != "f" or a.dtype.itemsize != 4:  # float32 in either byte order
            raise ValueError(f"node{k}: dtype is {a.dtype}, but the allreduce sums float32 "
                             f"(convert with a.astype(np.float32) if that is what you mean)")
        if a.ndim != 1:
            raise ValueError(f"node{k}: shape {a.shape} is not 1-D (flatten it with a.ravel())")
        if a.size == 0:
            raise ValueError(f"node{k}: the array is empty; there is nothing to allreduce")
        if a.size != arrays[0].size:
            raise ValueError(f"node{k}: length {a.size} differs from node0's {arrays[0].size}; "
                             f"every node must contribute the same number of elements")
        out.append(np.ascontiguousarray(a, dtype="<f4"))
    return out


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
