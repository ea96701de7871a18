"""What a node reports: its event counters, and the STATS frame that carries them.

A STATS frame's values (:data:`wirereduce.protocol.STATS_COUNTERS`, each a little-endian u32)
come in three groups: the configuration a CONTROL frame set (:data:`CONFIG_COUNTERS`), the
node's own event counters (:data:`EVENT_COUNTERS`, :class:`EventCounters`) and the counters of
the ports in front of the node (:data:`PORT_COUNTERS`), which the node takes as they come on its
generic ``port_counters`` input (:class:`~wirereduce.hdl.core.engine.Engine`).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.stream.frame import FrameStream

from wirereduce.protocol import HEADER_BYTES, PORT_COUNTERS, STATS_COUNTERS, Header, Opcode, header_layout

__all__ = ["CONFIG_COUNTERS", "EVENT_COUNTERS", "PORT_COUNTERS", "port_counters_layout", "EventCounters",
           "StatusResponder", "report_status"]

#: The configuration a CONTROL frame sets: the first STATS values.
CONFIG_COUNTERS: tuple[str, ...] = STATS_COUNTERS[:5]
#: The node's own event counters: the STATS values after the configuration.
EVENT_COUNTERS: tuple[str, ...] = STATS_COUNTERS[5:len(STATS_COUNTERS) - len(PORT_COUNTERS)]


def port_counters_layout() -> data.ArrayLayout:
    """The node's ``port_counters`` input: one 32-bit value for each of :data:`PORT_COUNTERS`."""
    return data.ArrayLayout(32, len(PORT_COUNTERS))


class EventCounters:
    """The node's event counters (:data:`EVENT_COUNTERS`), 32 bits each, wrapping.

    Each part of the node that sees an event takes a one-cycle flag for it (:meth:`flag`); a
    counter adds up all its flags every cycle (:meth:`update`). With ``registered`` (the schedule
    engine, for timing) every flag is registered first (no sum of flags in front of a register), so
    the counters show an event a cycle later; a :class:`StatusResponder` with ``settle=2`` snapshots them a cycle later
    to match.
    """

    def __init__(self, registered: bool = False):
        self.values = {name: Signal(32, name=f"cnt_{name}") for name in EVENT_COUNTERS}
        self._flags = {name: [] for name in EVENT_COUNTERS}
        self._registered = registered

    def flag(self, name: str) -> Signal:
        """A new flag that adds 1 to counter ``name`` in each cycle it is high."""
        flag = Signal(name=f"inc_{name}_{len(self._flags[name])}")
        self._flags[name].append(flag)
        return flag

    def update(self, m: Module):
        """Add every counter's flags to it (call once, after every part took its flags)."""
        for name, flags in self._flags.items():
            if flags:
                if self._registered:   # each flag registered on its own, then summed into the counter
                    regs = []
                    for f in flags:
                        f_q = Signal(name=f"{f.name}_q")
                        m.d.sync += f_q.eq(f)
                        regs.append(f_q)
                    flags = regs
                total = flags[0]
                for f in flags[1:]:
                    total = total + f
                m.d.sync += self.values[name].eq(self.values[name] + total)


class StatusResponder(wiring.Component):
    """Sends one STATS frame (header + counters as little-endian u32) each time ``trigger`` pulses.

    ``busy`` is high from the trigger until the frame's last beat has left. The values are
    snapshot ``settle`` cycles after the trigger (1, or 2 for registered
    :class:`EventCounters`).
    """

    def __init__(self, width: int, counters: int, settle: int = 1):
        if settle not in (1, 2):
            raise ValueError(f"settle must be 1 or 2 cycles, not {settle!r}")
        self._width = width
        self._counters = counters
        self._settle = settle
        super().__init__({
            "o": Out(FrameStream(width)),
            "trigger": In(1),
            "busy": Out(1),
            "header": In(header_layout()),
            "values": In(data.ArrayLayout(32, counters)),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        nbytes = HEADER_BYTES + 4 * self._counters
        nbeats = -(-nbytes // (w // 8))
        snap = Signal(nbeats * w)
        idx = Signal(range(nbeats))
        tail = nbytes - (nbeats - 1) * (w // 8)
        last = idx == nbeats - 1
        # The beat leaving (beat idx of the snapshot) and the one after it are registers, the beat
        # after that selected from the snapshot as they move on (timing, issue 16: no select by idx
        # in front of the output, whose data goes on to the codec stage's gate at a codec engine's
        # host port). The same data at every cycle as beats[idx]: beat 0 while idle.
        cur = Signal(w)
        nxt = Signal(w)

        def word(value, k):
            return value[k * w:(k + 1) * w] if k < nbeats else Const(0, w)

        ahead = Array(word(snap, k + 2) for k in range(nbeats))
        new = Signal(nbeats * w)
        m.d.comb += new.eq(Cat(self.header, self.values))
        m.d.comb += [
            self.o.payload.data.eq(cur),
            self.o.payload.keep.eq(Mux(last, (1 << tail) - 1, (1 << (w // 8)) - 1)),
            self.o.payload.last.eq(last),
        ]
        # The snapshot is taken the cycle after the trigger (``settle`` = 1), so that a CONTROL
        # frame's new configuration (written on the trigger's edge) is what the STATS answer reports.
        pending = Signal()
        sending = Signal()
        m.d.comb += [self.busy.eq(pending | sending), self.o.valid.eq(sending)]
        with m.If(sending):
            with m.If(self.o.ready):
                m.d.sync += [idx.eq(idx + 1), cur.eq(nxt), nxt.eq(ahead[idx])]
                with m.If(last):
                    m.d.sync += [sending.eq(0), idx.eq(0), cur.eq(word(snap, 0)), nxt.eq(word(snap, 1))]
        settled = Signal(init=self._settle == 1)   # settle = 2: a cycle more after the trigger
        with m.Elif(pending & ~settled):
            m.d.sync += settled.eq(1)
        with m.Elif(pending):
            m.d.sync += [snap.eq(new), pending.eq(0), sending.eq(1), idx.eq(0),
                         settled.eq(self._settle == 1), cur.eq(word(new, 0)), nxt.eq(word(new, 1))]
        with m.Elif(self.trigger):
            m.d.sync += pending.eq(1)
        return m


def report_status(m: Module, status: StatusResponder, run, events: EventCounters, port_counters,
                  counters: tuple[str, ...] = STATS_COUNTERS, extra=()):
    """Give ``status`` what a STATS frame carries: its header (``collective``, ``src`` = rank,
    ``hop`` = nodes, ``seq`` = chunks, ``count`` = the number of values) and the values of
    ``counters`` (default the fixed layout :data:`~wirereduce.protocol.STATS_COUNTERS`; a schedule
    engine's: :func:`~wirereduce.protocol.engine_stats_counters`): the configuration in ``run``
    (the engine's run state: ``collective``, ``rank``, ``nodes``, ``chunks``), the ``events``, the ``extra`` values (the
    engine's port count) and the ``port_counters`` (a :func:`port_counters_layout` view, or the
    engine's)."""
    stats_hdr = Header(opcode=Opcode.STATS, count=len(counters))
    m.d.comb += [
        status.header.eq(stats_hdr.to_int()),
        status.header.collective.eq(run.collective),
        status.header.src.eq(run.rank),
        status.header.hop.eq(run.nodes),
        status.header.seq.eq(run.chunks),
    ]
    n_port = len(counters) - len(CONFIG_COUNTERS) - len(EVENT_COUNTERS) - len(extra)
    values = ([run.collective, run.rank, run.nodes, run.chunks, run.tag] + [events.values[n] for n in EVENT_COUNTERS]
              + list(extra) + [port_counters[k] for k in range(n_port)])
    assert len(values) == len(counters) and len(Value.cast(port_counters)) == 32 * n_port
    for k, v in enumerate(values):
        m.d.comb += status.values[k].eq(v)
