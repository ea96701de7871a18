"""Frame stamps at every node's ports in the fast simulation of the compressed bench ring.

The fast simulator (:mod:`wirereduce.sim.engines.fastsim`) built with ``WR_PROBE=1`` puts probing
nodes in the network (``Node(probe=True)``): each stamps the first and last beat of every frame
at :data:`~wirereduce.hdl.core.node.PROBE_POINTS` (the node's six ports, behind the
:class:`~wirereduce.hdl.codec.port.CodecIn` stages, out of the three gates, into and out of the
reduce pipeline, in front of the :class:`~wirereduce.hdl.codec.port.CodecOut` stages), and the
frame player writes the stamps to the file ``WR_PROBE_FILE`` names. This module runs one
allreduce of the compressed bench (4 codec nodes, 512-bit core behind 10G links, real
gradients) that way and prints

* per node and point: frames, cycles per frame over the middle half of the run, the mean time
  from a frame's first to its last beat there, and the mean idle time before the next;
* per link (the ring's hops, read where they enter a node, and the hosts' result links): cycles
  per chunk over the middle half, the wire time of the frames it carried there (their compressed
  sizes from the golden codec, the Ethernet overheads of :func:`~wirereduce.protocol.wire_bytes`)
  and the share of the time that fills.

``python -m wirereduce.sim.bench.frametrace [--size 4M] [--k 8]`` (docs/codec.md "Where the time
goes"). The probing network is a build of its own under ``--out``: at 512 bit on two cores about
4 minutes of Verilog, which every run generates again (the build is found by its text), and
5 of compiling the first time; the 4 MiB run itself takes under a minute.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

__all__ = ["read_stamps", "point_rows", "link_rows", "main"]


def read_stamps(path: str | Path, nodes: int) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """``(node, point) → (first-beat cycles, last-beat cycles)`` of every frame in a probe file
    (``tb_fast.cpp``, PROBE: one line per cycle with a stamp, "cycle word0 word1 …", 32-bit hex
    words of the probe bus, least significant first; node ``n``'s bits from ``2·n·P``, a
    (first, last) pair per point)."""
    from wirereduce.hdl.core.node import PROBE_POINTS

    p = len(PROBE_POINTS)
    first = {(n, q): [] for n in range(nodes) for q in PROBE_POINTS}
    last = {(n, q): [] for n in range(nodes) for q in PROBE_POINTS}
    for line in Path(path).read_text().splitlines():
        f = line.split()
        cycle, v = int(f[0]), 0
        for i, w in enumerate(f[1:]):
            v |= int(w, 16) << (32 * i)
        while v:
            b = (v & -v).bit_length() - 1
            v &= v - 1
            n, r = divmod(b, 2 * p)
            j, end = divmod(r, 2)
            (last if end else first)[(n, PROBE_POINTS[j])].append(cycle)
    return {key: (np.array(first[key], dtype=np.int64), np.array(last[key], dtype=np.int64)) for key in first}


def _middle(n: int) -> tuple[int, int]:
    return n // 4, 3 * n // 4


def point_rows(stamps) -> list[tuple]:
    """``(node, point, frames, cycles per frame, first-to-last beat, idle after)`` per probed point
    with frames, the last three averaged over the middle half of its frames."""
    rows = []
    for (node, point), (s, e) in stamps.items():
        n = min(len(s), len(e))
        if n < 8:
            continue
        a, b = _middle(n)
        rows.append((node, point, n, (s[b] - s[a]) / (b - a), float((e[a:b] - s[a:b] + 1).mean()),
                     float((s[a + 1:b + 1] - e[a:b] - 1).mean())))
    return rows


def link_rows(stamps, arrays, k: int, mtu: int, bytes_per_cycle: float) -> list[tuple]:
    """``(link, cycles per chunk, wire cycles per chunk, busy share)`` over the middle half of the
    chunks, for the reduce hops (read at ``cw_in``), the broadcast hops (``ccw_in``) and the
    results (``host_tx``), against the payloads a ring of host-compressed pushes carries."""
    from wirereduce.sim.golden import codec as G

    from wirereduce import codec
    from wirereduce.protocol import HEADER_BYTES, wire_bytes

    per = codec.max_elements_compressed(mtu)
    hops = G.ring_payloads(arrays, k, host_compressed=True)
    nodes = len(arrays)

    def wire(v):
        return np.array([wire_bytes(HEADER_BYTES + codec.encoded_size(v[i:i + per], k)) / bytes_per_cycle
                         for i in range(0, v.size, per)])

    links = [(f"reduce {r}->{r + 1}", (r + 1, "cw_in"), 0, wire(hops[r])) for r in range(nodes - 1)]
    final = wire(hops[-1])
    links += [(f"broadcast {r + 1}->{r}", (r, "ccw_in"), 0, final) for r in range(nodes - 1)]
    links += [(f"result to host {r}", (r, "host_tx"), 1, final) for r in range(nodes)]  # after the CONTROL answer
    rows = []
    for name, key, skip, w in links:
        s = stamps[key][0][skip:skip + len(w)]
        if len(s) < len(w):
            continue
        a, b = _middle(len(w))
        span = s[b] - s[a]
        rows.append((name, span / (b - a), float(w[a:b].mean()), float(w[a:b].sum() / span)))
    return rows


def main(argv=None) -> int:
    from wirereduce.sim.bench.algbw import CODEC_CLOCK_MHZ, CODEC_CONFIG, CODEC_LINK_GBPS, CODEC_SLOTS, parse_size
    from wirereduce.sim.cluster.network import bytes_per_cycle
    from wirereduce.sim.engines.fastsim import run_allreduce
    from wirereduce.sim.engines.runner import SimSetup
    from wirereduce.sim.workloads.gradients import gradient_stream

    from wirereduce.config import NodeConfig

    ap = argparse.ArgumentParser(prog="python -m wirereduce.sim.bench.frametrace",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=4 << 20, help="message bytes per node (default 4M)")
    ap.add_argument("--k", type=int, default=8, help="error-bound exponent (default 8)")
    ap.add_argument("--window", type=int, default=None, help="chunks a host pushes ahead (default: the slots)")
    ap.add_argument("--out", default="build/frametrace", help="build root and stamp file directory")
    args = ap.parse_args(argv)
    cfg = CODEC_CONFIG
    setup = SimSetup(nodes=cfg.nodes, config=NodeConfig(cfg.width, cfg.mtu, CODEC_SLOTS, codec=True),
                     link_latency=4, link_gbps=CODEC_LINK_GBPS, clock_mhz=CODEC_CLOCK_MHZ)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp_file = out / f"stamps-{args.size}-k{args.k}.txt"
    os.environ["WR_PROBE"] = "1"
    os.environ["WR_PROBE_FILE"] = str(stamp_file.resolve())
    arrays = gradient_stream(cfg.nodes, args.size // 4, seed=0)
    rec = run_allreduce(setup, arrays, build_root=out, compression=args.k, window=args.window)
    print(f"# {args.size} B, k = {args.k}: {rec['cycles']} cycles, {rec['frames']} chunks a node; "
          f"stamps in {stamp_file}")
    stamps = read_stamps(stamp_file, cfg.nodes)
    print(f"# {'node':>4} {'point':>12} {'frames':>6} {'cyc/frame':>9} {'first-last':>10} {'idle':>6}  (middle half)")
    for node, point, n, period, dur, gap in point_rows(stamps):
        print(f"  {node:>4} {point:>12} {n:>6} {period:>9.1f} {dur:>10.1f} {gap:>6.1f}")
    bpc = float(bytes_per_cycle(CODEC_LINK_GBPS, CODEC_CLOCK_MHZ))
    print(f"# {'link':>18} {'cyc/chunk':>9} {'wire':>7} {'busy':>6}  (middle half)")
    for name, per_chunk, w, busy in link_rows(stamps, arrays, args.k, cfg.mtu, bpc):
        print(f"  {name:>18} {per_chunk:>9.1f} {w:>7.1f} {100 * busy:>5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
