"""The Verilog cache (wirereduce.sim.cluster.vcache): a hit only for the same design and source."""

from __future__ import annotations

import gzip
from fractions import Fraction

import pytest
from wirereduce.sim.cluster import vcache
from wirereduce.sim.cluster.vcache import _NoKey, cached_verilog, canonical

from wirereduce.config import EngineConfig, NodeConfig


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(vcache.CACHE_ENV, str(tmp_path / "vc"))
    return tmp_path / "vc"


class Maker:
    def __init__(self, text="module m; endmodule\n"):
        self.calls = 0
        self.text = text

    def __call__(self):
        self.calls += 1
        return self.text


def test_canonical_tells_every_field_apart():
    keys = {canonical(c) for c in (NodeConfig(), NodeConfig(codec=True), NodeConfig(64, 9000),
                                   EngineConfig(ports=4), EngineConfig(ports=4, lookahead=3))}
    assert len(keys) == 5
    assert canonical({(0, 1): 4, (1, 0): 5}) == canonical({(1, 0): 5, (0, 1): 4})
    assert canonical(Fraction(8, 5)) != canonical(1.6)
    assert canonical((1, 2)) != canonical([1, 2])
    with pytest.raises(_NoKey):
        canonical(object())


def test_second_call_is_a_hit_and_another_design_a_miss(cache):
    make = Maker()
    assert cached_verilog("network", (4, NodeConfig()), make) == make.text
    assert cached_verilog("network", (4, NodeConfig()), make) == make.text
    assert make.calls == 1
    other = Maker("module other; endmodule\n")
    assert cached_verilog("network", (4, NodeConfig(codec=True)), other) == other.text
    assert cached_verilog("schednet", (4, NodeConfig()), other) == other.text
    assert other.calls == 2
    assert len(list(cache.glob("*.v.gz"))) == 3


def test_a_source_change_is_a_miss(cache, monkeypatch):
    make = Maker()
    cached_verilog("network", (4,), make)
    monkeypatch.setattr(vcache, "source_digest", lambda: "edited")
    cached_verilog("network", (4,), make)
    assert make.calls == 2


def test_off_unkeyable_and_spoilt_entries_convert_again(cache, monkeypatch):
    make = Maker()
    cached_verilog("network", (object(),), make)
    cached_verilog("network", (object(),), make)
    assert make.calls == 2 and not cache.exists()
    cached_verilog("network", (4,), make)
    (entry,) = cache.glob("*.v.gz")
    entry.write_bytes(gzip.compress(b"x")[:5])   # truncated
    assert cached_verilog("network", (4,), make) == make.text and make.calls == 4
    monkeypatch.setenv(vcache.CACHE_ENV, "off")
    cached_verilog("network", (4,), make)
    assert make.calls == 5


def test_old_entries_are_pruned(cache, monkeypatch):
    monkeypatch.setattr(vcache, "KEEP", 3)
    for k in range(5):
        cached_verilog("network", (k,), Maker())
    assert len(list(cache.glob("*.v.gz"))) == 3
