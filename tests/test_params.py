"""hdl/params.py: a component whose constructor rejects its parameters raises the error and is
not reported as "created but never used" afterwards."""

from __future__ import annotations

import gc
import warnings

import pytest
from amaranth.hdl import Fragment, Module, UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from wirereduce.hdl.arith.fp32 import AdderLanes
from wirereduce.hdl.codec.compressor import BytePacker
from wirereduce.hdl.core.sumunit import SumUnit
from wirereduce.hdl.eth.mac import MacRx
from wirereduce.hdl.eth.pcs import BerMonitor
from wirereduce.hdl.eth.port import EthFramer, EthPort10G, EthPort10GCdc
from wirereduce.hdl.params import reject, rejecting
from wirereduce.hdl.stream.realign import Realigner
from wirereduce.hdl.xilinx.cmac import CmacTxGlue, EthPrepend


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
