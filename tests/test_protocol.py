"""Tests of wirereduce.protocol: the header, its gateware view, MTU and wire-byte arithmetic."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from amaranth.lib import data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wirereduce.protocol import (
    ETH_HEADER_BYTES,
    ETH_MIN_PAYLOAD_BYTES,
    ETH_OVERHEAD_BYTES,
    ETHERTYPE,
    HEADER_BYTES,
    HEADER_FIELDS,
    STATS_COUNTERS,
    VERSION,
    Codec,
    DType,
    Header,
    Opcode,
    ProtocolError,
    frame,
    header_layout,
    max_elements,
    wire_bytes,
)

WIDTHS = dict(HEADER_FIELDS)
NAMES = [name for name, _ in HEADER_FIELDS]

# Deterministic: no example database, a fixed derivation of examples from the test's source.
FIXED = settings(derandomize=True, database=None, max_examples=200, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def _field_values():
    return st.fixed_dictionaries({name: st.integers(0, (1 << bits) - 1) for name, bits in HEADER_FIELDS})


def _offsets() -> dict[str, int]:
    """Bit offset of each field, computed from HEADER_FIELDS by hand (not from the StructLayout)."""
    out, pos = {}, 0
    for name, bits in HEADER_FIELDS:
        out[name] = pos
        pos += bits
    return out


# --- constants -----------------------------------------------------------------------------------

def test_constants():
    assert ETHERTYPE == 0x88B5
    assert HEADER_BYTES == 16 and HEADER_BYTES % 8 == 0
    assert sum(bits for _, bits in HEADER_FIELDS) == 8 * HEADER_BYTES
    assert len(set(NAMES)) == len(NAMES)
    # every field is byte-aligned and a whole number of bytes, so the header is a byte struct
    assert all(bits in (8, 16, 32) for _, bits in HEADER_FIELDS)
    assert all(off % 8 == 0 for off in _offsets().values())
    # every field docs/protocol.md "Header (16 bytes)" requires exists
    for name in ("version", "opcode", "collective", "seq", "count", "dtype", "codec", "eb_k", "src", "hop"):
        assert name in WIDTHS
    assert len(Header(opcode=Opcode.REDUCE).pack()) == HEADER_BYTES


def test_opcodes_distinct_and_fit():
    values = [int(op) for op in Opcode]
    assert len(set(values)) == len(values)
    assert all(0 < v < 1 << WIDTHS["opcode"] for v in values)
    assert {op.name for op in Opcode} >= {"REDUCE", "BROADCAST", "HOST_PUSH", "HOST_RESULT", "CONTROL",
                                          "STATS_REQUEST", "STATS"}
    assert all(0 <= int(c) < 1 << WIDTHS["codec"] for c in Codec)
    assert all(0 <= int(d) < 1 << WIDTHS["dtype"] for d in DType)


def test_header_defaults():
    h = Header(opcode=Opcode.HOST_PUSH)
    assert h.version == VERSION and h.dtype == DType.FP32 and h.codec == Codec.NONE
    assert h.collective == h.seq == h.count == h.src == h.hop == h.flags == h.eb_k == 0
    assert "HOST_PUSH" in repr(h)


# --- pack / unpack -------------------------------------------------------------------------------

@FIXED
@given(_field_values())
def test_pack_unpack_round_trip(values):
    h = Header(**values)
    raw = h.pack()
    assert len(raw) == HEADER_BYTES
    assert Header.unpack(raw) == h
    # trailing payload bytes do not disturb the header
    assert Header.unpack(raw + bytes(range(37))) == h


@FIXED
@given(_field_values())
def test_pack_is_little_endian_at_the_field_offsets(values):
    raw = Header(**values).pack()
    for name, off in _offsets().items():
        nbytes = WIDTHS[name] // 8
        assert int.from_bytes(raw[off // 8:off // 8 + nbytes], "little") == values[name], name


@FIXED
@given(_field_values())
def test_gateware_view_agrees(values):
    h = Header(**values)
    as_int = h.to_int()
    assert as_int == int.from_bytes(h.pack(), "little")
    view = data.Const(header_layout(), as_int)
    offsets = _offsets()
    for name, bits in HEADER_FIELDS:
        # the StructLayout's view of the integer
        assert int(getattr(view, name)) == values[name], name
        # an independent bit slice at the offset computed from HEADER_FIELDS
        assert (as_int >> offsets[name]) & ((1 << bits) - 1) == values[name], name


def test_header_layout_shape():
    lay = header_layout()
    assert lay.size == 8 * HEADER_BYTES
    offsets = _offsets()
    for name, bits in HEADER_FIELDS:
        assert lay[name].offset == offsets[name]
        assert lay[name].width == bits


@pytest.mark.parametrize("name,bits", HEADER_FIELDS)
def test_field_out_of_range_raises(name, bits):
    base = {"opcode": Opcode.REDUCE}
    Header(**{**base, name: (1 << bits) - 1}).pack()  # the largest value fits
    with pytest.raises(ProtocolError, match=name):
        Header(**{**base, name: 1 << bits}).pack()
    with pytest.raises(ProtocolError, match=name):
        Header(**{**base, name: -1}).pack()
    with pytest.raises(ProtocolError):
        Header(**{**base, name: 1 << bits}).to_int()


def test_protocol_error_is_a_value_error():
    assert issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize("n", range(HEADER_BYTES))
def test_unpack_short_raises(n):
    with pytest.raises(ProtocolError, match="shorter"):
        Header.unpack(bytes(n))


def test_frame_payload_is_little_endian_fp32():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(11).astype(np.float32)
    h = Header(opcode=Opcode.HOST_PUSH, count=x.size, seq=3)
    raw = frame(h, x)
    assert raw[:HEADER_BYTES] == h.pack()
    assert raw[HEADER_BYTES:] == struct.pack(f"<{x.size}f", *x.tolist())
    # big-endian input arrays are written little-endian all the same
    assert frame(h, x.astype(">f4")) == raw
    assert frame(h, b"\x01\x02") == h.pack() + b"\x01\x02"


# --- MTU and wire bytes --------------------------------------------------------------------------

@pytest.mark.parametrize("mtu", [1500, 9000])
def test_max_elements_standard_mtus(mtu):
    want = (mtu - 16) // 4
    assert max_elements(mtu) == want
    # the full frame fits the MTU, one more element would not
    assert 16 + 4 * want <= mtu < 16 + 4 * (want + 1)
    # the element count fits the header's count field
    assert want < 1 << WIDTHS["count"]


def test_max_elements_values():
    assert max_elements(1500) == 1484 // 4
    assert max_elements(9000) == 8984 // 4
    assert max_elements(HEADER_BYTES + 4) == 1


@pytest.mark.parametrize("mtu", [0, 1, HEADER_BYTES, HEADER_BYTES + 3, -100])
def test_max_elements_tiny_mtu_raises(mtu):
    with pytest.raises(ProtocolError, match="MTU"):
        max_elements(mtu)


@pytest.mark.parametrize("frame_bytes", [0, 16, 20, 45, 46, 47, 100, 1500, 9000])
def test_wire_bytes(frame_bytes):
    # Ethernet header + payload padded to 46 + preamble/SFD 8 + FCS 4 + IFG 12
    want = 14 + max(frame_bytes, 46) + 8 + 4 + 12
    assert wire_bytes(frame_bytes) == want
    assert ETH_HEADER_BYTES + ETH_OVERHEAD_BYTES == 14 + 24
    assert ETH_MIN_PAYLOAD_BYTES == 46


def test_wire_bytes_minimum_frame_is_84():
    # the smallest Ethernet frame (64 bytes incl. FCS) plus preamble and IFG costs 84 bytes
    assert wire_bytes(HEADER_BYTES + 4) == 64 + 8 + 12
    assert wire_bytes(1) == wire_bytes(46)
    assert wire_bytes(47) == wire_bytes(46) + 1


def test_stats_counters():
    assert len(set(STATS_COUNTERS)) == len(STATS_COUNTERS)
    assert STATS_COUNTERS[:5] == ("collective", "rank", "nodes", "chunks", "request_tag")
    # a STATS frame fits a standard 1500-byte MTU
    assert HEADER_BYTES + 4 * len(STATS_COUNTERS) <= 1500


def test_engine_stats_layouts():
    """A schedule engine's STATS layout per port count: unique names, its port count and every
    port's counters in :func:`engine_port_counters` order, a ``count`` no other layout (the ring
    node's 71 included) has, so :func:`stats_counters` finds it from the header alone; it fits
    the smallest MTU the engine allows at every port count."""
    from wirereduce.protocol import (
        ETH_PORT_COUNTERS,
        NODE_COUNTERS,
        engine_port_counters,
        engine_stats_counters,
        stats_counters,
    )

    seen = {len(STATS_COUNTERS): STATS_COUNTERS}
    for ports in range(1, 9):
        names = engine_stats_counters(ports)
        assert len(set(names)) == len(names) == 24 + 16 * (ports + 1)
        assert names[:len(NODE_COUNTERS)] == NODE_COUNTERS and names[len(NODE_COUNTERS)] == "ports"
        assert names[len(NODE_COUNTERS) + 1:] == engine_port_counters(ports)
        assert f"link_drop_net{ports - 1}" in names and f"net{ports - 1}_{ETH_PORT_COUNTERS[-1]}" == names[-1]
        assert "link_drop_cw" not in names
        assert len(names) not in seen
        seen[len(names)] = names
        assert HEADER_BYTES + 4 * len(names) <= 1500
    for count in range(0, 400):
        assert stats_counters(count) == seen.get(count)
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ValueError, match="ports"):
            engine_stats_counters(bad)
