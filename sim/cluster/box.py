"""Boxes: identical components of a simulated network converted and compiled once, not once each.

A four-node ring behind 10G Ethernet holds four identical nodes and sixteen Ethernet ports of
four kinds. Converted as they are, each is a module of its own in the Verilog text (Amaranth
names every submodule by its place), so Amaranth and Yosys convert the same logic four or sixteen
times: minutes of CPU for the larger networks. A :class:`Box` stands in for a component in the
network: the same signature, around an ``Instance`` of one Verilog module that is converted on its
own once (:meth:`Boxes.verilog`) and instantiated wherever the network has such a component. Only
the Verilog path boxes (``network_verilog``, ``schednet_verilog``); a network simulated in Python
(``amaranth.sim``) elaborates its components as they are.

What this saves is the conversion: a four-node codec ring behind Ethernet converts in about a
fifth of the time (32 instead of 177 s, on a loaded machine). Verilator compiles about as much as
before: it inlines the boxes into their parent, and it generates C++ per instance even where it
does not (``/* verilator no_inline_module */`` on the boxes of a four-node Ethernet ring: 45
instead of 53 MB of C++, the same build CPU; hierarchical Verilation, ``hier_block``: no less
CPU either).

What makes two components the same design is their parameters: :meth:`Boxes.box` takes a key of
them (``vcache.canonical`` form) and builds the component once per distinct key. A component must
not carry anything that differs between instances beyond its key: addresses, for one, are inputs
of a boxed Ethernet port (``EthPort10G(local_mac=None, peer_mac=None)``), tied to constants by the
network outside the box.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import ClockSignal, Instance, Module, ResetSignal
from amaranth.lib import wiring

__all__ = ["Box", "Boxes"]


class Box(wiring.Component):
    """``signature``'s ports around an ``Instance`` of the Verilog module ``module`` (clock ``clk``,
    reset ``rst``: the ``sync`` domain), whose ports are named as Amaranth names those of a
    component with that signature: ``i_``/``o_`` and the member's path joined by ``__``."""

    def __init__(self, signature: wiring.Signature, module: str):
        self.module = module
        super().__init__(signature)

    def elaborate(self, platform):
        m = Module()
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member in self.signature.members.flatten():
            if not member.is_port:
                continue
            value = self
            for part in path:
                value = getattr(value, part)
            ports[("i_" if member.flow == wiring.In else "o_") + "__".join(path)] = value
        m.submodules.box = Instance(self.module, **ports)
        return m


class Boxes:
    """The distinct components a network boxes while it elaborates, each converted once.

    Parameters
    ----------
    prefix : str
        Module names are ``{prefix}_{kind}`` for the first design of a kind, ``{prefix}_{kind}{n}``
        for the n-th other one (n ≥ 1).
    """

    def __init__(self, prefix: str = "wirereduce"):
        self.prefix = prefix
        self._designs: dict[str, tuple[str, wiring.Component]] = {}   # canonical key → (module, component)
        self._kinds: dict[str, int] = {}

    def box(self, kind: str, key, make: Callable[[], wiring.Component]) -> Box:
        """A :class:`Box` of the design ``make()`` builds; ``make`` is called once per distinct
        (``kind``, ``key``), and ``key`` must hold every parameter that design depends on."""
        from wirereduce.sim.cluster.vcache import canonical

        ident = canonical((kind, key))
        if ident not in self._designs:
            n = self._kinds.get(kind, 0)
            self._kinds[kind] = n + 1
            component = make()
            component._MustUse__silence = True   # converted by verilog(), not elaborated in the network
            self._designs[ident] = (f"{self.prefix}_{kind}{n or ''}", component)
        module, component = self._designs[ident]
        return Box(component.signature, module)

    def modules(self) -> list[tuple[str, wiring.Component]]:
        """(module name, component) of every distinct design boxed so far, in the order first boxed."""
        return list(self._designs.values())

    def verilog(self) -> str:
        """The Verilog text of every distinct design, each converted once under its module name."""
        from amaranth.back import verilog

        return "".join("\n" + verilog.convert(component, name=module, emit_src=False)
                       for module, component in self.modules())
