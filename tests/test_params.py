"""hdl/params.py: a component whose constructor rejects its parameters raises the error and is
not reported as "created but never used" afterwards; ``EngineConfig.formats``, checked where it is
given and where it is used (the host session)."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import Fragment, Module, UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from wirereduce.hdl.arith.fp32 import AdderLanes, FloatAdder
from wirereduce.hdl.arith.lanes import ReduceLanes
from wirereduce.hdl.codec.compressor import BytePacker
from wirereduce.hdl.core.sumunit import SumUnit
from wirereduce.hdl.eth.mac import MacRx
from wirereduce.hdl.eth.pcs import BerMonitor
from wirereduce.hdl.eth.port import EthFramer, EthPort10G, EthPort10GCdc
from wirereduce.hdl.params import reject, rejecting
from wirereduce.hdl.stream.realign import Realigner
from wirereduce.hdl.xilinx.cmac import CmacTxGlue, EthPrepend
from wirereduce.host.engine import EngineSession

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.formats import FORMATS, supported_dtype_bytes


class _Checked(wiring.Component):
    def __init__(self, n, *, helper=True):
        if helper:
            with rejecting(self):
                if n < 0:
                    raise ValueError("n must be ≥ 0")
        elif n < 0:
            raise ValueError("n must be ≥ 0")
        super().__init__({"x": Out(1)})

    def elaborate(self, platform):
        raise NotImplementedError


def unused_warnings(make) -> list:
    # Amaranth arms the warning at the first elaboration in a process (before it, a crash is
    # the likelier reason for unused elaboratables).
    Fragment.get(Module(), None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            make()
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError("the constructor did not raise")
        gc.collect()
    return [w for w in caught if issubclass(w.category, UnusedElaboratable)]


def test_without_the_helper_a_rejected_component_warns():
    assert unused_warnings(lambda: _Checked(-1, helper=False))


@pytest.mark.parametrize("make", [
    lambda: _Checked(-1),
    lambda: Realigner(64),
    lambda: Realigner(96, strip=1),
    lambda: EthFramer(dst=-1),
    lambda: EthPort10G(19),
    lambda: EthPort10GCdc(19),
    lambda: EthPrepend(b"\x00"),
    lambda: CmacTxGlue(src_mac=1 << 48),
    lambda: MacRx(10),
    lambda: BerMonitor(window=3),
    lambda: BytePacker(63),
    lambda: AdderLanes(0),
    lambda: SumUnit(64, 2, 8, 4, 32),
    lambda: SumUnit(64, 2, 2, 4, 32, lookahead=5),
    lambda: ReduceLanes(1, ("bf16",)),
    lambda: FloatAdder(8, 23, 1),
    lambda: AdderLanes(2, deep=None),
    lambda: ReduceLanes(1, deep="yes"),
    lambda: SumUnit(96, 2, 2, 4, 32),
])
def test_rejected_components_raise_and_do_not_warn(make):
    assert unused_warnings(make) == []


def test_reject_raises_the_given_exception():
    with pytest.raises(KeyError, match="boom"):
        reject(object(), KeyError("boom"))


def test_cxx_opt_override(monkeypatch):
    """``$WIREREDUCE_CXX_OPT`` picks the models' C++ optimisation; a bad value raises before a build."""
    from wirereduce.sim.engines.verilator import CXX_OPT_ENV, cxx_opt

    monkeypatch.delenv(CXX_OPT_ENV, raising=False)
    assert cxx_opt("-O2") == "-O2"
    monkeypatch.setenv(CXX_OPT_ENV, " -O0 ")
    assert cxx_opt("-O2") == "-O0"
    monkeypatch.setenv(CXX_OPT_ENV, "-O9")
    with pytest.raises(ValueError, match="WIREREDUCE_CXX_OPT='-O9'"):
        cxx_opt("-O2")


@pytest.mark.parametrize("formats, error", [
    ((), ValueError), (("bf16",), ValueError), (("fp32", "fp32"), ValueError), (("fp32", "fp8"), ValueError),
    ("fp32", TypeError), (["fp32"], TypeError), (("fp32", 32), TypeError),
])
def test_engine_config_rejects_bad_formats(formats, error):
    with pytest.raises(error, match="formats"):
        EngineConfig(formats=formats)


def test_engine_config_formats():
    """Default all four, absent from the repr; otherwise kept in FORMATS order (equal sets, equal
    configs) and shown; the dtype bytes the engine takes are those formats' × every operation."""
    assert EngineConfig().formats == tuple(FORMATS) == ("fp32", "bf16", "fp16", "int32")
    assert repr(EngineConfig()) == ("EngineConfig(width=64, ports=4, mtu=1500, slots=8, max_flows=64, "
                                    "priority='broadcast', lookahead=2)")
    c = EngineConfig(ports=2, formats=("int32", "fp32"))
    assert c.formats == ("fp32", "int32") and c == EngineConfig(ports=2, formats=("fp32", "int32"))
    assert repr(c).endswith("priority='unit', lookahead=2, formats=('fp32', 'int32'))")   # auto, P = 2
    assert supported_dtype_bytes(c.formats) == [0x01, 0x11, 0x21, 0x04, 0x14, 0x24]
    assert len(supported_dtype_bytes()) == 12


def test_engine_config_priority_auto():
    """``auto``: partial sums first on rings (P ≤ 2), broadcasts first above; explicit values stay."""
    assert [EngineConfig(ports=p).priority for p in (1, 2, 3, 4, 6)] == ["unit", "unit", "broadcast",
                                                                         "broadcast", "broadcast"]
    assert EngineConfig(ports=2, priority="broadcast").priority == "broadcast"
    assert EngineConfig(ports=4, priority="unit").priority == "unit"
    assert EngineConfig(ports=2) == EngineConfig(ports=2, priority="unit")
    with pytest.raises(ValueError, match="'auto'"):
        EngineConfig(priority="first")


def test_engine_session_refuses_a_format_not_built():
    """The host side refuses an array whose format the engines lack before it makes a frame, and
    names the formats they have."""
    import ml_dtypes

    s = sched.build("ring:2", "ring")
    cfg = EngineConfig(64, 1500, slots=4, ports=2, max_flows=8, formats=("fp32", "bf16"))
    assert EngineSession(0, s, cfg, 1, np.ones(8, ml_dtypes.bfloat16), 4).dtype == 0x02
    for dt in (np.float16, np.int32):
        with pytest.raises(ValueError, match="built with formats fp32, bf16 only"):
            EngineSession(0, s, cfg, 1, np.ones(8, dt), 4, op="max")
