"""The INCEPTIONN-style compressed wire format, codec v1 (``docs/codec.md``): encode, decode, sizes.

Shared by every layer: the host driver encodes and decodes payloads with it, the golden model
(:mod:`wirereduce.sim.golden.codec`) composes it into the compressed ring, and the gateware
(:mod:`wirereduce.hdl.codec`) is tested bit for bit against it.

The codec is lossy compression of fp32 gradients with an absolute error bound ``eb = 2**-k``
(``k`` a run-time register, 4 ≤ k ≤ 24; header field ``eb_k``, ``codec = INCEPTIONN_V1``). It
follows INCEPTIONN (Li et al., "A Network-Centric Hardware/Algorithm Co-Design to Accelerate
Distributed Training of Deep Neural Networks", MICRO 2018): one fixed exponent for every value
(fixed point with ``k`` fraction bits), the shifted mantissa with its leading 1 kept, and fewer
bits the closer a value is to zero. Per fp32 value ``g`` with sign bit ``s``:

===  =============================================  ==========  =======================
tag  condition                                      code bytes  decodes to
===  =============================================  ==========  =======================
0    ``|g| < 2**-k`` (incl. ±0 and subnormals)      0           ``+0.0``
1    ``q = floor(|g| * 2**k)``, ``1 ≤ q < 2**7``    1           ``(-1)**s * q * 2**-k``
2    ``2**7 ≤ q < 2**15``                           2           ``(-1)**s * q * 2**-k``
3    ``|g| ≥ 1``, ±Inf, NaN, or ``q ≥ 2**15``       4           ``g``, bit for bit
===  =============================================  ==========  =======================

(``q = 0`` exactly when ``|g| < 2**-k``, so tag 0 is the ``q = 0`` row.) Decoded values of tags 1
and 2 are exact in fp32 (``q`` has at most 15 bits, ``2**-k`` ≥ 2**-24 is normal), so the error
is ``|g| - q * 2**-k < 2**-k`` for tags 0–2 and 0 for tag 3.

Payload layout (one frame's payload of ``n`` elements; the element count ``n`` is the header's
``count``, ``k`` its ``eb_k``)::

    | tags: 2 bits per element, 8 * ceil(n / 32) bytes | codes: byte-aligned, element order |

* **Tags**, little-endian like the rest of the protocol: element ``i``'s tag is bits
  ``2*(i % 4)`` (low) and ``2*(i % 4) + 1`` (high) of byte ``i // 4``. Read as one little-endian
  integer ``T``, the tag of element ``i`` is ``(T >> 2*i) & 3``, so with byte ``j`` of a frame in
  bits ``8j .. 8j+7`` of a beat, a 64-bit beat holds the tags of 32 consecutive elements in order.
  The tag block is padded with zero bits to a multiple of 8 bytes (one 64-bit beat per 32
  elements).
* **Codes**, directly after the tag block, one per element with a non-zero tag, in element order,
  with no padding between them or after the last: tag 1 one byte ``s*2**7 + q``; tag 2 two bytes,
  little-endian ``s*2**15 + q``; tag 3 four bytes, the raw fp32 bits little-endian.

So the payload is ``8*ceil(n/32) + n1 + 2*n2 + 4*n3`` bytes (``n_t`` elements with tag ``t``)
and need not be a multiple of 4 or 8. Worst case (all tag 3) it is larger than the raw
``4*n`` bytes: see :func:`worst_case_size` and :func:`max_elements_compressed`.

In the ring every hop decompresses the arriving partial sum, adds its local values in fp32 and
recompresses (:func:`wirereduce.sim.golden.codec.ring_allreduce_compressed`). The codec is
elementwise, so splitting a gradient into frames does not change any value.

Everything here is vectorised numpy except :func:`encode_scalar` / :func:`decode_scalar`, a
plain-Python, readable statement of the per-value rule that the tests use as the independent
definition. NaN payloads are preserved exactly (all raw values are handled as ``uint32`` bits,
never through floating-point operations).
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "K_MIN",
    "K_MAX",
    "TAG_ZERO",
    "TAG_BYTE",
    "TAG_HALF",
    "TAG_RAW",
    "CODE_BYTES",
    "check_k",
    "tags",
    "quantize",
    "encode",
    "decode",
    "tag_bytes",
    "encoded_size",
    "worst_case_size",
    "max_elements_compressed",
    "compression_ratio",
    "encode_scalar",
    "decode_scalar",
]

#: Smallest and largest error-bound exponent: eb = 2**-k, K_MIN ≤ k ≤ K_MAX (docs/codec.md).
K_MIN = 4
K_MAX = 24

#: Tag values (2 bits per element).
TAG_ZERO = 0  # no code bytes, decodes to +0.0
TAG_BYTE = 1  # one byte s*2**7 + q, 1 ≤ q < 2**7
TAG_HALF = 2  # two bytes s*2**15 + q (little-endian), 2**7 ≤ q < 2**15
TAG_RAW = 3  # four bytes, the raw fp32 bits (little-endian)

#: Code bytes per tag, indexed by tag.
CODE_BYTES: tuple[int, int, int, int] = (0, 1, 2, 4)
_CODE_BYTES = np.array(CODE_BYTES, dtype=np.int64)

_ABS_MASK = np.uint32(0x7FFF_FFFF)
_ONE_BITS = np.uint32(0x3F80_0000)  # bits of 1.0f; |g| ≥ 1, Inf and NaN are exactly abs-bits ≥ this
_Q_BYTE_LIMIT = 1 << 7
_Q_HALF_LIMIT = 1 << 15


# --------------------------------------------------------------------------------------------------
# argument checks


def check_k(k: Any) -> int:
    """Validate the error-bound exponent ``k`` (error bound ``2**-k``).

    Parameters
    ----------
    k : int
        An integer (Python or numpy, not bool) with ``K_MIN ≤ k ≤ K_MAX`` (4 ≤ k ≤ 24).

    Returns
    -------
    int
        ``k`` as a Python int.

    Raises
    ------
    ValueError
        If ``k`` is not an integer or is outside 4 … 24.
    """
    if isinstance(k, bool):
        raise ValueError(f"k must be an integer in {K_MIN}..{K_MAX}, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise ValueError(f"k must be an integer in {K_MIN}..{K_MAX}, got {k!r}") from None
    if not K_MIN <= k <= K_MAX:
        raise ValueError(f"k must be in {K_MIN}..{K_MAX} (error bound 2**-k), got {k}")
    return k


def _as_f32(g: Any, name: str = "g") -> np.ndarray:
    """``g`` as a native-order float32 array (any shape), refusing other dtypes."""
    a = np.asarray(g)
    if a.dtype.kind != "f" or a.dtype.itemsize != 4:
        raise ValueError(f"{name}: dtype is {a.dtype}, but the codec encodes float32 "
                         f"(convert with g.astype(np.float32) if that is what you mean)")
    return np.ascontiguousarray(a, dtype=np.float32)


def _as_f32_vector(g: Any, name: str = "g") -> np.ndarray:
    a = _as_f32(g, name)
    if a.ndim != 1:
        raise ValueError(f"{name}: shape {a.shape} is not 1-D (flatten it with g.ravel())")
    return a


def _check_count(n: Any) -> int:
    if isinstance(n, bool):
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise ValueError(f"n must be a non-negative integer, got {n!r}") from None
    if n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n}")
    return n


# --------------------------------------------------------------------------------------------------
# vectorised per-value rule


def _classify(bits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Tags and magnitudes ``q`` of fp32 values given as uint32 ``bits`` (any shape).

    ``q`` is ``floor(|g| * 2**k)`` for values that are not raw by magnitude, else 0.
    """
    absbits = bits & _ABS_MASK
    big = absbits >= _ONE_BITS  # |g| ≥ 1, ±Inf, NaN
    # |g| < 1 here, so |g| * 2**k < 2**24 has at most 24 significant bits: the float64 product and
    # floor are exact (the power-of-two scaling of a float32, even a subnormal, loses nothing).
    small = np.where(big, np.uint32(0), absbits).view(np.float32)
    q = np.floor(small.astype(np.float64) * float(2**k)).astype(np.int64)
    t = np.full(bits.shape, TAG_RAW, dtype=np.uint8)
    t[q < _Q_HALF_LIMIT] = TAG_HALF
    t[q < _Q_BYTE_LIMIT] = TAG_BYTE
    t[q == 0] = TAG_ZERO
    t[big] = TAG_RAW
    return t, q


def tags(g: np.ndarray, k: int) -> np.ndarray:
    """The 2-bit codec tag of every element (docs/codec.md).

    Parameters
    ----------
    g : numpy.ndarray, float32, any shape
        Values to classify.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24 (error bound ``2**-k``).

    Returns
    -------
    numpy.ndarray, uint8, same shape as ``g``
        0 (``|g| < 2**-k``, no bits), 1 (one byte), 2 (two bytes) or 3 (raw 32 bits).

    Raises
    ------
    ValueError
        If ``g`` is not float32 or ``k`` is out of range.
    """
    k = check_k(k)
    g = _as_f32(g)
    return _classify(g.view(np.uint32), k)[0]


def _quantized_bits(bits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(result bits, tags, q) of decode(encode(g)) for values given as uint32 bits."""
    t, q = _classify(bits, k)
    # q * 2**-k for q < 2**15 is exact in float32; the sign goes back in as the sign bit.
    mag = (q.astype(np.float64) * 2.0 ** -k).astype(np.float32).view(np.uint32)
    out = mag | (bits & np.uint32(0x8000_0000))
    out = np.where(t == TAG_RAW, bits, out)
    out = np.where(t == TAG_ZERO, np.uint32(0), out)
    return out, t, q


def quantize(g: np.ndarray, k: int) -> np.ndarray:
    """``decode(encode(g))`` elementwise: the value every receiver of a compressed ``g`` sees.

    Parameters
    ----------
    g : numpy.ndarray, float32, any shape
        Values to compress.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24 (error bound ``2**-k``).

    Returns
    -------
    numpy.ndarray, float32, same shape as ``g``
        ``|g| ≥ 1``, ±Inf and NaN unchanged bit for bit (NaN payload included); ``|g| < 2**-k``
        (±0 and subnormals included) ``+0.0``; otherwise with ``q = floor(|g| * 2**k)``:
        ``(-1)**s * q * 2**-k`` if ``q < 2**15``, else ``g`` unchanged. Always
        ``|quantize(g) - g| < 2**-k`` for finite ``g``; the function is idempotent.

    Raises
    ------
    ValueError
        If ``g`` is not float32 or ``k`` is out of range.

    Notes
    -----
    docs/codec.md; INCEPTIONN, Li et al., MICRO 2018.
    """
    k = check_k(k)
    g = _as_f32(g)
    return _quantized_bits(g.view(np.uint32), k)[0].view(np.float32)


# --------------------------------------------------------------------------------------------------
# payload


def tag_bytes(n: int) -> int:
    """Bytes of the tag block of an ``n``-element payload: 2 bits each, padded to 8 bytes."""
    n = _check_count(n)
    return 8 * ((n + 31) // 32)


def worst_case_size(n: int) -> int:
    """Largest payload of ``n`` elements (every element tag 3): ``tag_bytes(n) + 4*n`` bytes."""
    return tag_bytes(n) + 4 * _check_count(n)


def max_elements_compressed(mtu: int) -> int:
    """Most elements a compressed frame can hold whatever the values are, for Ethernet MTU ``mtu``.

    The largest ``n`` with ``16 + worst_case_size(n) ≤ mtu`` (16 = header bytes): 349 at MTU 1500
    and 2112 at MTU 9000 (raw fp32 frames hold 371 and 2246).

    Raises
    ------
    ValueError
        If the MTU cannot carry the header and one element's worst case.
    """
    from wirereduce.protocol import HEADER_BYTES

    room = operator.index(mtu) - HEADER_BYTES
    n = max(0, (room * 32) // 130)  # 4n + n/4 ≤ room, then fix the ceil of the tag block
    while n > 0 and worst_case_size(n) > room:
        n -= 1
    while worst_case_size(n + 1) <= room:
        n += 1
    if n < 1:
        raise ValueError(f"MTU {mtu} cannot carry the {HEADER_BYTES}-byte header and one compressed element")
    return n


def encoded_size(g: np.ndarray, k: int) -> int:
    """Bytes of ``encode(g, k)``, computed without building the payload.

    Parameters
    ----------
    g : numpy.ndarray, float32, shape (n,)
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24.

    Returns
    -------
    int
        ``8*ceil(n/32) + n1 + 2*n2 + 4*n3`` bytes, ``n_t`` the number of elements with tag ``t``.

    Raises
    ------
    ValueError
        If ``g`` is not a 1-D float32 array or ``k`` is out of range.
    """
    k = check_k(k)
    g = _as_f32_vector(g)
    t = _classify(g.view(np.uint32), k)[0]
    return tag_bytes(g.size) + int(_CODE_BYTES[t].sum())


def compression_ratio(g: np.ndarray, k: int) -> float:
    """Raw payload bytes over compressed payload bytes, ``4*n / encoded_size(g, k)``.

    Headers and Ethernet framing are not counted. Below 1 when most values are raw (tag 3).

    Raises
    ------
    ValueError
        If ``g`` is not a non-empty 1-D float32 array or ``k`` is out of range.
    """
    g = _as_f32_vector(g)
    if g.size == 0:
        raise ValueError("g is empty; the compression ratio of no elements is undefined")
    return 4 * g.size / encoded_size(g, k)


def encode(g: np.ndarray, k: int) -> bytes:
    """Compress a vector of fp32 values into one payload (docs/codec.md, layout above).

    Parameters
    ----------
    g : numpy.ndarray, float32, shape (n,)
        The values, in element order. ``n = 0`` gives an empty payload.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24 (error bound ``2**-k``).

    Returns
    -------
    bytes
        ``8*ceil(n/32)`` bytes of 2-bit tags (element ``i`` in bits ``2*(i%4)``.. of byte ``i//4``,
        zero padded), then the codes in element order: tag 1 one byte ``s*2**7 + q``, tag 2 two
        bytes little-endian ``s*2**15 + q``, tag 3 the four raw fp32 bytes little-endian, tag 0
        nothing. ``len(result) == encoded_size(g, k)``.

    Raises
    ------
    ValueError
        If ``g`` is not a 1-D float32 array or ``k`` is out of range.
    """
    k = check_k(k)
    g = _as_f32_vector(g)
    n = g.size
    bits = g.view(np.uint32)
    t, q = _classify(bits, k)
    sign = (bits >> np.uint32(31)).astype(np.int64)

    # Tag block: four tags per byte, element 4j+m in bits 2m, 2m+1 of byte j.
    tb = tag_bytes(n)
    padded = np.zeros(4 * ((n + 3) // 4), dtype=np.uint8)
    padded[:n] = t
    quads = padded.reshape(-1, 4)
    packed = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)

    sizes = _CODE_BYTES[t]
    offsets = tb + np.cumsum(sizes) - sizes  # byte offset of each element's code in the payload
    out = np.zeros(tb + int(sizes.sum()), dtype=np.uint8)
    out[: packed.size] = packed

    m1 = t == TAG_BYTE
    out[offsets[m1]] = (sign[m1] << 7) | q[m1]
    m2 = t == TAG_HALF
    code2 = (sign[m2] << 15) | q[m2]
    out[offsets[m2]] = code2 & 0xFF
    out[offsets[m2] + 1] = code2 >> 8
    m3 = t == TAG_RAW
    raw = bits[m3]
    for byte in range(4):
        out[offsets[m3] + byte] = (raw >> np.uint32(8 * byte)) & np.uint32(0xFF)
    return out.tobytes()


def decode(payload: bytes, n: int, k: int) -> np.ndarray:
    """Decompress one payload of ``n`` elements (the inverse of :func:`encode`).

    Parameters
    ----------
    payload : bytes-like
        The compressed payload (``bytes``, ``bytearray``, ``memoryview`` or a uint8 array).
    n : int
        Element count (the header's ``count``), >= 0.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24 (the header's ``eb_k``).

    Returns
    -------
    numpy.ndarray, float32, shape (n,)
        Tag 0 → ``+0.0``; tags 1 and 2 → ``(-1)**s * q * 2**-k``; tag 3 → the raw bits, NaN
        payloads included. Codes that :func:`encode` never emits (a tag-1 or tag-2 code whose ``q``
        belongs to a smaller tag, or a tag-3 value that would have been compressed) decode by the
        same formulas, as a decompressor that does not check them would; e.g. tag 1 with
        ``s = 1, q = 0`` gives ``-0.0``.

    Raises
    ------
    ValueError
        If ``k`` or ``n`` is out of range, the payload is shorter than its tag block, a padding
        bit of the tag block is not zero, or the payload is shorter (truncated) or longer than the
        codes its tags announce. The message gives the expected and actual lengths.
    """
    k = check_k(k)
    n = _check_count(n)
    buf = np.frombuffer(memoryview(payload).cast("B"), dtype=np.uint8)
    tb = tag_bytes(n)
    if buf.size < tb:
        raise ValueError(f"compressed payload of {buf.size} bytes is truncated: the tag block of "
                         f"{n} elements alone is {tb} bytes")
    t = ((buf[:tb, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & np.uint8(3)).ravel()
    if np.any(t[n:]):
        first = n + int(np.flatnonzero(t[n:])[0])
        raise ValueError(f"compressed payload: tag-block padding is not zero (tag slot {first}, "
                         f"but the payload has only {n} elements)")
    t = t[:n]
    sizes = _CODE_BYTES[t]
    want = tb + int(sizes.sum())
    if buf.size != want:
        what = "truncated" if buf.size < want else "too long"
        counts = np.bincount(t, minlength=4)
        raise ValueError(f"compressed payload is {what}: its tags announce {want} bytes "
                         f"({tb} tag bytes + codes of {counts[1]}x1, {counts[2]}x2, {counts[3]}x4 bytes) "
                         f"for {n} elements, got {buf.size}")
    offsets = tb + np.cumsum(sizes) - sizes
    code = np.zeros(n, dtype=np.uint32)
    for byte in range(4):  # gather up to four little-endian bytes per element
        m = sizes > byte
        code[m] |= buf[offsets[m] + byte].astype(np.uint32) << np.uint32(8 * byte)

    out = np.zeros(n, dtype=np.uint32)
    for tag, qbits in ((TAG_BYTE, 7), (TAG_HALF, 15)):
        m = t == tag
        c = code[m]
        mag = ((c & np.uint32((1 << qbits) - 1)).astype(np.float64) * 2.0 ** -k).astype(np.float32)
        out[m] = mag.view(np.uint32) | ((c >> np.uint32(qbits)) << np.uint32(31))
    m = t == TAG_RAW
    out[m] = code[m]
    return out.view(np.float32)


# --------------------------------------------------------------------------------------------------
# plain-Python reference of the per-value rule


def _f32_bits(x: Any) -> int:
    """The 32 bits of ``x`` as float32 (np.float32 scalars keep NaN payloads bit for bit)."""
    return int(np.asarray(x, dtype=np.float32).reshape(()).view(np.uint32))


def encode_scalar(x: Any, k: int) -> tuple[int, bytes]:
    """Encode one fp32 value, spelled out in plain Python (the readable definition of codec v1).

    Parameters
    ----------
    x : numpy.float32 (or a Python number, converted with ``np.float32(x)``)
        The value.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24.

    Returns
    -------
    (int, bytes)
        The tag (0..3) and its code bytes (0, 1, 2 or 4 bytes, little-endian).

    Raises
    ------
    ValueError
        If ``k`` is out of range.
    """
    k = check_k(k)
    bits = _f32_bits(x)
    s = bits >> 31
    exponent_field = (bits >> 23) & 0xFF
    if exponent_field == 0xFF:  # ±Inf or NaN
        return TAG_RAW, bits.to_bytes(4, "little")
    magnitude = abs(Fraction(float(np.uint32(bits).view(np.float32))))  # exact: float32 → float64 → Fraction
    if magnitude >= 1:
        return TAG_RAW, bits.to_bytes(4, "little")
    q = math.floor(magnitude * 2**k)
    if q == 0:  # |x| < 2**-k, including ±0 and subnormals
        return TAG_ZERO, b""
    if q < 2**7:
        return TAG_BYTE, (s * 2**7 + q).to_bytes(1, "little")
    if q < 2**15:
        return TAG_HALF, (s * 2**15 + q).to_bytes(2, "little")
    return TAG_RAW, bits.to_bytes(4, "little")


def decode_scalar(tag: int, code: bytes, k: int) -> np.float32:
    """Decode one value from its tag and code bytes, in plain Python (inverse of :func:`encode_scalar`).

    Parameters
    ----------
    tag : int
        0, 1, 2 or 3.
    code : bytes
        Exactly ``CODE_BYTES[tag]`` bytes.
    k : int
        Error-bound exponent, 4 ≤ k ≤ 24.

    Returns
    -------
    numpy.float32
        ``+0.0`` (tag 0), ``(-1)**s * q * 2**-k`` (tags 1, 2) or the raw value bit for bit (tag 3).

    Raises
    ------
    ValueError
        On a bad tag, a code of the wrong length, or ``k`` out of range.
    """
    k = check_k(k)
    if tag not in (0, 1, 2, 3):
        raise ValueError(f"tag must be 0..3, got {tag!r}")
    code = bytes(code)
    if len(code) != CODE_BYTES[tag]:
        raise ValueError(f"tag {tag} takes {CODE_BYTES[tag]} code bytes, got {len(code)}")
    if tag == TAG_ZERO:
        return np.float32(0.0)
    word = int.from_bytes(code, "little")
    if tag == TAG_RAW:
        return np.array([word], dtype=np.uint32).view(np.float32)[0]
    qbits = 7 if tag == TAG_BYTE else 15
    s, q = word >> qbits, word & ((1 << qbits) - 1)
    value = Fraction(q, 2**k)  # exact in float32: q < 2**15 and 2**-k is a normal float32
    return np.float32(float(-value if s else value)) if q else np.float32(-0.0 if s else 0.0)
