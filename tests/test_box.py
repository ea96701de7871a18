"""Boxes (sim/cluster/box.py): identical components of a network's Verilog are one design.

What is boxed must behave as what it stands for: an Ethernet port whose addresses are inputs
(``EthPort10G(local_mac=None, peer_mac=None)``, tied to constants outside its box) puts the same
blocks on the line, cycle for cycle, as the port built with those addresses.
"""

from __future__ import annotations

import pytest
from amaranth import Module, Signal
from amaranth.hdl import Fragment
from amaranth.lib import wiring
from amaranth.sim import Simulator
from amaranth_harness import stream_send
from test_ethport import random_frames
from wirereduce.hdl.eth.pcs import block_layout
from wirereduce.hdl.eth.port import EthPort10G, EthPort10GCdc
from wirereduce.sim.cluster.box import Box
from wirereduce.sim.cluster.network import eth_port
from wirereduce.sim.cluster.schednet import ENGINE_MODULE, ScheduleNetwork

from wirereduce.config import EngineConfig

MTU = 1500
LOCAL, PEER = 0x02_77_72_00_01_00, 0x02_77_72_00_02_01


class Twins(wiring.Component):
    """A port with constant addresses and one with them as inputs, tied to the same constants; both
    get the same frames on ``tx`` and their own blocks looped back (``delay`` cycles); ``rx`` is not
    read for the first ``hold`` cycles, so the flow-controlled ports' FIFOs fill and they send PAUSE
    frames (from their own address), honour them, and send XON once ``rx`` drains."""

    def __init__(self, delay: int = 5, hold: int = 3000, **params):
        self.delay = delay
        self.hold = hold
        self.a = EthPort10G(MTU, local_mac=LOCAL, peer_mac=PEER, **params)
        self.b = EthPort10G(MTU, local_mac=None, peer_mac=None, **params)
        super().__init__({"same": wiring.Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a, m.submodules.b = a, b = self.a, self.b
        cycle = Signal(range(self.hold + 1))
        with m.If(cycle != self.hold):
            m.d.sync += cycle.eq(cycle + 1)
        m.d.comb += [b.local_mac.eq(LOCAL), b.peer_mac.eq(PEER),
                     b.tx.valid.eq(a.tx.valid), b.tx.payload.eq(a.tx.payload)]
        for port in (a, b):
            line = port.line_tx.as_value()
            for _ in range(self.delay):
                r = Signal(block_layout.size)
                m.d.sync += r.eq(line)
                line = r
            m.d.comb += [port.line_rx.eq(line), port.rx.ready.eq(cycle == self.hold)]
        m.d.comb += self.same.eq((a.line_tx.as_value() == b.line_tx.as_value()) & (a.tx.ready == b.tx.ready)
                                 & (a.stats.as_value() == b.stats.as_value()))
        return m


@pytest.mark.parametrize("params", [{}, {"cut_through": True, "flow_control": True, "cable_cycles": 5}])
def test_port_with_address_inputs_is_the_same_port(params):
    dut = Twins(**params)
    frames = random_frames(3, 10)
    seen = {"cycles": 0, "differ": 0, "pause": 0}

    async def sender(ctx):
        for f in frames:
            await stream_send(ctx, dut.a.tx, f, 64)

    async def checker(ctx):
        for _ in range(6000):
            await ctx.tick()
            seen["cycles"] += 1
            seen["differ"] += not ctx.get(dut.same)
        seen["pause"] = ctx.get(dut.a.stats.tx_pause_frames)
        seen["frames"] = ctx.get(dut.b.stats.rx_frames)

    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    sim.add_testbench(sender, background=True)
    sim.add_testbench(checker)
    sim.run()
    assert seen["differ"] == 0
    assert seen["frames"] > 0
    assert seen["pause"] > 0 or not params.get("flow_control")


def test_address_inputs_are_members_and_only_single_clock():
    port = EthPort10G(MTU, local_mac=None, peer_mac=None, role="next")
    assert {"local_mac", "peer_mac"} <= set(port.signature.members)
    Fragment.get(port, None)
    fixed = EthPort10G(MTU)
    assert "local_mac" not in fixed.signature.members
    Fragment.get(fixed, None)
    with pytest.raises(ValueError, match="local_mac"):
        EthPort10GCdc(MTU, local_mac=None)


def test_schednet_boxes_the_engine_under_its_module_name():
    net = ScheduleNetwork("ring:4", EngineConfig(64, 1500, slots=16, ports=2, max_flows=8), links="eth", boxed=True)
    Fragment.get(net, None)
    assert [name for name, _ in net.boxes.modules()] == [ENGINE_MODULE, "wirereduce_ethport"]


def test_eth_port_ties_the_addresses_outside_the_box():
    from wirereduce.sim.cluster.box import Boxes

    m, boxes = Module(), Boxes()
    a = eth_port(m, boxes, MTU, LOCAL, PEER, cut_through=True)
    b = eth_port(m, boxes, MTU, PEER, LOCAL, cut_through=True)
    c = eth_port(m, boxes, MTU, PEER, LOCAL, cut_through=False)
    assert isinstance(a, Box) and a.module == b.module != c.module
    assert len(boxes.modules()) == 2
    plain = eth_port(m, None, MTU, LOCAL, PEER)
    assert not isinstance(plain, Box)
    for elaboratable in (a, b, c, plain, m):
        elaboratable._MustUse__silence = True
