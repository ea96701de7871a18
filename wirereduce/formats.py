"""Element formats and reduction operations: the header's ``dtype`` byte, packing, and the golden arithmetic.

The header byte ``dtype`` (docs/protocol.md) holds two fields::

    bits 0-3  element format  (:class:`~wirereduce.protocol.DType`: FP32 = 1, BF16 = 2, FP16 = 3, INT32 = 4)
    bits 4-7  operation       (:class:`Op`: SUM = 0, MAX = 1, MIN = 2)

so ``0x01`` is fp32 SUM (the only value before formats existed) and ``0x12`` bf16 MAX. A node checks
the whole byte of every data frame against its collective's (CONTROL's), and its reduce lanes
are set by the collective's: one bitstream serves every format.

**Payload.** Every payload is a whole number of 32-bit words, and the header's ``count`` counts
words. A word holds one fp32 or int32 element, or two bf16/fp16 elements (element ``2i`` in
bits 0-15, ``2i + 1`` in bits 16-31: a little-endian array's bytes as they are). An odd number of
16-bit elements is padded with one +0 element, which every operation keeps at +0
(:func:`to_words`, :func:`from_words`).

**Arithmetic** (:func:`combine`, what each adder lane computes, docs/arithmetic.md):

* fp32, bf16, fp16 SUM: the exact sum rounded once to the format, roundTiesToEven (IEEE 754-2019
  §4.3.1), subnormals kept, overflow to ±Inf (§7.4), ``x + (−x) = +0`` and ``(−0) + (−0) = −0``
  (§6.3); an invalid sum or a NaN operand gives the format's canonical quiet NaN
  (:data:`CANONICAL_NAN`). numpy's float16 and ml_dtypes' bfloat16 add in float32 and round
  the float32 sum to the format; that is the correctly rounded sum because binary32 carries at
  least 2p + 2 bits of precision for p = 8 (bf16) and p = 11 (fp16) and the same or a wider
  exponent range (double rounding is innocuous then: Figueroa, "When is double rounding
  innocuous?", SIGNUM Newsletter 30(3), 1995).
* int32 SUM: two's-complement addition modulo 2^32 (wraps, never saturates).
* MAX / MIN of floats: IEEE 754-2019 §9.6 ``maximum``/``minimum``: a NaN operand gives the
  canonical NaN, and −0 < +0. Of int32: signed comparison.

Summation order is fixed by the schedule (:mod:`wirereduce.sim.golden.schedule`); for MAX and MIN
the result does not depend on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from wirereduce.arrays import check_shape
from wirereduce.protocol import DType, ProtocolError

__all__ = ["Op", "Format", "FORMATS", "CANONICAL_NAN", "dtype_byte", "parse_dtype_byte", "supported_dtype_bytes",
           "check_formats", "format_of", "to_words", "from_words", "combine", "combine_words", "canonical_bits",
           "check_typed_inputs"]


class Op(enum.IntEnum):
    """Reduction operation (bits 4-7 of the header's ``dtype`` byte)."""

    SUM = 0
    MAX = 1
    MIN = 2


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Format:
    """One element format.

    Attributes
    ----------
    name : str
        ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"int32"`` (the CLI's ``--dtype`` choices).
    code : DType
        Bits 0-3 of the header's ``dtype`` byte.
    bits : int
        Bits of one element (32 or 16).
    exp_bits, frac_bits : int
        Exponent and stored fraction bits of a floating-point format (0, 0 for int32).
    """

    name: str
    code: DType
    bits: int
    exp_bits: int
    frac_bits: int

    @property
    def is_float(self) -> bool:
        return self.exp_bits > 0

    @property
    def per_word(self) -> int:
        """Elements per 32-bit payload word (1 or 2)."""
        return 32 // self.bits

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of this format's arrays (``ml_dtypes.bfloat16`` for bf16)."""
        return {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "int32": np.dtype(np.int32),
                "bf16": None}[self.name] or _bf16()

    @property
    def uint(self) -> np.dtype:
        """The unsigned integer dtype of the element's bit pattern."""
        return np.dtype(np.uint32 if self.bits == 32 else np.uint16)


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp32", DType.FP32, 32, 8, 23),
    Format("bf16", DType.BF16, 16, 8, 7),
    Format("fp16", DType.FP16, 16, 5, 10),
    Format("int32", DType.INT32, 32, 0, 0),
)}

#: The quiet NaN every invalid or NaN-input operation gives, per format: positive, the top fraction bit
#: set, no payload (what the gateware's lanes produce).
CANONICAL_NAN: dict[str, int] = {"fp32": 0x7FC0_0000, "bf16": 0x7FC0, "fp16": 0x7E00}


def _by_code(code: int) -> Format | None:
    return next((f for f in FORMATS.values() if f.code == code), None)


def format_of(x) -> Format:
    """The :class:`Format` of a name (``"bf16"``), a :class:`DType`, or a numpy dtype / array.

    Raises
    ------
    ValueError
        For anything else, naming the supported formats.
    """
    if isinstance(x, Format):
        return x
    if isinstance(x, str) and x in FORMATS:
        return FORMATS[x]
    if isinstance(x, DType) or (isinstance(x, int) and not isinstance(x, bool)):
        f = _by_code(int(x))
        if f is not None:
            return f
    try:
        dt = np.dtype(getattr(x, "dtype", x))
    except TypeError:
        dt = None
    if dt is not None:
        for f in FORMATS.values():
            if dt.newbyteorder("=") == f.numpy_dtype:
                return f
    raise ValueError(f"unsupported element format {x!r}: use one of {', '.join(FORMATS)} "
                     f"(numpy float32, ml_dtypes.bfloat16, float16, int32)")


def dtype_byte(fmt, op: Op | str | int = Op.SUM) -> int:
    """The header's ``dtype`` byte of format ``fmt`` and operation ``op`` (module docstring)."""
    f = format_of(fmt)
    if isinstance(op, str):
        try:
            op = Op[op.upper()]
        except KeyError:
            raise ValueError(f"unknown operation {op!r}: use sum, max or min") from None
    return int(f.code) | int(Op(op)) << 4


def check_formats(formats) -> tuple[str, ...]:
    """Validate the formats a set of reduce lanes is built with (``EngineConfig.formats``,
    :class:`~wirereduce.hdl.arith.lanes.ReduceLanes`).

    Parameters
    ----------
    formats : tuple of str
        Names of :data:`FORMATS`, at least ``"fp32"`` (the lanes compute fp32 SUM for a ``dtype``
        byte they do not know), each once.

    Returns
    -------
    tuple of str
        The names in :data:`FORMATS` order, so equal sets give equal tuples.

    Raises
    ------
    TypeError
        ``formats`` not a tuple of str (a lone name ``"fp32"`` is not ``("fp32",)``).
    ValueError
        Empty, an unknown name, a name twice, or no ``"fp32"``.
    """
    known = ", ".join(map(repr, FORMATS))
    if not isinstance(formats, tuple) or not all(isinstance(n, str) for n in formats):
        raise TypeError(f"formats must be a tuple of format names ({known}), e.g. ('fp32',), not {formats!r}")
    if not formats:
        raise ValueError(f"formats must name at least one format ({known}), with 'fp32' among them")
    unknown = [n for n in formats if n not in FORMATS]
    if unknown:
        raise ValueError(f"unknown format {unknown[0]!r} in formats {formats!r}: choose from {known}")
    twice = [n for n in FORMATS if formats.count(n) > 1]
    if twice:
        raise ValueError(f"format {twice[0]!r} is named twice in formats {formats!r}")
    if "fp32" not in formats:
        raise ValueError(f"formats {formats!r} must include 'fp32' (lanes compute fp32 SUM for a dtype byte "
                         f"they do not know)")
    return tuple(n for n in FORMATS if n in formats)


def supported_dtype_bytes(formats=None) -> list[int]:
    """Every ``dtype`` byte a schedule engine built with ``formats`` (format names, default every
    format of :data:`FORMATS`) takes: each of those formats × each operation."""
    return [dtype_byte(f, op) for f in (FORMATS if formats is None else formats) for op in Op]


def parse_dtype_byte(value: int) -> tuple[Format, Op]:
    """(format, operation) of a header ``dtype`` byte.

    Raises
    ------
    ProtocolError
        An unknown format or operation.
    """
    f = _by_code(value & 0xF)
    if f is None or (value >> 4) not in set(Op):
        raise ProtocolError(f"dtype byte 0x{value:02x}: format {value & 0xF} / operation {value >> 4} is not one "
                            f"of {[int(f.code) for f in FORMATS.values()]} / {[int(o) for o in Op]}")
    return f, Op(value >> 4)


def to_words(array: np.ndarray, fmt=None) -> np.ndarray:
    """The payload words of a 1-D array: uint32, shape (ceil(n / per_word),), an odd 16-bit tail padded with +0."""
    f = format_of(array.dtype if fmt is None else fmt)
    a = np.ascontiguousarray(array, dtype=f.numpy_dtype.newbyteorder("<"))
    bits = a.view(f.uint.newbyteorder("<")).astype(f.uint)
    if f.per_word == 2:
        if bits.size % 2:
            bits = np.concatenate([bits, np.zeros(1, f.uint)])
        pairs = bits.reshape(-1, 2).astype(np.uint32)
        return pairs[:, 0] | (pairs[:, 1] << np.uint32(16))
    return bits.astype(np.uint32)


def from_words(words: np.ndarray, fmt, n: int | None = None) -> np.ndarray:
    """Inverse of :func:`to_words`: the first ``n`` elements (default all) of format ``fmt``."""
    f = format_of(fmt)
    words = np.asarray(words, dtype=np.uint32)
    if f.per_word == 2:
        bits = np.empty(words.size * 2, np.uint16)
        bits[0::2] = (words & 0xFFFF).astype(np.uint16)
        bits[1::2] = (words >> 16).astype(np.uint16)
    else:
        bits = words.copy()
    out = bits.view(f.numpy_dtype)
    return out if n is None else out[:n]


def canonical_bits(bits: np.ndarray, fmt) -> np.ndarray:
    """``bits`` (the format's unsigned dtype) with every NaN replaced by the canonical NaN."""
    f = format_of(fmt)
    if not f.is_float:
        return bits
    exp_all = ((1 << f.exp_bits) - 1) << f.frac_bits
    frac = (1 << f.frac_bits) - 1
    nan = ((bits & exp_all) == exp_all) & ((bits & frac) != 0)
    return np.where(nan, f.uint.type(CANONICAL_NAN[f.name]), bits).astype(f.uint)


def _order_key(bits: np.ndarray, f: Format) -> np.ndarray:
    """An unsigned key ordered like the values: −0 < +0, negatives below positives (non-NaN floats)."""
    sign = f.uint.type(1 << (f.bits - 1))
    ones = f.uint.type((1 << f.bits) - 1)
    return np.where((bits & sign) != 0, bits ^ ones, bits | sign)


def combine(acc: np.ndarray, x: np.ndarray, fmt, op: Op = Op.SUM) -> np.ndarray:
    """One lane operation, elementwise: ``acc + x``, ``max(acc, x)`` or ``min(acc, x)`` in format ``fmt``.

    Parameters
    ----------
    acc, x : numpy.ndarray of the format's dtype, same shape

    Returns
    -------
    numpy.ndarray of the format's dtype: the results, bit-exact with the gateware's lanes (NaNs canonical).
    """
    f = format_of(fmt)
    op = Op(op)
    dt = f.numpy_dtype
    a = np.asarray(acc, dtype=dt)
    b = np.asarray(x, dtype=dt)
    if op == Op.SUM:
        with np.errstate(all="ignore"):   # overflow to Inf and Inf − Inf = NaN are defined results
            if f.name == "bf16":
                r = (a.astype(np.float32) + b.astype(np.float32)).astype(dt)
            else:
                r = np.add(a, b, dtype=dt)   # int32 wraps modulo 2**32
        return canonical_bits(r.view(f.uint), f).view(dt)
    if not f.is_float:
        pick_a = (a >= b) if op == Op.MAX else (a <= b)
        return np.where(pick_a, a, b).astype(dt)
    ab, bb = a.view(f.uint), b.view(f.uint)
    ka, kb = _order_key(ab, f), _order_key(bb, f)
    pick_a = (ka >= kb) if op == Op.MAX else (ka <= kb)
    r = np.where(pick_a, ab, bb).astype(f.uint)
    exp_all = ((1 << f.exp_bits) - 1) << f.frac_bits
    frac = (1 << f.frac_bits) - 1
    nan = lambda v: ((v & exp_all) == exp_all) & ((v & frac) != 0)  # noqa: E731
    r = np.where(nan(ab) | nan(bb), f.uint.type(CANONICAL_NAN[f.name]), r).astype(f.uint)
    return r.view(dt)


def combine_words(acc: np.ndarray, x: np.ndarray, fmt, op: Op = Op.SUM) -> np.ndarray:
    """:func:`combine` on payload words (uint32 arrays of equal shape), element by element within each word."""
    f = format_of(fmt)
    r = combine(from_words(acc, f), from_words(x, f), f, op)
    return to_words(r, f)


def check_typed_inputs(arrays, nodes: int | None = None, dtype=None) -> tuple[Format, list[np.ndarray]]:
    """Validate one allreduce's inputs of any supported format: 1-D arrays of one dtype and length.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, each 1-D of one of float32, ml_dtypes.bfloat16, float16, int32
    nodes : int, optional
        If given, the number of arrays required.
    dtype : str or Format, optional
        The format the arrays must have; default the first array's.

    Returns
    -------
    (Format, list of numpy.ndarray)
        The format, and the arrays as contiguous little-endian arrays of it.

    Raises
    ------
    ValueError
        A wrong count, an unsupported or mixed dtype, not 1-D, empty, or unequal lengths; the
        message names the node.
    """
    arrays = [np.asarray(a) for a in arrays]
    if nodes is not None and len(arrays) != nodes:
        raise ValueError(f"expected {nodes} arrays (one per node), got {len(arrays)}")
    if len(arrays) < 2:
        raise ValueError(f"an allreduce needs at least 2 nodes, got {len(arrays)} array(s)")
    try:
        f = format_of(arrays[0].dtype if dtype is None else dtype)
    except ValueError as e:
        raise ValueError(f"node0: {e}") from None
    out = []
    for k, a in enumerate(arrays):
        try:
            fk = format_of(a.dtype)
        except ValueError as e:
            raise ValueError(f"node{k}: {e}") from None
        if fk != f:
            raise ValueError(f"node{k}: dtype is {a.dtype}, but the allreduce is {f.name} "
                             f"(every node must give the same dtype; convert with a.astype(...))")
        check_shape(k, a, arrays[0].size)
        out.append(np.ascontiguousarray(a, dtype=f.numpy_dtype.newbyteorder("<")))
    return f, out
