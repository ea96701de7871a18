"""The PCIe host transport (host/transports/xdma.py) on stand-in device files: named pipes in the
place of Xilinx's xdma character devices (``DEVICE_h2c_0`` written, ``DEVICE_c2h_0`` read, one frame
per write and per read, no Ethernet header). Against the simulated engines it runs in
tests/test_engine_deploy.py (``sim serve --unix`` DMA sockets)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from wirereduce.host.transports.xdma import XdmaTransport

from wirereduce.protocol import Header, Opcode


@pytest.fixture
def devices(tmp_path):
    """``tmp/xdma0_h2c_0`` and ``tmp/xdma0_c2h_0`` as FIFOs; yields (prefix, h2c read end, c2h write
    end): the card's side."""
    prefix = tmp_path / "xdma0"
    h2c, c2h = f"{prefix}_h2c_0", f"{prefix}_c2h_0"
    os.mkfifo(h2c)
    os.mkfifo(c2h)
    card_rx = os.open(h2c, os.O_RDONLY | os.O_NONBLOCK)    # so the transport's O_WRONLY open returns
    card_tx = os.open(c2h, os.O_RDWR)                       # so the transport's O_RDONLY open returns
    yield str(prefix), card_rx, card_tx
    os.close(card_rx)
    os.close(card_tx)


def _frame(seq: int, payload: bytes = b"") -> bytes:
    return Header(Opcode.HOST_RESULT, seq=seq, count=len(payload) // 4).pack() + payload


def _read_exactly(fd: int, n: int) -> bytes:
    out = b""
    for _ in range(10000):
        try:
            out += os.read(fd, n - len(out))
        except BlockingIOError:
            pass
        if len(out) == n:
            return out
        time.sleep(0.001)
    raise AssertionError(f"got {len(out)} of {n} bytes")


def test_frames_cross_whole_both_ways(devices):
    """A frame sent is one write of exactly its bytes (no Ethernet header, no padding); a packet the
    card sends is one frame received; the transport works across event loops (the rank driver runs
    each allreduce in a new one)."""
    prefix, card_rx, card_tx = devices
    with XdmaTransport(prefix, 1, 4, timeout=2.0) as tr:
        assert tr.h2c.endswith("xdma0_h2c_0") and tr.c2h.endswith("xdma0_c2h_0")
        out = _frame(7, bytes(range(36)))
        asyncio.run(tr.send(1, out))
        assert _read_exactly(card_rx, len(out)) == out
        for seq in (3, 4):     # two loops, one after the other
            back = _frame(seq, bytes([seq]) * 8)
            os.write(card_tx, back)
            assert asyncio.run(tr.recv(1)) == back
        with pytest.raises(ValueError, match="node 1 only"):
            asyncio.run(tr.send(2, out))


def test_recv_times_out_with_what_to_check(devices):
    prefix, _, _ = devices
    with XdmaTransport(prefix, 0, 2, timeout=0.2) as tr:
        with pytest.raises(TimeoutError, match=r"xdma0_c2h_0 for 0.2 s.*PCIe top"):
            asyncio.run(tr.recv(0))


def test_missing_device_and_bad_arguments(tmp_path, devices):
    with pytest.raises(FileNotFoundError, match=r"no XDMA device .*nodev_h2c_0: load Xilinx's xdma driver"):
        XdmaTransport(tmp_path / "nodev", 0, 4)
    prefix, _, _ = devices
    for kw, needle in (({"rank": 4}, "rank must be 0 … 3"), ({"channel": 9}, "channel must be 0 … 3"),
                       ({"timeout": 0}, "timeout must be a positive number")):
        args = {"rank": 0, **kw}
        with pytest.raises(ValueError, match=needle):
            XdmaTransport(prefix, args.pop("rank"), 4, **args)
    with pytest.raises(FileNotFoundError, match="sim serve --unix"):
        XdmaTransport.unix(tmp_path / "nowhere", 0, 4)


def test_cli_needs_exactly_one_way_to_the_node(tmp_path, capsys):
    from wirereduce.cli import main

    base = ["rank", "allreduce", "--nodes", "4", "--rank", "0", "--input", "x.npz", "--output", "y.npy"]
    assert main([*base, "--unix", str(tmp_path), "--xdma", "/dev/xdma0"]) != 0
    assert "give one of --interface" in capsys.readouterr().err
    assert main([*base, "--xdma", "/dev/xdma0", "--dma"]) != 0
    assert "--dma reaches a `sim serve --unix DIR`" in capsys.readouterr().err
