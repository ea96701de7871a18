"""Checks of the arrays one allreduce sums, shared by the driver and the golden models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["check_inputs", "check_shape"]


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
        check_shape(k, a, arrays[0].size)
        out.append(np.ascontiguousarray(a, dtype="<f4"))
    return out


def check_shape(k: int, a: np.ndarray, length: int) -> None:
    """Node ``k``'s array must be 1-D, non-empty and ``length`` elements long (node 0's).

    Raises ValueError naming the node, with what to do about it."""
    if a.ndim != 1:
        raise ValueError(f"node{k}: shape {a.shape} is not 1-D (flatten it with a.ravel())")
    if a.size == 0:
        raise ValueError(f"node{k}: the array is empty; there is nothing to allreduce")
    if a.size != length:
        raise ValueError(f"node{k}: length {a.size} differs from node0's {length}; "
                         f"every node must contribute the same number of elements")
