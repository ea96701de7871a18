"""The run-time state a CONTROL frame sets: which collective runs, this node's place in the ring,
and the sequence number each input expects next.

``rank`` and ``nodes`` decide the node's role (:class:`~wirereduce.hdl.core.node.Node`): rank 0
starts the reduce pass, rank N-1 completes it and starts the broadcast pass.
"""

from __future__ import annotations

from amaranth import Signal

__all__ = ["RunState"]


class RunState:
    """The registers a CONTROL frame writes (:meth:`start`).

    Attributes
    ----------
    collective : Signal(16)
        Id of the current collective; frames of another id are dropped.
    rank, nodes : Signal(8)
        This node's rank and the number of nodes in the ring.
    chunks : Signal(32)
        Chunks in the current collective; frames with a higher ``seq`` are dropped.
    active : Signal()
        A CONTROL frame has started a collective since reset.
    taken : Signal()
        High for the one cycle after a CONTROL frame was accepted (:meth:`start`), when ``rank``
        and ``nodes`` already hold its values; the node exports it as ``control_taken``. Whoever
        owns the ``RunState`` resets it every cycle (``m.d.sync += run.taken.eq(0)``) before
        any ``start``.
    is_first, is_last : Value
        The node is rank 0 / rank N-1.
    tag : Signal(16)
        ``count`` of the last CONTROL or STATS_REQUEST: the request tag a STATS answer echoes.
    dtype, codec, eb_k : Signal(8)
        What this collective's data frames carry (CONTROL's fields); the gates drop others.
    push_seq, reduce_seq, bcast_seq : Signal(32)
        The ``seq`` the host, cw and ccw inputs expect next: frames arrive in order on every port.
    """

    def __init__(self):
        self.collective = Signal(16)
        self.rank = Signal(8)
        self.nodes = Signal(8)
        self.chunks = Signal(32)
        self.active = Signal()
        self.taken = Signal()
        self.tag = Signal(16)
        self.dtype = Signal(8)
        self.codec = Signal(8)
        self.eb_k = Signal(8)
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.nodes - 1
        self.push_seq = Signal(32)
        self.reduce_seq = Signal(32)
        self.bcast_seq = Signal(32)

    def start(self, head):
        """``sync`` statements of a CONTROL frame with header ``head``: ``collective`` is the id,
        ``src`` the rank, ``hop`` the node count, ``seq`` the chunk count; every input starts
        again at chunk 0."""
        return [
            self.collective.eq(head.collective), self.rank.eq(head.src), self.nodes.eq(head.hop),
            self.chunks.eq(head.seq), self.active.eq(1), self.taken.eq(1),
            self.dtype.eq(head.dtype), self.codec.eq(head.codec), self.eb_k.eq(head.eb_k),
            self.push_seq.eq(0), self.reduce_seq.eq(0), self.bcast_seq.eq(0),
        ]
