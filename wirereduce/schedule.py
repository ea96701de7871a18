"""Allreduce schedules for the schedule engine: topologies, ring / bidirectional ring / Hamiltonian rings / MULTITREE.

A *schedule* splits the message into F *flows* (flow r carries a 1/F share of every node's
gradient) and gives each flow a spanning tree of the network: partial sums travel up the tree to
the flow's root (the *reduce*), the finished sum travels back down the same cables (the
*gather*). It is plain data, loaded into the node's schedule table at run time (docs/architecture.md
"Planned design", schedule engine): per node and flow, the children's ports in a fixed summation order, whether
and where the node adds its local chunk, the parent port (or root), the port the result comes
from, the ports it is forwarded to, and whether it is delivered to the host. The table fixes the
order of every fp32 addition, so the result's bits never depend on arrival order;
:func:`wirereduce.sim.golden.schedule.allreduce` is the numpy model of exactly that order.

Topologies
----------
:class:`Topology` numbers each node's ports in a fixed *neighbour order*, which is the order the
MULTITREE construction tries them in. Nodes are numbered row-major over the dimensions
(``node = row * cols + col`` on a 2-D grid) and each dimension contributes its ``-`` then its
``+`` neighbour: N, S, W, E on a 2-D torus or mesh, exactly as ``src/allreduce/network/kncube.py``
of the MULTITREE authors' simulator (farabimahmud/accelerator) builds its ``switch_to_switch``
lists. :meth:`Topology.graph` is the same network as a :class:`networkx.MultiGraph`.

- ``ring:N``: port 0 ``ccw`` (to rank k-1, wrapping to N-1), port 1 ``cw`` (to rank k+1), as the
  NTT ring node cables them. ``ring:2`` has two cables between its two nodes (the clockwise
  one and the counter-clockwise one), like the hardware ring.
- ``torus:AxB`` / ``torus:AxBxC``: wrap-around in every dimension. A dimension of size 2 has no
  second (wrap-around) cable, as in the simulator (``dimension > 2`` checks), so ``torus:2x2`` is a
  4-cycle of degree 2.
- ``mesh:AxB`` / ``mesh:AxBxC``: no wrap-around; corner and edge nodes have fewer ports.
- ``hypercube:N`` (N a power of two): ``torus:2x2x…x2``; ``hypercube:8`` is ``torus:2x2x2``.
  Neighbour order is the most significant address bit first.

Algorithms
----------
``ring``
    The schedule the NTT ring node runs today, one flow that every chunk follows: reduce
    clockwise rank 0 → 1 → … → N-1 (rank k adds its local chunk *after* the partial sum from
    rank k-1: ``((g0 + g1) + g2) + …``), rank N-1 is the root, gather counter-clockwise
    N-1 → … → 0. On a 2-D torus or mesh with an even side the ring is the simulator's snake
    (``kncube.py``'s ``ring``): row 0 left to right, then down/up the columns, back up column 0.
``biring``
    2N flows on the same ring: flow r (r < N) is the clockwise ring rooted at rank r, flow N + r
    the counter-clockwise ring rooted at rank r. Every directed ring link carries 2(N-1) shares
    of M/(2N), i.e. (N-1)/N · M, the 2-port lower bound.
``multiring``
    A ``biring`` on each of the topology's edge-disjoint Hamiltonian rings
    (:func:`hamiltonian_cycles`): a 2-D torus with both sides ≥ 3 splits into two (Kotzig), a 3-D
    one into three, a ring is its own. 2·k·N flows (k rings; ``roots=R``: R roots per ring and
    direction, 2·k·R flows); every directed link carries 2(N-1)/(N·d) · M, the d-port bound, in
    the lock-step count as well (4x4 torus: 30 steps of M/64 = 0.47 M/B, where MULTITREE's 5
    reduce and 5 gather steps of M/16 take 1/0.75 of it). Not from the three papers: offered beside them as the
    schedule whose chunks stream through chains of N-1 cut-through hops (docs/architecture.md
    "Hamiltonian rings"). Meshes, hypercubes and tori with a side of 2 have no such split.
``multitree``
    MULTITREE (Huang et al., ISCA 2021), the greedy construction of the authors' simulator
    (``src/allreduce/multitree_allreduce.py``, ``compute_trees(kary, alternate=True, sort=True)``,
    the defaults of its ``compute_schedule``): one tree per root, built in lock-step time steps.
    At the start of a step every directed link is free and every node has P send and P receive
    budget (the simulator's ``kary - 1``; its torus runs use ``--kary 5``, so P = 4 = the degree,
    our default). Roots take turns round-robin, in node order in the first round of step 0 and,
    after every round, sorted by priority, highest first, ties by higher node id (all priorities
    are 0 on a torus, so the order becomes N-1 … 0 and stays so in later steps). In its turn tree
    r adds at most one edge: the first member p of tree r at the start of the step (insertion
    order) that has send budget left and a neighbour c, first in p's neighbour order, whose link
    p→c is free this step, that is not in tree r yet and has receive budget left. The step ends
    at the end of a round whose *last* turn added nothing (see the deviations). An edge added in
    construction step t (its *level*) makes the child send its partial sum to the parent at reduce
    step T-1-t; the root sums at step T; the parent sends the result to the child at gather step
    T+1+t. Reproduces the published figures: T = 5 on a 4x4 torus with 64, 64, 48, 48, 16 links
    in construction steps 0-4, T = 17 on 8x8. The trees (every edge, in insertion order) were
    compared with the simulator's on 2x2, 3x3, 4x4, 5x5 and 8x8 tori and 3x3, 4x4, 5x5 and 8x8
    meshes (and with ``sort=False`` on 4x4 torus and 3x3 mesh): identical.
``multitree-balanced``
    MULTITREE's shape (one spanning tree per root, flow r rooted at node r, local chunk first,
    children in reduce-step order) with trees chosen for a pipelined engine instead of for
    lock-step (:func:`balanced_trees`): shortest-path trees whose parents a seeded local search
    picks so that the busiest directed link carries as few frames per round as possible. The
    published trees leave a pipelined engine bounded by their busiest link, above the d-port bound
    (4x4 torus: 9 frames per round against 7.5, at most 0.83 of the bound; hypercube of 8: 6
    against 4.67); the balanced ones reach the integer optimum (8, 0.94 of the bound; 5, 0.93; 6 =
    the bound on mesh:3x3). Lock-step steps are assigned afterwards by list scheduling, so T may
    exceed MULTITREE's (6 against 5 on 4x4), which a pipelined engine does not see.

Lock-step numbering (all algorithms): reduce steps 0 … T-1, the roots finish their sums in step
T, gather steps T+1 … 2T; in each step a flow moves its whole share over one link per tree edge.
The ring and biring use the same numbering (T = N-1); a pipelined engine streams chunks through
them instead, and its time is bounded by the busiest link (:meth:`Schedule.pipelined_time`).

Deviations from the authors' simulator, and why
-----------------------------------------------
- Summation order. The simulator sums a node's children whole, in arrival order; the schedule
  engine must not depend on arrival, so the table fixes it: MULTITREE adds the local chunk first,
  then the children in the order of their reduce steps (lock-step arrival order), ties broken by
  the node's port order; ring and biring add the upstream partial sum first and the local chunk
  second, as the NTT node does.
- Links are (node, port) pairs, not node pairs, so ``ring:2`` can have its two cables. The
  simulator has no ring topology; on its tori and meshes the two views are identical.
- Generalisations the simulator does not have: non-square and 3-D tori and meshes, hypercubes,
  rings; a port budget other than the degree (``ports=``). Mesh priorities on these use the
  correct Manhattan distance to the farthest corner.
- ``multitree-balanced`` is not the authors' construction at all (it keeps only the
  one-tree-per-root shape), and is offered beside ``multitree``, which stays the published one.
- Mesh quirks, kept by default (published behaviour) with option flags to fix them:
  ``mesh_distance_fix=True``: the simulator's mesh distance is ``|x1 - x2| + |x2 - y2|`` (the
  corner's row minus its column instead of the column difference), which skews the priority
  sort of 2-D meshes; the flag uses ``|x1 - x2| + |y1 - y2|``. ``full_round=True``: the simulator
  ends a step when the *last* root of a round adds nothing, even if earlier roots did (and
  immediately when that root's tree is complete); the flag ends it only after a whole round adds
  nothing, which packs more edges into each step and shortens mesh schedules (mesh 3x3:
  6 → 5 steps). On tori (all trees finish together) both flags change nothing.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from itertools import product
from typing import NamedTuple

import networkx as nx
import numpy as np

from wirereduce.config import check_mtu
from wirereduce.protocol import HEADER_BYTES, max_elements, wire_bytes

__all__ = [
    "MAX_NODES", "ALGORITHMS", "TOPOLOGY_KINDS", "ScheduleError", "Topology", "PortRef", "TreeEdge",
    "Flow", "FlowEntry", "NodeTable", "Schedule", "ring", "torus", "mesh", "hypercube",
    "parse_topology", "ring_order", "ring_schedule", "biring_schedule", "hamiltonian_cycles", "multiring_schedule",
    "multitree_schedule",
    "multitree_trees", "balanced_trees", "balanced_schedule", "build", "validate", "lower_bound",
    "frame_efficiency", "describe",
    "describe_schedule", "plot_trees",
]

#: Most nodes a topology may have: ranks and node counts travel in 8-bit header fields
#: (``src``, and ``hop`` in CONTROL frames), as for the ring (2 … 255 nodes).
MAX_NODES = 255
#: Schedules :func:`build` makes.
ALGORITHMS = ("ring", "biring", "multiring", "multitree", "multitree-balanced")
#: Topology kinds :func:`parse_topology` reads.
TOPOLOGY_KINDS = ("ring", "torus", "mesh", "hypercube")

_TOPOLOGY_HELP = "ring:8, torus:4x4, mesh:3x3, torus:2x2x2 or hypercube:8"


class ScheduleError(ValueError):
    """A schedule that breaks a rule :func:`validate` checks."""


# --------------------------------------------------------------------------------------------
# Topologies
# --------------------------------------------------------------------------------------------


class PortRef(NamedTuple):
    """One port of a node and the neighbour on its cable."""

    port: int
    node: int


@dataclass(frozen=True)
class Topology:
    """A network of nodes with numbered full-duplex ports.

    Attributes
    ----------
    name : str
        Canonical spec, e.g. ``"torus:4x4"`` (:func:`parse_topology` reads it back).
    kind : str
        ``"ring"``, ``"torus"``, ``"mesh"`` or ``"hypercube"``.
    dims : tuple of int
        Size of each dimension; nodes are numbered row-major over them.
    links : tuple of tuple of (int, int)
        ``links[node][port] = (neighbour, neighbour's port)``: the cable on ``port`` and its far
        end. The port order is the neighbour order.
    port_names : tuple of tuple of str
        ``port_names[node][port]``, e.g. ``"N"``, ``"cw"``.
    """

    name: str
    kind: str
    dims: tuple[int, ...]
    links: tuple[tuple[tuple[int, int], ...], ...]
    port_names: tuple[tuple[str, ...], ...]

    @property
    def nodes(self) -> int:
        return len(self.links)

    @property
    def degree(self) -> int:
        """Most ports any node has."""
        return max(len(p) for p in self.links)

    @property
    def min_degree(self) -> int:
        """Fewest ports any node has."""
        return min(len(p) for p in self.links)

    def neighbours(self, node: int) -> tuple[int, ...]:
        """``node``'s neighbours in neighbour (port) order."""
        return tuple(v for v, _ in self.links[node])

    def peer(self, node: int, port: int) -> PortRef:
        """The far end of the cable on ``node``'s ``port``."""
        v, q = self.links[node][port]
        return PortRef(q, v)

    def coord(self, node: int) -> tuple[int, ...]:
        """``node``'s coordinates, one per dimension (row-major numbering)."""
        return tuple(int(c) for c in np.unravel_index(node, self.dims))

    def directed_links(self) -> list[tuple[int, int]]:
        """Every directed link as ``(node, port)`` (the sending end), in node and port order."""
        return [(u, p) for u in range(self.nodes) for p in range(len(self.links[u]))]

    @property
    def cables(self) -> int:
        return len(self.directed_links()) // 2

    @cached_property
    def graph(self) -> nx.MultiGraph:
        """The network as a :class:`networkx.MultiGraph`.

        Node attributes: ``coord`` and ``ports`` (the neighbour order, as a list of
        ``(neighbour, neighbour's port)``); each cable is one edge with attributes ``ports``
        (``{u: u's port, v: v's port}``). Graph attributes: ``name``, ``kind``, ``dims``.
        """
        g = nx.MultiGraph(name=self.name, kind=self.kind, dims=self.dims)
        for u in range(self.nodes):
            g.add_node(u, coord=self.coord(u), ports=list(self.links[u]))
        for u in range(self.nodes):
            for p, (v, q) in enumerate(self.links[u]):
                if (u, p) < (v, q):
                    g.add_edge(u, v, key=(min((u, p), (v, q)), max((u, p), (v, q))), ports={u: p, v: q})
        return g

    def __str__(self) -> str:
        return self.name


def _axis_names(ndim: int, kind: str) -> list[tuple[str, str]]:
    if kind == "ring":
        return [("ccw", "cw")]
    if ndim == 2:
        return [("N", "S"), ("W", "E")]
    if ndim == 3:
        return [("U", "D"), ("N", "S"), ("W", "E")]
    return [(f"d{k}-", f"d{k}+") for k in range(ndim)]


def _grid(kind: str, name: str, dims: tuple[int, ...], wrap: bool, double_2: bool = False) -> Topology:
    """Nodes on a grid; per dimension the ``-`` then the ``+`` neighbour.

    ``wrap`` adds the wrap-around cables; a dimension of size 2 gets one only if ``double_2``.
    """
    n = math.prod(dims)
    if n > MAX_NODES:
        raise ValueError(f"{name} has {n} nodes; at most {MAX_NODES} are supported (ranks are 8-bit)")
    names = _axis_names(len(dims), kind)
    ports: list[list[tuple[int, int, int]]] = []  # per node: (neighbour, axis, delta)
    for u in range(n):
        c = np.unravel_index(u, dims)
        plist = []
        for k, size in enumerate(dims):
            for d in (-1, 1):
                x = int(c[k]) + d
                if not 0 <= x < size:
                    if not wrap or (size == 2 and not double_2):
                        continue
                    x %= size
                cc = list(c)
                cc[k] = x
                plist.append((int(np.ravel_multi_index(cc, dims)), k, d))
        ports.append(plist)
    links = []
    pnames = []
    for u in range(n):
        row = []
        for v, k, d in ports[u]:
            q = next(i for i, (w, kk, dd) in enumerate(ports[v]) if kk == k and dd == -d and w == u)
            row.append((v, q))
        links.append(tuple(row))
        pnames.append(tuple(names[k][(d + 1) // 2] for _, k, d in ports[u]))
    return Topology(name, kind, tuple(dims), tuple(links), tuple(pnames))


def _check_int(value, what: str, lo: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{what} must be an int ≥ {lo}, not {value!r}")
    return value


def ring(n: int) -> Topology:
    """A ring of ``n`` nodes (2 … 255); port 0 ``ccw`` to rank-1, port 1 ``cw`` to rank+1."""
    _check_int(n, "ring size", 2)
    return _grid("ring", f"ring:{n}", (n,), wrap=True, double_2=True)


def _dims(kind: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    if not 2 <= len(dims) <= 3:
        raise ValueError(f"a {kind} has 2 or 3 dimensions, not {len(dims)} (use ring:N for one)")
    for s in dims:
        _check_int(s, f"{kind} dimension", 2)
    return tuple(dims)


def torus(*dims: int) -> Topology:
    """A 2-D (``torus(4, 4)``) or 3-D torus; size-2 dimensions have no wrap-around cable."""
    dims = _dims("torus", dims)
    return _grid("torus", "torus:" + "x".join(map(str, dims)), dims, wrap=True)


def mesh(*dims: int) -> Topology:
    """A 2-D (``mesh(3, 3)``) or 3-D mesh (no wrap-around)."""
    dims = _dims("mesh", dims)
    return _grid("mesh", "mesh:" + "x".join(map(str, dims)), dims, wrap=False)


def hypercube(n: int) -> Topology:
    """A hypercube of ``n`` = 2^k nodes (``torus:2x…x2``); node u's neighbours are u ^ 2^(k-1) … u ^ 1."""
    _check_int(n, "hypercube size", 2)
    if n & (n - 1):
        raise ValueError(f"a hypercube has a power-of-two number of nodes, not {n}")
    k = n.bit_length() - 1
    return _grid("hypercube", f"hypercube:{n}", (2,) * k, wrap=False)


_SPEC_RE = re.compile(r"^\s*([A-Za-z]+)\s*:\s*(\S+?)\s*$")


def parse_topology(spec: str | Topology) -> Topology:
    """Read a topology string: ``ring:8``, ``torus:4x4``, ``mesh:3x3``, ``torus:2x2x2``, ``hypercube:8``.

    A :class:`Topology` is returned unchanged.

    Raises
    ------
    ValueError
        On anything else, naming what is wrong.
    """
    if isinstance(spec, Topology):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"topology must be a string like {_TOPOLOGY_HELP}, not {spec!r}")
    m = _SPEC_RE.match(spec)
    if not m:
        raise ValueError(f"topology {spec!r} is not KIND:SIZE, e.g. {_TOPOLOGY_HELP}")
    kind, size = m.group(1).lower(), m.group(2).lower()
    if kind not in TOPOLOGY_KINDS:
        raise ValueError(f"unknown topology kind {m.group(1)!r} in {spec!r}; known: {', '.join(TOPOLOGY_KINDS)}")
    parts = size.split("x")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"topology {spec!r}: size {m.group(2)!r} is not "
                         + ("an integer" if kind in ("ring", "hypercube") else "integers joined by 'x', e.g. 4x4"))
    nums = tuple(int(p) for p in parts)
    if kind in ("ring", "hypercube"):
        if len(nums) != 1:
            raise ValueError(f"topology {spec!r}: a {kind} takes one size (its node count), e.g. {kind}:8")
        if math.prod(nums) > MAX_NODES:
            raise ValueError(f"topology {spec!r} has {nums[0]} nodes; at most {MAX_NODES} are supported")
        return (ring if kind == "ring" else hypercube)(nums[0])
    if math.prod(nums) > MAX_NODES:
        raise ValueError(f"topology {spec!r} has {math.prod(nums)} nodes; at most {MAX_NODES} are supported")
    try:
        return (torus if kind == "torus" else mesh)(*nums)
    except ValueError as e:
        raise ValueError(f"topology {spec!r}: {e}") from e


def ring_order(topology: Topology | str) -> tuple[tuple[int, int], ...]:
    """The ring (a Hamiltonian cycle) the ring schedules run on, as ``(node, cw port)`` per rank.

    ``ring:N``: rank k is node k, its ``cw`` port leads to rank k+1. 2-D torus or mesh with an
    even side: the simulator's snake. Anything else raises :class:`ValueError`.
    """
    topo = parse_topology(topology)
    if topo.kind == "ring":
        return tuple((u, 1) for u in range(topo.nodes))
    if len(topo.dims) != 2 or topo.kind not in ("torus", "mesh"):
        raise ValueError(f"the ring schedules run on ring:N or a 2-D torus/mesh with an even side, not {topo.name}")
    rows, cols = topo.dims
    transpose = cols % 2 == 1
    if transpose:
        if rows % 2:
            raise ValueError(f"{topo.name} has no ring through every node that uses only mesh links "
                             f"(both sides are odd); use multitree")
        rows, cols = cols, rows
    cells = [(0, c) for c in range(cols)]
    for k, c in enumerate(range(cols - 1, 0, -1)):
        rs = range(1, rows) if k % 2 == 0 else range(rows - 1, 0, -1)
        cells += [(r, c) for r in rs]
    cells += [(r, 0) for r in range(rows - 1, 0, -1)]
    nodes = [(c * topo.dims[1] + r) if transpose else (r * cols + c) for r, c in cells]
    out = []
    for k, u in enumerate(nodes):
        v = nodes[(k + 1) % len(nodes)]
        out.append((u, topo.neighbours(u).index(v)))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeEdge:
    """One cable of a flow's tree: ``child`` sends its partial sum to ``parent`` at ``reduce_step``
    (out of ``child_port``); ``parent`` sends the result back at ``gather_step`` (out of ``parent_port``).
    ``level`` is the MULTITREE construction step that added it (its depth below the root minus 1
    for ring and biring)."""

    child: int
    parent: int
    child_port: int
    parent_port: int
    level: int
    reduce_step: int
    gather_step: int


@dataclass(frozen=True)
class Flow:
    """One flow: a ``share`` of every node's message, reduced up a tree to ``root`` and gathered back.

    ``order[node]`` is the node's summation order as node ids: each child's partial sum, and
    ``node`` itself where its local chunk is added. ``label`` says what it is (``"cw"``,
    ``"ccw"``, ``"tree"``).
    """

    index: int
    root: int
    share: Fraction
    edges: tuple[TreeEdge, ...]
    order: tuple[tuple[int, ...], ...]
    label: str = "tree"

    def parent_of(self, node: int) -> int | None:
        for e in self.edges:
            if e.child == node:
                return e.parent
        return None


@dataclass(frozen=True)
class FlowEntry:
    """A node's table entry for one flow (what the schedule engine is loaded with).

    Attributes
    ----------
    flow : int
    children : tuple of PortRef
        The ports (and neighbours) whose partial sums this node adds, in summation order.
    receive_steps : tuple of int
        Lock-step reduce step each child sends in (same order).
    add_local : bool
        Whether the node adds its local chunk.
    local_index : int
        Position of the local chunk among the terms: the sum is
        ``terms[0] + terms[1] + …`` left to right, with the local chunk inserted before
        ``children[local_index]`` (``len(children)`` = after all of them).
    parent : PortRef or None
        Where the partial sum goes; ``None`` at the flow's root.
    send_step : int or None
        Lock-step reduce step of that send.
    result_from : PortRef or None
        The port the finished sum arrives on; ``None`` at the root (its own sum).
    result_step : int
        Lock-step step the result is known here (the gather step it arrives in, T at the root).
    forward : tuple of PortRef
        Ports the finished sum is sent on (the children in the tree), in gather-step then port order.
    forward_steps : tuple of int
    deliver : bool
        Whether the result goes to the host.
    """

    flow: int
    children: tuple[PortRef, ...]
    receive_steps: tuple[int, ...]
    add_local: bool
    local_index: int
    parent: PortRef | None
    send_step: int | None
    result_from: PortRef | None
    result_step: int
    forward: tuple[PortRef, ...]
    forward_steps: tuple[int, ...]
    deliver: bool = True

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def terms(self) -> tuple[PortRef | None, ...]:
        """The summation order: a child's :class:`PortRef`, or ``None`` for the local chunk."""
        t: list[PortRef | None] = list(self.children)
        if self.add_local:
            t.insert(self.local_index, None)
        return tuple(t)


@dataclass(frozen=True)
class NodeTable:
    """One node's schedule table: its ports and one :class:`FlowEntry` per flow (in flow order)."""

    node: int
    ports: tuple[PortRef, ...]
    port_names: tuple[str, ...]
    entries: tuple[FlowEntry, ...]


@dataclass(frozen=True)
class Schedule:
    """An allreduce schedule: flows with their trees, and the per-node tables derived from them.

    ``levels`` is T (the number of construction steps, i.e. lock-step reduce steps); the
    lock-step schedule has ``2T + 1`` steps (reduce 0 … T-1, roots at T, gather T+1 … 2T).
    ``ports`` is the per-node, per-step send and receive budget P the schedule was built for.
    """

    topology: Topology
    algorithm: str
    ports: int
    levels: int
    flows: tuple[Flow, ...]
    tables: tuple[NodeTable, ...]
    options: tuple[tuple[str, object], ...] = ()

    @property
    def nodes(self) -> int:
        return self.topology.nodes

    @property
    def steps(self) -> int:
        """Lock-step step count, 2T + 1 (step T carries no traffic)."""
        return 2 * self.levels + 1

    def split(self, n: int) -> list[slice]:
        """The contiguous element range of each flow in a message of ``n`` elements.

        Shares are 1/F: flow f gets ``n // F`` elements, one more for the first ``n % F`` flows
        (``numpy.array_split``); a flow may be empty when ``n < F``.
        """
        f = len(self.flows)
        bounds = [k * (n // f) + min(k, n % f) for k in range(f + 1)]
        return [slice(bounds[k], bounds[k + 1]) for k in range(f)]

    def link_uses(self) -> list[tuple[int, int, int, int, str]]:
        """Every use of a directed link: ``(step, node, port, flow, phase)``, phase ``"reduce"``/``"gather"``."""
        uses = []
        for fl in self.flows:
            for e in fl.edges:
                uses.append((e.reduce_step, e.child, e.child_port, fl.index, "reduce"))
                uses.append((e.gather_step, e.parent, e.parent_port, fl.index, "gather"))
        return sorted(uses)

    def step_links(self) -> tuple[int, ...]:
        """Directed links used in each lock-step step 0 … 2T."""
        c = Counter(u[0] for u in self.link_uses())
        return tuple(c.get(s, 0) for s in range(self.steps))

    def level_links(self) -> tuple[int, ...]:
        """Tree edges added in each construction step 0 … T-1 (the MULTITREE "links per step")."""
        c = Counter(e.level for fl in self.flows for e in fl.edges)
        return tuple(c.get(t, 0) for t in range(self.levels))

    def link_load(self) -> dict[tuple[int, int], Fraction]:
        """Share of the message M each directed link ``(node, port)`` carries over the whole allreduce."""
        load = {lk: Fraction(0) for lk in self.topology.directed_links()}
        share = {fl.index: fl.share for fl in self.flows}
        for _, u, p, f, _ in self.link_uses():
            load[(u, p)] += share[f]
        return load

    def lockstep_time(self) -> Fraction:
        """Time of the lock-step schedule in units of M/B: one largest share per step with traffic."""
        busy = sum(1 for x in self.step_links() if x)
        return busy * max(fl.share for fl in self.flows)

    def pipelined_time(self) -> Fraction:
        """Lower bound of any pipelined engine running these trees, in M/B: the busiest link's load."""
        return max(self.link_load().values())

    # -- JSON --------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The schedule as JSON-ready data (:meth:`from_dict` reads it back)."""
        def pr(x):
            return None if x is None else [x.port, x.node]

        return {
            "format": "wirereduce-schedule", "version": 1,
            "topology": self.topology.name, "algorithm": self.algorithm, "ports": self.ports,
            "levels": self.levels, "steps": self.steps, "options": dict(self.options),
            "flows": [{
                "index": fl.index, "root": fl.root, "share": str(fl.share), "label": fl.label,
                "edges": [[e.child, e.parent, e.child_port, e.parent_port, e.level, e.reduce_step, e.gather_step]
                          for e in fl.edges],
                "order": [list(o) for o in fl.order],
            } for fl in self.flows],
            "tables": [{
                "node": t.node, "ports": [pr(p) for p in t.ports], "port_names": list(t.port_names),
                "entries": [{
                    "flow": en.flow, "children": [pr(c) for c in en.children],
                    "receive_steps": list(en.receive_steps), "add_local": en.add_local,
                    "local_index": en.local_index, "parent": pr(en.parent), "send_step": en.send_step,
                    "result_from": pr(en.result_from), "result_step": en.result_step,
                    "forward": [pr(c) for c in en.forward], "forward_steps": list(en.forward_steps),
                    "deliver": en.deliver,
                } for en in t.entries],
            } for t in self.tables],
            "edge_fields": ["child", "parent", "child_port", "parent_port", "level", "reduce_step", "gather_step"],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        """Rebuild a schedule from :meth:`to_dict` data (run :func:`validate` on anything untrusted)."""
        if d.get("format") != "wirereduce-schedule" or d.get("version") != 1:
            raise ValueError("not a version-1 wirereduce schedule")

        def pr(x):
            return None if x is None else PortRef(int(x[0]), int(x[1]))

        topo = parse_topology(d["topology"])
        flows = tuple(Flow(f["index"], f["root"], Fraction(f["share"]),
                           tuple(TreeEdge(*map(int, e)) for e in f["edges"]),
                           tuple(tuple(o) for o in f["order"]), f.get("label", "tree")) for f in d["flows"])
        tables = tuple(NodeTable(
            t["node"], tuple(pr(p) for p in t["ports"]), tuple(t["port_names"]),
            tuple(FlowEntry(e["flow"], tuple(pr(c) for c in e["children"]), tuple(e["receive_steps"]),
                            e["add_local"], e["local_index"], pr(e["parent"]), e["send_step"],
                            pr(e["result_from"]), e["result_step"], tuple(pr(c) for c in e["forward"]),
                            tuple(e["forward_steps"]), e["deliver"]) for e in t["entries"]),
        ) for t in d["tables"])
        return cls(topo, d["algorithm"], d["ports"], d["levels"], flows, tables,
                   tuple(sorted(d.get("options", {}).items())))


def _assemble(topo: Topology, algorithm: str, ports: int, levels: int,
              trees: list[tuple[int, str, list[tuple[int, int, int, int, int]]]],
              local_first: bool, options: dict) -> Schedule:
    """Schedule from trees ``(root, label, [(child, parent, child_port, parent_port, level)])``."""
    n = topo.nodes
    share = Fraction(1, len(trees))
    flows = []
    entries: list[list[FlowEntry]] = [[] for _ in range(n)]
    for f, (root, label, raw) in enumerate(trees):
        edges = tuple(TreeEdge(c, p, cp, pp, t, levels - 1 - t, levels + 1 + t) for c, p, cp, pp, t in raw)
        up = {e.child: e for e in edges}
        down: dict[int, list[TreeEdge]] = {u: [] for u in range(n)}
        for e in edges:
            down[e.parent].append(e)
        order = []
        for u in range(n):
            kids = sorted(down[u], key=lambda e: (e.reduce_step, e.parent_port))
            children = tuple(PortRef(e.parent_port, e.child) for e in kids)
            local_index = 0 if local_first else len(children)
            terms = [e.child for e in kids]
            terms.insert(local_index, u)
            order.append(tuple(terms))
            fwd = sorted(down[u], key=lambda e: (e.gather_step, e.parent_port))
            e_up = up.get(u)
            entries[u].append(FlowEntry(
                flow=f, children=children, receive_steps=tuple(e.reduce_step for e in kids),
                add_local=True, local_index=local_index,
                parent=None if e_up is None else PortRef(e_up.child_port, e_up.parent),
                send_step=None if e_up is None else e_up.reduce_step,
                result_from=None if e_up is None else PortRef(e_up.child_port, e_up.parent),
                result_step=levels if e_up is None else e_up.gather_step,
                forward=tuple(PortRef(e.parent_port, e.child) for e in fwd),
                forward_steps=tuple(e.gather_step for e in fwd), deliver=True))
        flows.append(Flow(f, root, share, edges, tuple(order), label))
    tables = tuple(NodeTable(u, tuple(PortRef(q, v) for v, q in topo.links[u]), topo.port_names[u],
                             tuple(entries[u])) for u in range(n))
    return Schedule(topo, algorithm, ports, levels, tuple(flows), tables, tuple(sorted(options.items())))


def _ring_tree(topo: Topology, cyc, root_rank: int, cw: bool) -> list[tuple[int, int, int, int, int]]:
    """The chain into rank ``root_rank`` travelling clockwise (``cw``) or counter-clockwise."""
    n = len(cyc)
    edges = []
    for t in range(n - 1):
        if cw:   # rank root-1-t sends clockwise to rank root-t
            c_rank, p_rank = (root_rank - 1 - t) % n, (root_rank - t) % n
            c, cp = cyc[c_rank]
        else:    # rank root+1+t sends counter-clockwise to rank root+t
            c_rank, p_rank = (root_rank + 1 + t) % n, (root_rank + t) % n
            c = cyc[c_rank][0]
            p_node, p_cw = cyc[p_rank]
            cp = topo.peer(p_node, p_cw).port   # the far end of the parent's cw cable is the child's ccw port
        p, pp = topo.peer(c, cp).node, topo.peer(c, cp).port
        assert p == cyc[p_rank][0]
        edges.append((c, p, cp, pp, t))
    return edges


def ring_schedule(topology: Topology | str) -> Schedule:
    """The NTT ring: one flow, reduce clockwise rank 0 → … → N-1 (root), gather counter-clockwise."""
    topo = parse_topology(topology)
    cyc = ring_order(topo)
    n = topo.nodes
    tree = _ring_tree(topo, cyc, n - 1, cw=True)
    return _assemble(topo, "ring", 2, n - 1, [(cyc[n - 1][0], "cw", tree)], local_first=False, options={})


def _biring_trees(topo: Topology, cyc, ranks, tag: str = "") -> list[tuple[int, str, list]]:
    """The chains of a biring on ring ``cyc``: clockwise ones rooted at ``ranks``, then counter-clockwise ones."""
    return ([(cyc[r][0], f"{tag}cw", _ring_tree(topo, cyc, r, cw=True)) for r in ranks]
            + [(cyc[r][0], f"{tag}ccw", _ring_tree(topo, cyc, r, cw=False)) for r in ranks])


def biring_schedule(topology: Topology | str) -> Schedule:
    """2N flows: clockwise rings rooted at ranks 0 … N-1, then counter-clockwise rings rooted at 0 … N-1."""
    topo = parse_topology(topology)
    n = topo.nodes
    trees = _biring_trees(topo, ring_order(topo), range(n))
    return _assemble(topo, "biring", 2, n - 1, trees, local_first=False, options={})


#: Search steps :func:`hamiltonian_cycles` takes before it gives up (a 3x3x3 torus needs ~35,000).
HAMILTONIAN_SEARCH_STEPS = 2_000_000


def hamiltonian_cycles(topology: Topology | str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Split every cable of a 2k-regular topology into k edge-disjoint Hamiltonian cycles.

    Each cycle is given as :func:`ring_order` gives one: ``(node, cw port)`` per rank, rank 0 at
    node 0, the ``cw`` port leading to the next rank. ``ring:N`` is one cycle (its own ring); a
    2-D torus with both sides ≥ 3 is two (Kotzig: the Cartesian product of two cycles splits into
    two Hamiltonian cycles), a 3-D torus with every side ≥ 3 three. Found by a depth-first search
    in port order (deterministic: the same topology always gives the same cycles) that prunes a
    partial cycle leaving an unvisited node with fewer than two free cables.

    Raises
    ------
    ValueError
        The topology is not regular of even degree with one cable between any two neighbours
        (a mesh, a hypercube, a torus with a side of 2), or the search found no split within
        :data:`HAMILTONIAN_SEARCH_STEPS` steps.
    """
    topo = parse_topology(topology)
    if topo.kind == "ring":   # its own ring (ring:2's two cables between the same two nodes included)
        return (ring_order(topo),)
    n = topo.nodes
    adj0 = [set(topo.neighbours(u)) for u in range(n)]
    degree = topo.degree
    if degree % 2 or any(len(a) != degree for a in adj0):   # every node: `degree` distinct neighbours
        raise ValueError(f"{topo.name} does not split into Hamiltonian rings: that needs every node to have the same "
                         f"even number of ports, each to a different neighbour (ring:N, or a torus with every side "
                         f"≥ 3); use multitree or multitree-balanced")
    steps = 0

    def one_cycle(adj):   # adj is 2-regular: its cycle through node 0, if it visits every node
        path, prev, cur = [0], None, 0
        while True:
            nxt = min(v for v in adj[cur] if v != prev) if prev is not None else min(adj[cur])
            if nxt == 0:
                return path if len(path) == n else None
            path.append(nxt)
            prev, cur = cur, nxt

    def cycles_through(adj):   # every Hamiltonian cycle of adj, depth first in neighbour order
        nonlocal steps
        path, on = [0], [False] * n
        on[0] = True

        def rec():
            nonlocal steps
            steps += 1
            if steps > HAMILTONIAN_SEARCH_STEPS:
                raise ValueError(f"no split of {topo.name} into Hamiltonian rings found within "
                                 f"{HAMILTONIAN_SEARCH_STEPS:,} search steps; use multitree or multitree-balanced")
            u = path[-1]
            if len(path) == n:
                if 0 in adj[u]:
                    yield list(path)
                return
            for v in sorted(adj[u]):
                if on[v]:
                    continue
                on[v] = True
                path.append(v)
                if all(sum(1 for x in adj[w] if not on[x] or x in (v, 0)) >= 2 for w in adj[v] if not on[w]):
                    yield from rec()
                path.pop()
                on[v] = False
        yield from rec()

    def split(adj, k):
        if k == 1:
            cyc = one_cycle(adj)
            if cyc is not None:
                yield [cyc]
            return
        for cyc in cycles_through(adj):
            rest = [set(a) for a in adj]
            for i, a in enumerate(cyc):
                b = cyc[(i + 1) % n]
                rest[a].discard(b)
                rest[b].discard(a)
            for more in split(rest, k - 1):
                yield [cyc] + more

    found = next(split(adj0, degree // 2), None)
    if found is None:
        raise ValueError(f"{topo.name} does not split into {degree // 2} Hamiltonian rings; use multitree")
    return tuple(tuple((u, topo.neighbours(u).index(cyc[(k + 1) % n])) for k, u in enumerate(cyc)) for cyc in found)


def multiring_schedule(topology: Topology | str, roots: int | None = None) -> Schedule:
    """``multiring``: a :func:`biring_schedule` on each of the topology's edge-disjoint Hamiltonian rings.

    :func:`hamiltonian_cycles` splits the cables into k = degree / 2 rings; on each, ``roots``
    clockwise chains (rooted at ranks spaced N / ``roots`` apart) and as many counter-clockwise ones,
    so 2·k·``roots`` flows and every directed link carries the same load (``roots`` = N: exactly;
    fewer: within one flow in ``roots``). It uses every port, as MULTITREE does, but its flows are
    cut-through chains of N − 1 hops, which pipeline a chunk per flow where a tree needs several
    to fill: a schedule for small messages (docs/architecture.md "Hamiltonian rings"). On
    ``ring:N`` with ``roots`` = N it is ``biring``.

    Raises
    ------
    ValueError
        From :func:`hamiltonian_cycles`, or ``roots`` is not a divisor of N.
    """
    topo = parse_topology(topology)
    n = topo.nodes
    roots = n if roots is None else roots
    if isinstance(roots, bool) or not isinstance(roots, int) or roots < 1 or n % roots:
        raise ValueError(f"roots must be a divisor of the {n} nodes (flows per ring direction), not {roots!r}")
    ranks = range(0, n, n // roots)
    trees = [t for i, cyc in enumerate(hamiltonian_cycles(topo)) for t in _biring_trees(topo, cyc, ranks, f"h{i}")]
    return _assemble(topo, "multiring", topo.degree, n - 1, trees, local_first=False,
                     options={} if roots == n else {"roots": roots})


def _priority(topo: Topology, mesh_distance_fix: bool) -> list[int]:
    """The simulator's root priority: 0 on tori; on meshes the distance to the farthest corner."""
    if topo.kind != "mesh":
        return [0] * topo.nodes
    corners = list(product(*[(0, s - 1) for s in topo.dims]))
    out = []
    for u in range(topo.nodes):
        c = topo.coord(u)
        if len(topo.dims) == 2 and not mesh_distance_fix:
            # kncube.py distance() for meshes: abs(src_x - dest_x) + abs(dest_x - dest_y)
            out.append(max(abs(c[0] - k[0]) + abs(k[0] - k[1]) for k in corners))
        else:
            out.append(max(sum(abs(a - b) for a, b in zip(c, k)) for k in corners))
    return out


def multitree_trees(topology: Topology | str, ports: int | None = None, *, sort: bool = True,
                    full_round: bool = False, mesh_distance_fix: bool = False
                    ) -> tuple[int, list[list[tuple[int, int, int, int, int]]]]:
    """MULTITREE's greedy tree construction (see the module docstring).

    Returns
    -------
    (T, trees)
        T construction steps; ``trees[r]`` lists tree r's edges
        ``(child, parent, child_port, parent_port, level)`` in the order they were added.
    """
    topo = parse_topology(topology)
    n = topo.nodes
    budget = topo.degree if ports is None else _check_int(ports, "ports", 1)
    members = [[r] for r in range(n)]
    member_sets = [{r} for r in range(n)]
    trees: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(n)]
    priority = _priority(topo, mesh_distance_fix)
    roots = list(range(n))
    done: set[int] = set()
    t = 0
    while len(done) < n:
        send = [budget] * n
        recv = [budget] * n
        used: set[tuple[int, int]] = set()
        start = [list(m) for m in members]
        added_any = False
        added_round = False
        turns = 0
        while True:
            root = roots[turns % n]
            added = False
            if len(members[root]) < n:
                for p in start[root]:
                    if send[p] == 0:
                        continue
                    for port, (c, cport) in enumerate(topo.links[p]):
                        if (p, port) in used or recv[c] == 0 or c in member_sets[root]:
                            continue
                        used.add((p, port))
                        send[p] -= 1
                        recv[c] -= 1
                        members[root].append(c)
                        member_sets[root].add(c)
                        trees[root].append((c, p, cport, port, t))
                        added = True
                        break
                    if added:
                        break
            turns += 1
            added_round |= added
            added_any |= added
            if len(members[root]) == n and root not in done:
                done.add(root)
                if len(done) == n:
                    break
            if turns % n == 0:
                if sort:   # sorted(zip(priority, roots), reverse=True): priority, then node id, highest first
                    roots = sorted(range(n), key=lambda r: (priority[r], r), reverse=True)
                if full_round:
                    if not added_round:
                        break
                    added_round = False
                elif not added:
                    break
        if not added_any:  # cannot happen on a connected topology with ports ≥ 1
            raise ScheduleError(f"multitree made no progress in step {t} on {topo.name}")
        t += 1
    return t, trees


def multitree_schedule(topology: Topology | str, ports: int | None = None, *, sort: bool = True,
                       full_round: bool = False, mesh_distance_fix: bool = False) -> Schedule:
    """MULTITREE: one tree per root node (flow r rooted at node r), port budget ``ports`` (default: degree)."""
    topo = parse_topology(topology)
    budget = topo.degree if ports is None else ports
    levels, trees = multitree_trees(topo, budget, sort=sort, full_round=full_round,
                                    mesh_distance_fix=mesh_distance_fix)
    opts = {"sort": sort, "full_round": full_round, "mesh_distance_fix": mesh_distance_fix}
    return _assemble(topo, "multitree", budget, levels, [(r, "tree", trees[r]) for r in range(topo.nodes)],
                     local_first=True, options=opts)


def _distances(topo: Topology, root: int) -> list[int]:
    """Hops from ``root`` to every node (breadth-first)."""
    dist = [-1] * topo.nodes
    dist[root] = 0
    frontier = [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v, _ in topo.links[u]:
                if dist[v] < 0:
                    dist[v] = dist[u] + 1
                    nxt.append(v)
        frontier = nxt
    return dist


#: Default local-search moves per (root, node) pair of :func:`balanced_trees`.
BALANCE_MOVES = 60


def balanced_trees(topology: Topology | str, ports: int | None = None, *, seed: int = 0,
                   moves: int | None = None) -> tuple[int, list[list[tuple[int, int, int, int, int]]]]:
    """Link-balanced shortest-path trees, one per root (the ``multitree-balanced`` algorithm).

    MULTITREE's greedy lock-step construction leaves its busiest directed link with more than the
    average load (4x4 torus: 9 frames per round of 16 chunks against 7.5; hypercube of 8: 6
    against 4.67), and a pipelined engine is bounded by that link (:meth:`Schedule.pipelined_time`),
    so it cannot reach the d-port bound whatever it does. This construction keeps MULTITREE's
    shape (flow r is a spanning tree rooted at node r, reduced leaves → root and gathered back)
    and chooses the trees for the pipelined engine instead of for lock-step:

    1. every node's parent in tree r is a neighbour one hop closer to r (shortest-path trees, so a
       tree is never deeper than the diameter), starting from the first such port in port order;
    2. a local search (``moves`` × N × (N − 1) proposals, a :class:`random.Random` seeded with
       ``seed``, so the result is fixed) moves one node of one tree to another shortest-path
       parent and keeps the move when the load vector gets no worse: first the busiest directed
       link's frames per round, then the sum of squares;
    3. lock-step steps are then assigned by list scheduling, edges in order of depth, root and
       node: the first step after the parent's own edge in which the link is free and both ends
       have send / receive budget ``ports`` left, so :func:`validate` holds (T may exceed MULTITREE's).

    Reaches 8 frames per round on the busiest 4x4-torus link (0.94 of the 4-port bound instead of
    0.83), 5 on the hypercube of 8 (0.93 instead of 0.78), 6 = the bound on the 3x3 mesh.

    Returns
    -------
    (T, trees) as :func:`multitree_trees`.
    """
    import random

    topo = parse_topology(topology)
    n = topo.nodes
    budget = topo.degree if ports is None else _check_int(ports, "ports", 1)
    moves = BALANCE_MOVES if moves is None else _check_int(moves, "moves", 0)
    dist = [_distances(topo, r) for r in range(n)]
    cand: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for r in range(n):
        for c in range(n):
            if c != r:
                cand[(r, c)] = [(p, cp, pp) for cp, (p, pp) in enumerate(topo.links[c]) if dist[r][p] == dist[r][c] - 1]
    choice = {k: v[0] for k, v in cand.items()}
    load = {lk: 0 for lk in topo.directed_links()}
    hist: Counter = Counter()

    sq = 0

    def use(c: int, ch: tuple[int, int, int], d: int) -> None:
        nonlocal sq
        p, cp, pp = ch
        for lk in ((c, cp), (p, pp)):
            hist[load[lk]] -= 1
            sq += 2 * d * load[lk] + d * d
            load[lk] += d
            hist[load[lk]] += 1

    hist[0] = len(load)
    for (_, c), ch in choice.items():
        use(c, ch, 1)
    top, best_sq = max(load.values()), sq
    rng = random.Random(seed)
    keys = sorted(k for k, v in cand.items() if len(v) > 1)
    for _ in range(moves * n * (n - 1) if keys else 0):
        k = keys[rng.randrange(len(keys))]
        old, new = choice[k], cand[k][rng.randrange(len(cand[k]))]
        if new == old:
            continue
        use(k[1], old, -1)
        use(k[1], new, 1)
        new_top = top
        while hist[new_top] <= 0 and new_top > 0:
            new_top -= 1
        for lk in ((k[1], new[1]), (new[0], new[2])):
            new_top = max(new_top, load[lk])
        if (new_top, sq) <= (top, best_sq):
            choice[k], top, best_sq = new, new_top, sq
        else:
            use(k[1], new, -1)
            use(k[1], old, 1)

    level: dict[tuple[int, int], int] = {}
    busy: dict[int, tuple[set, list[int], list[int]]] = {}
    trees: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(n)]
    for (r, c), (p, cp, pp) in sorted(choice.items(), key=lambda kv: (dist[kv[0][0]][kv[0][1]], kv[0])):
        t = 0 if p == r else level[(r, p)] + 1
        while True:
            used, send, recv = busy.setdefault(t, (set(), [0] * n, [0] * n))
            if (p, pp) not in used and send[p] < budget and recv[c] < budget:
                used.add((p, pp))
                send[p] += 1
                recv[c] += 1
                break
            t += 1
        level[(r, c)] = t
        trees[r].append((c, p, cp, pp, t))
    return (max(level.values()) + 1 if level else 1), trees


def balanced_schedule(topology: Topology | str, ports: int | None = None, *, seed: int = 0,
                      moves: int | None = None) -> Schedule:
    """``multitree-balanced``: one link-balanced shortest-path tree per root (:func:`balanced_trees`)."""
    topo = parse_topology(topology)
    budget = topo.degree if ports is None else ports
    levels, trees = balanced_trees(topo, budget, seed=seed, moves=moves)
    opts = {"seed": seed, "moves": BALANCE_MOVES if moves is None else moves}
    return _assemble(topo, "multitree-balanced", budget, levels, [(r, "tree", trees[r]) for r in range(topo.nodes)],
                     local_first=True, options=opts)


def build(topology: Topology | str, algorithm: str = "multitree", **options) -> Schedule:
    """The schedule ``algorithm`` (one of :data:`ALGORITHMS`) on ``topology``.

    ``options`` go to :func:`multitree_schedule` (``ports``, ``sort``, ``full_round``,
    ``mesh_distance_fix``), :func:`balanced_schedule` (``ports``, ``seed``, ``moves``) or
    :func:`multiring_schedule` (``roots``); ring and biring take none.

    Raises
    ------
    ValueError
        On an unknown topology or algorithm, or an option the algorithm does not take (named, with
        the ones it does), before anything is built.
    """
    topo = parse_topology(topology)
    builders = {"multitree": multitree_schedule, "multitree-balanced": balanced_schedule,
                "multiring": multiring_schedule}
    if algorithm in builders:
        fn = builders[algorithm]
        import inspect

        known = [p.name for p in list(inspect.signature(fn).parameters.values())[1:]
                 if p.kind is inspect.Parameter.KEYWORD_ONLY or p.default is not inspect.Parameter.empty]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"the {algorithm} schedule takes the options {', '.join(known)}, not "
                             f"{', '.join(unknown)}" + (" (roots is multiring's)" if "roots" in unknown else ""))
        return fn(topo, **options)
    if algorithm in ("ring", "biring"):
        if options:
            raise ValueError(f"the {algorithm} schedule takes no options, got {', '.join(sorted(options))}")
        return (ring_schedule if algorithm == "ring" else biring_schedule)(topo)
    raise ValueError(f"unknown schedule algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def validate(schedule: Schedule) -> None:
    """Check a schedule; raises :class:`ScheduleError` naming the first broken rule.

    - every flow's tree spans all nodes, with its edges on real cables (ports and far ends);
    - a node sends a partial sum only after receiving all its children's, and forwards the
      result only after receiving it; reduce steps come before the roots' step T, gathers after;
    - each directed link carries at most one flow per step, and each node sends and receives
      on at most P links per step;
    - the tables agree with the trees, every node adds its local chunk exactly once per flow,
      every flow's sum contains every node's chunk exactly once, and the result reaches every
      node exactly once and is delivered to every host.
    """
    topo, n, T = schedule.topology, schedule.nodes, schedule.levels
    if not schedule.flows:
        raise ScheduleError("the schedule has no flows")
    if sum(fl.share for fl in schedule.flows) != 1:
        raise ScheduleError(f"flow shares add up to {sum(fl.share for fl in schedule.flows)}, not 1")
    if len(schedule.tables) != n:
        raise ScheduleError(f"{len(schedule.tables)} tables for {n} nodes")
    for fl in schedule.flows:
        where = f"flow {fl.index} (root {fl.root})"
        if not 0 <= fl.root < n:
            raise ScheduleError(f"{where}: root is not a node")
        if len(fl.edges) != n - 1:
            raise ScheduleError(f"{where}: {len(fl.edges)} edges, a spanning tree of {n} nodes has {n - 1}")
        parent: dict[int, TreeEdge] = {}
        for e in fl.edges:
            if not (0 <= e.child < n and 0 <= e.parent < n) or e.child_port >= len(topo.links[e.child]):
                raise ScheduleError(f"{where}: edge {e} leaves the topology")
            if topo.peer(e.child, e.child_port) != (e.parent_port, e.parent):
                raise ScheduleError(f"{where}: port {e.child_port} of node {e.child} is not cabled to "
                                    f"port {e.parent_port} of node {e.parent}")
            if e.child in parent or e.child == fl.root:
                raise ScheduleError(f"{where}: node {e.child} has two parents (or is the root and has one)")
            parent[e.child] = e
        for u in range(n):
            seen = set()
            v = u
            while v != fl.root:
                if v in seen or v not in parent:
                    raise ScheduleError(f"{where}: node {u} is not connected to the root")
                seen.add(v)
                v = parent[v].parent
        for e in fl.edges:
            if not 0 <= e.reduce_step < T or not T < e.gather_step <= 2 * T:
                raise ScheduleError(f"{where}: edge {e.child}->{e.parent} has steps outside reduce 0..{T - 1} "
                                    f"/ gather {T + 1}..{2 * T}")
            for k in fl.edges:
                if k.parent == e.child and k.reduce_step >= e.reduce_step:
                    raise ScheduleError(f"{where}: node {e.child} sends at step {e.reduce_step} before its "
                                        f"child {k.child} arrives (step {k.reduce_step})")
            up = parent.get(e.parent)
            if up is not None and up.gather_step >= e.gather_step:
                raise ScheduleError(f"{where}: node {e.parent} forwards at step {e.gather_step} before the "
                                    f"result arrives (step {up.gather_step})")

    links: dict[tuple[int, int, int], int] = {}
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for step, u, p, f, _ in schedule.link_uses():
        if (step, u, p) in links:
            raise ScheduleError(f"step {step}: link {u} port {p} carries flows {links[(step, u, p)]} and {f}")
        links[(step, u, p)] = f
        sends[(step, u)] += 1
        recvs[(step, topo.peer(u, p).node)] += 1
    for step, u in sends.keys() | recvs.keys():
        if sends[(step, u)] > schedule.ports or recvs[(step, u)] > schedule.ports:
            raise ScheduleError(f"step {step}: node {u} sends {sends[(step, u)]} and receives {recvs[(step, u)]} "
                                f"flows, over the port budget {schedule.ports}")

    for fl in schedule.flows:
        where = f"flow {fl.index}"
        parent = {e.child: e for e in fl.edges}
        kids: dict[int, set[PortRef]] = {u: set() for u in range(n)}
        for e in fl.edges:
            kids[e.parent].add(PortRef(e.parent_port, e.child))
        entries = {}
        for u in range(n):
            tab = schedule.tables[u]
            if tab.node != u or len(tab.entries) <= fl.index or tab.entries[fl.index].flow != fl.index:
                raise ScheduleError(f"{where}: node {u}'s table has no entry for it")
            en = tab.entries[fl.index]
            entries[u] = en
            if set(en.children) != kids[u] or len(en.children) != len(kids[u]):
                raise ScheduleError(f"{where}: node {u}'s table lists children {list(en.children)}, the tree "
                                    f"has {sorted(kids[u])}")
            if not en.add_local or not 0 <= en.local_index <= len(en.children):
                raise ScheduleError(f"{where}: node {u} does not add its local chunk")
            if tuple(u if t is None else t.node for t in en.terms()) != fl.order[u]:
                raise ScheduleError(f"{where}: node {u}'s table order differs from the flow's order {fl.order[u]}")
            e = parent.get(u)
            want = None if e is None else PortRef(e.child_port, e.parent)
            if en.parent != want or en.result_from != want:
                raise ScheduleError(f"{where}: node {u}'s table has parent {en.parent} / result from "
                                    f"{en.result_from}, the tree says {want}")
            if set(en.forward) != kids[u] or len(en.forward) != len(kids[u]):
                raise ScheduleError(f"{where}: node {u} forwards to {list(en.forward)}, not its children")
            if not en.deliver:
                raise ScheduleError(f"{where}: node {u} does not deliver the result to its host")

        # the reduce, symbolically: whose chunks each partial sum holds
        held: dict[int, Counter] = {}

        def partial(u: int, depth: int = 0, fl=fl, entries=entries, held=held) -> Counter:
            if u not in held:
                if depth > n:
                    raise ScheduleError(f"flow {fl.index}: the tables' children form a cycle")
                c: Counter = Counter()
                for t in entries[u].terms():
                    if t is None:
                        c[u] += 1
                    else:
                        far_port, far = topo.peer(u, t.port)
                        if far != t.node or entries[far].parent != PortRef(far_port, u):
                            raise ScheduleError(f"flow {fl.index}: node {u} expects node {t.node} on port "
                                                f"{t.port}, which does not send there")
                        c += partial(t.node, depth + 1)
                held[u] = c
            return held[u]

        total = partial(fl.root)
        if total != Counter(range(n)):
            raise ScheduleError(f"{where}: the root's sum holds chunks {dict(total)}, not each node's once")
        # the gather through the tables: forward from the root
        got = Counter({fl.root: 1})
        queue = [fl.root]
        while queue:
            u = queue.pop()
            for t in entries[u].forward:
                v, q = topo.links[u][t.port]
                if v != t.node or entries[v].result_from != PortRef(q, u):
                    raise ScheduleError(f"{where}: node {u} forwards on port {t.port}, but node {v} does "
                                        f"not take its result from there")
                got[v] += 1
                queue.append(v)
        if got != Counter(range(n)):
            raise ScheduleError(f"{where}: the result reaches nodes {dict(got)}, not each node once")


# --------------------------------------------------------------------------------------------
# Bounds and reports
# --------------------------------------------------------------------------------------------


def frame_efficiency(mtu: int) -> float:
    """Payload bytes per wire byte of full frames of ``mtu`` bytes (header, Ethernet framing, preamble, IFG).

    Raises :class:`ValueError` for an MTU outside :func:`wirereduce.config.check_mtu`'s range.
    """
    payload = max_elements(check_mtu(mtu)) * 4
    return payload / wire_bytes(HEADER_BYTES + payload)


def lower_bound(nodes: int, ports: int, message_bytes: float = 1.0, bandwidth: float = 1.0, *,
                mtu: int | None = None, host_bandwidth: float | None = None) -> float:
    """Lower bound on any allreduce's time: T ≥ 2(N-1)M / (N·d·B) (docs/background.md "Lower bound").

    Every node must send and receive 2(N-1)/N · M over its d ports of B each. With ``mtu``, B is
    the payload rate of full frames (:func:`frame_efficiency`). With ``host_bandwidth``, every
    host also pushes and receives M through its node's host port, so T ≥ M / B_host as well.
    Units are the caller's (bytes and bytes/s give seconds; the defaults give units of M/B).
    """
    _check_int(nodes, "nodes", 2)
    _check_int(ports, "ports", 1)
    eff = 1.0 if mtu is None else frame_efficiency(mtu)
    t = 2 * (nodes - 1) * message_bytes / (nodes * ports * bandwidth * eff)
    if host_bandwidth is not None:
        t = max(t, message_bytes / (host_bandwidth * eff))
    return t


def _f(x) -> str:
    return f"{float(x):.4f}"


def describe_schedule(schedule: Schedule, mtu: int | None = None) -> str:
    """Human-readable report of a schedule: steps, per-step and per-link load, the lower bound."""
    s, topo = schedule, schedule.topology
    n, T, F = s.nodes, s.levels, len(s.flows)
    lines = [
        f"topology {topo.name}: {n} nodes, {topo.cables} cables ({2 * topo.cables} directed links), "
        + (f"{topo.degree} ports per node" if topo.degree == topo.min_degree
           else f"{topo.min_degree}-{topo.degree} ports per node"),
        f"algorithm {s.algorithm}: {F} flow{'s' if F > 1 else ''} of {s.flows[0].share} of the message, "
        f"T = {T} steps, port budget {s.ports} per node and step"
        + (f" ({', '.join(f'{k}={v}' for k, v in s.options)})" if s.options else ""),
        f"lock-step: reduce steps 0-{T - 1}, roots sum at step {T}, gather steps {T + 1}-{2 * T}",
    ]
    if s.algorithm == "multitree":
        lines.append("links per construction step: " + ", ".join(map(str, s.level_links())))
    lines.append("")
    lines.append(f"{'step':>4}  {'phase':<7}{'links':>6}  {'data (M)':>9}")
    share = max(fl.share for fl in s.flows)
    for step, k in enumerate(s.step_links()):
        phase = "reduce" if step < T else ("root" if step == T else "gather")
        lines.append(f"{step:>4}  {phase:<7}{k:>6}  {_f(k * share):>9}")
    load = s.link_load()
    lines.append("")
    lines.append("per-link load (share of M each directed link carries, by sending node and port):")
    width = max(len(x) for names in topo.port_names for x in names) + 1
    if len(set(topo.port_names)) == 1:
        lines.append(f"{'node':>4}  " + "".join(f"{x:>{max(width, 7)}}" for x in topo.port_names[0]))
        for u in range(n):
            lines.append(f"{u:>4}  " + "".join(f"{_f(load[(u, p)]):>{max(width, 7)}}"
                                              for p in range(len(topo.links[u]))))
    else:
        for u in range(n):
            lines.append(f"{u:>4}  " + "  ".join(f"{topo.port_names[u][p]}->{v}: {_f(load[(u, p)])}"
                                                 for p, (v, _) in enumerate(topo.links[u])))
    vals = list(load.values())
    lines.append(f"max {_f(max(vals))}, mean {_f(sum(vals) / len(vals))}, min {_f(min(vals))} of M")
    lines.append("")
    d = topo.min_degree
    lb = lower_bound(n, d)
    lock, pipe = s.lockstep_time(), s.pipelined_time()
    lines.append(f"lower bound (d = {d} ports of B): 2(N-1)/(N d) · M/B = {_f(lb)} M/B")
    lines.append(f"lock-step time: {sum(1 for x in s.step_links() if x)} steps × {share} of M = {_f(lock)} M/B "
                 f"({100 * lb / float(lock):.1f} % of the bound)")
    lines.append(f"pipelined time ≥ busiest link = {_f(pipe)} M/B ({100 * lb / float(pipe):.1f} % of the bound)")
    if mtu is not None:
        eff = frame_efficiency(mtu)
        lines.append(f"with MTU {mtu} frames: frame efficiency {eff:.4f}, bound {_f(lower_bound(n, d, mtu=mtu))} "
                     f"M/B_wire")
    return "\n".join(lines)


def describe(topology: Topology | str, algorithm: str = "multitree", *, mtu: int | None = None,
             **options) -> str:
    """Build ``algorithm`` on ``topology`` and report it (:func:`describe_schedule`)."""
    return describe_schedule(build(topology, algorithm, **options), mtu=mtu)


def _positions(topo: Topology) -> dict[int, tuple[float, float]]:
    n = topo.nodes
    if topo.kind == "ring":
        return {u: (math.sin(2 * math.pi * u / n), math.cos(2 * math.pi * u / n)) for u in range(n)}
    pos = {}
    for u in range(n):
        c = topo.coord(u)
        if len(c) == 2:
            pos[u] = (float(c[1]), -float(c[0]))
        else:  # oblique projection: the first dimension shifts each layer up and to the right
            x, y = float(c[-1]), -float(c[-2])
            for k, ck in enumerate(c[:-2]):
                x, y = x + ck * 0.45 * (k + 1) * max(topo.dims), y + ck * 0.3 * (k + 1) * max(topo.dims)
            pos[u] = (x, y)
    return pos


def plot_trees(schedule: Schedule, path, *, max_flows: int = 64) -> None:
    """Draw each flow's tree (arrows child → parent, coloured by reduce step; root in red) into ``path``.

    Needs matplotlib (``pip install matplotlib``; the ``bench`` extra has it).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    topo = schedule.topology
    flows = schedule.flows[:max_flows]
    cols = math.ceil(math.sqrt(len(flows)))
    rows = math.ceil(len(flows) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), squeeze=False)
    pos = _positions(topo)
    cmap = plt.get_cmap("viridis")
    T = max(schedule.levels, 1)

    def near(u, v):  # drawn straight: a grid neighbour; wrap-around cables are drawn as arcs
        return topo.kind == "ring" or sum(abs(a - b) for a, b in zip(topo.coord(u), topo.coord(v))) == 1

    for ax, fl in zip(axes.flat, flows):
        for u, v, _ in topo.graph.edges(keys=True):
            (x1, y1), (x2, y2) = pos[u], pos[v]
            if near(u, v):
                ax.plot([x1, x2], [y1, y2], color="0.85", lw=0.8, zorder=0)
        for e in fl.edges:
            ax.add_patch(FancyArrowPatch(
                pos[e.child], pos[e.parent], arrowstyle="-|>", mutation_scale=9, lw=1.4,
                color=cmap(e.reduce_step / T), shrinkA=6, shrinkB=6,
                connectionstyle="arc3,rad=0" if near(e.child, e.parent) else "arc3,rad=0.35", zorder=2))
        xs, ys = zip(*(pos[u] for u in range(topo.nodes)))
        ax.scatter(xs, ys, s=70, c=["tab:red" if u == fl.root else "white" for u in range(topo.nodes)],
                   edgecolors="black", linewidths=0.7, zorder=3)
        for u in range(topo.nodes):
            ax.annotate(str(u), pos[u], ha="center", va="center", fontsize=6, zorder=4)
        ax.set_title(f"flow {fl.index} ({fl.label}), root {fl.root}", fontsize=7)
        ax.set_aspect("equal")
        ax.margins(0.15)
        ax.axis("off")
    for ax in list(axes.flat)[len(flows):]:
        ax.axis("off")
    fig.suptitle(f"{schedule.algorithm} on {topo.name}: T = {schedule.levels}, arrows child → parent "
                 f"coloured by reduce step (dark = early)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (2.6 * rows)))   # 0.4 inch above the grid for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)
