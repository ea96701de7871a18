"""The run-time state a CONTROL frame sets: which collective runs, this node's place in the ring,
and the sequence number each input expects next; and the rules a CONTROL frame must pass.

``rank`` and ``nodes`` decide the node's role (:class:`~wirereduce.hdl.core.node.Node`): rank 0
starts the reduce pass, rank N-1 completes it and starts the broadcast pass.

**Collective state is guarded** (docs/protocol.md "Starting a collective: CONTROL"). A CONTROL
frame is *refused* (not applied, counted in ``control_refused``, still answered with a STATS frame
that shows the unchanged configuration and the refused request's tag) when
(:meth:`RunState.refusal`):

- the node's collective is still running (:attr:`RunState.running`) and the frame's ``flags``
  lack :attr:`~wirereduce.protocol.Flag.ABORT`; or
- one of its fields is invalid: ``flags`` other than ABORT, ``dtype`` not FP32, ``codec`` neither
  NONE nor INCEPTIONN_V1, INCEPTIONN_V1 on a node built without the codec
  (:attr:`NodeConfig.codec <wirereduce.config.NodeConfig>`), ``eb_k`` outside
  :data:`~wirereduce.codec.K_MIN` … :data:`~wirereduce.codec.K_MAX` for a compressed collective
  or not 0 for an uncompressed one, ``hop`` (nodes) 0, ``src`` (rank) ≥ nodes, ``seq`` (chunks) 0.
"""

from __future__ import annotations

from amaranth import Mux, Signal

from wirereduce.codec import K_MAX, K_MIN
from wirereduce.protocol import Codec, DType, Flag

__all__ = ["RunState"]


class RunState:
    """The registers a CONTROL frame writes (:meth:`start`), and whether one may (:meth:`refusal`).

    Parameters
    ----------
    codec : bool
        The node is built with the codec (``NodeConfig.codec``): only then may a collective be
        compressed (``codec = INCEPTIONN_V1``).

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
    finished : Value(32)
        Chunks this node has finished: taken in by the input whose frames become the node's
        results to its host (rank N-1: the reduce input, or the host input at rank 0 of a
        one-node ring; every other rank: the broadcast input). Every frame an input takes in is
        delivered to the host (the pipeline and the forks never drop), frames marked ``bad`` and
        LOST placeholders included, since a node finishes a chunk even when it is lost; a frame
        of an earlier collective still inside the node is not counted.
    running : Value(1)
        The collective is still running: ``active`` and ``finished < chunks``. A CONTROL frame
        without ``Flag.ABORT`` is refused while it is.
    """

    def __init__(self, codec: bool = False):
        self.codec_built = bool(codec)
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
        self.finished = Mux(self.is_last, Mux(self.is_first, self.push_seq, self.reduce_seq), self.bcast_seq)
        self.running = self.active & (self.finished < self.chunks)

    def refusal(self, head):
        """1 when the CONTROL frame with header ``head`` must be refused (module docstring): a
        collective is running and ``head`` has no ABORT flag, or a field of ``head`` is invalid."""
        abort = (head.flags & int(Flag.ABORT)) != 0
        flags_bad = (head.flags & (0xFF ^ int(Flag.ABORT))) != 0
        codec_ok = (head.codec == int(Codec.NONE)) & (head.eb_k == 0)
        if self.codec_built:
            codec_ok |= (head.codec == int(Codec.INCEPTIONN_V1)) & (head.eb_k >= K_MIN) & (head.eb_k <= K_MAX)
        fields_bad = (flags_bad | (head.dtype != int(DType.FP32)) | ~codec_ok | (head.hop == 0)
                      | (head.src >= head.hop) | (head.seq == 0))
        return (self.running & ~abort) | fields_bad

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
