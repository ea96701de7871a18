"""Vivado Tcl that generates the Xilinx XDMA IP (``xdma``, PG195) the way
:class:`wirereduce.hdl.xilinx.pcie.Xdma` expects it: board build glue, added to a build by the
top that instantiates the core (:mod:`wirereduce.boards.vc709_engine_top`, as a ``.tcl`` extra
file), as :mod:`wirereduce.boards.cmac_ip` does for the U55C's CMACs.

Configuration: the Virtex-7 Gen3 integrated block for PCI Express (``pcie3_7x`` inside the XDMA)
at site ``X0Y1``, PCIe Gen3 (8.0 GT/s) x8 from the 100 MHz slot reference clock, DMA in
AXI4-Stream mode with one H2C (read, host → card) and one C2H (write, card → host) channel,
256-bit streams at 250 MHz (``axi_aclk``), no AXI4-Lite master (BAR) and no configuration-
management port (the host talks to the engine with frames only), one user interrupt (unused).

Block and lanes: on the XC7VX690T the VC709's edge connector (lanes 0-7 on pins Y4 … AG6 /
W2 … AK4, docs/boards.md "Other pins") is wired to GTH quads 114/115, the quads of the PCIe block
``PCIE3_X0Y1``; the IP places the eight ``GTHE2_CHANNEL``s itself from ``pcie_blk_locn`` (the
constraint file it generates for ``X0Y1`` puts lane 0 on ``GTHE2_CHANNEL_X1Y23`` and lane 7 on
``X1Y16``), so no GT location is given here. The reference clock (AB8/AB7, MGTREFCLK1_115) comes
in through an ``IBUFDS_GTE2`` in the top.

Sources: PG195 customisation parameters (the Vivado ``CONFIG.*`` names); PG023 (Virtex-7 FPGA
Gen3 Integrated Block for PCI Express) for the block locations; public VC709 designs (NetFPGA
SUME, which uses the same XC7VX690T-FFG1761 and PCIe block ``X0Y1``; the XDMA-generated
``xdma_0_pcie3_ip-PCIE_X0Y1.xdc``).
"""

from __future__ import annotations

__all__ = ["xdma_ip_tcl", "PCIE_BLOCK", "LINK_WIDTH", "LINK_SPEED"]

#: The Gen3 integrated block the VC709's edge connector reaches (GTH quads 114/115).
PCIE_BLOCK = "X0Y1"
#: Lanes, as the IP spells it.
LINK_WIDTH = "X8"
#: Gen3, as the IP spells it.
LINK_SPEED = "8.0_GT/s"


def xdma_ip_tcl(ip_name: str = "xdma_0", *, pcie_block: str = PCIE_BLOCK, device_id: str = "7038") -> str:
    """Vivado Tcl that generates ``ip_name``: Gen3 x8 on ``pcie_block``, AXI4-Stream DMA, one
    H2C and one C2H channel, 256 bit at 250 MHz.

    Parameters
    ----------
    ip_name : str
        Module name of the IP (``xdma_0``); a Verilog identifier.
    pcie_block : str
        Site of the Gen3 integrated block, ``"X0Y1"`` on the VC709.
    device_id : str
        PCI device ID of physical function 0, 4 hex digits (vendor 10EE, Xilinx); ``7038`` is the
        ID Xilinx's drivers know for a Gen3 x8 endpoint.

    Raises
    ------
    ValueError
        On an ``ip_name`` that is not an identifier, a ``pcie_block`` not of the form ``X<n>Y<n>``
        or a ``device_id`` that is not 4 hex digits.
    """
    import re

    if not isinstance(ip_name, str) or not ip_name.isidentifier():
        raise ValueError(f"ip_name must be the Verilog module name of the IP, not {ip_name!r}")
    if not isinstance(pcie_block, str) or not re.fullmatch(r"X\d+Y\d+", pcie_block):
        raise ValueError(f"pcie_block must be a Gen3 block site such as 'X0Y1', not {pcie_block!r}")
    if not isinstance(device_id, str) or not re.fullmatch(r"[0-9A-Fa-f]{4}", device_id):
        raise ValueError(f"device_id must be 4 hex digits, not {device_id!r}")
    config = {
        "mode_selection": "Advanced",
        "pcie_blk_locn": pcie_block,
        "pl_link_cap_max_link_width": LINK_WIDTH,
        "pl_link_cap_max_link_speed": LINK_SPEED,
        "ref_clk_freq": "100_MHz",
        "axi_data_width": "256_bit",
        "axisten_freq": "250",
        "xdma_axi_intf_mm": "AXI_Stream",
        "xdma_rnum_chnl": "1",
        "xdma_wnum_chnl": "1",
        "axilite_master_en": "false",
        "xdma_axilite_slave": "false",
        "cfg_mgmt_if": "false",
        "xdma_num_usr_irq": "1",
        "pf0_device_id": device_id,
    }
    props = " ".join(f"CONFIG.{k} {{{v}}}" for k, v in config.items())
    return (
        f"create_ip -name xdma -vendor xilinx.com -library ip -module_name {ip_name}\n"
        f"set_property -dict [list {props}] [get_ips {ip_name}]\n"
        f"set_property GENERATE_SYNTH_CHECKPOINT false [get_files {ip_name}.xci]\n"
        f"generate_target all [get_ips {ip_name}]\n"
    )
