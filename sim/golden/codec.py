"""Golden model of the compressed ring allreduce (``docs/codec.md``), in the hardware's order.

Every hop decompresses the arriving partial sum, adds its local values in fp32 and recompresses,
with the wire format of :mod:`wirereduce.codec`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wirereduce.arrays import check_inputs
from wirereduce.codec import check_k, quantize

__all__ = ["ring_allreduce_compressed", "ring_payloads"]


# --------------------------------------------------------------------------------------------------
# compressed allreduce


def ring_allreduce_compressed(arrays: Sequence[np.ndarray], k: int, *, host_compressed: bool = False) -> np.ndarray:
    """The sum every host receives from the compressed ring, in the hardware's order.

    Rank 0 sends ``p = quantize(x0)``; every rank ``r = 1 .. N-1`` decompresses the arriving
    partial sum, adds its local values in fp32 and recompresses, ``p = quantize(p + x_r)``; rank
    N-1's ``p`` is what the broadcast carries (unchanged: :func:`quantize` is idempotent) and every
    host receives. The codec is elementwise, so chunking into frames changes nothing.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, float32, shape (n,), one per rank in rank order
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24; checked before anything else.
    host_compressed : bool
        The hosts push their gradients compressed too (``allreduce(..., compression=k)`` of the
        driver, which a codec node decompresses on arrival): every ``x_r`` is replaced by
        ``quantize(x_r)`` before it is added.

    Returns
    -------
    numpy.ndarray, float32, shape (n,)

    Raises
    ------
    ValueError
        If ``k`` is out of range, or as :func:`wirereduce.sim.golden.check_inputs`.

    Notes
    -----
    docs/codec.md "In the ring": "Each hop decompresses, adds its local values, and
    recompresses"; INCEPTIONN (MICRO 2018) compresses on every hop the same way.
    """
    k = check_k(k)
    arrays = check_inputs(arrays)
    if host_compressed:
        arrays = [quantize(x, k) for x in arrays]
    p = quantize(arrays[0], k)
    with np.errstate(all="ignore"):  # overflow to Inf and Inf - Inf = NaN are defined results
        for x in arrays[1:]:
            p = quantize(np.add(p, x, dtype=np.float32), k)
    return p


def ring_payloads(arrays: Sequence[np.ndarray], k: int, *, host_compressed: bool = False) -> list[np.ndarray]:
    """What the compressed ring sends, hop by hop: N-1 reduce hops, then N-1 broadcast hops.

    Reduce hop r → r+1 carries the partial sum through rank r *before* compression (encoding it
    gives the same payload as encoding its quantized value); every broadcast hop carries the final
    sum. ``host_compressed`` as in :func:`ring_allreduce_compressed`: the hosts push ``quantize(x_r)``,
    so those are what is added. It matters: on the demo CNN's gradients the sums of quantized
    values compress worse (k = 8, 4 MiB: the final sum 11 % more bytes), and those are the frames
    a host-compressed ring carries (measured in the gateware, docs/codec.md "Where the time goes").
    """
    arrays = check_inputs(arrays)
    if host_compressed:
        arrays = [quantize(x, k) for x in arrays]
    sent = []
    p = arrays[0]
    with np.errstate(all="ignore"):
        for x in arrays[1:]:
            sent.append(p)
            p = np.add(quantize(p, k), x, dtype=np.float32)
    final = quantize(p, k)
    return sent + [final] * (len(arrays) - 1)
