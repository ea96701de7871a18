"""Vivado Tcl that generates the UltraScale+ CMAC IP (``cmac_usplus``, PG203) the way
:class:`wirereduce.hdl.xilinx.cmac.Cmac100G` expects it: board build glue, added to a build by the
top that instantiates the core (:mod:`wirereduce.boards.u55c_top`, as a ``.tcl`` extra file).

Sources: PG203 customisation parameters; ``Xilinx/open-nic-shell``
``src/cmac_subsystem/vivado_ip/cmac_usplus_{0,1}_au55c.tcl`` (sites and GT groups of the U55C).
"""

from __future__ import annotations

from wirereduce.config import check_mtu
from wirereduce.protocol import ETH_HEADER_BYTES

__all__ = ["cmac_ip_tcl"]


def cmac_ip_tcl(ip_name: str, cmac_site: str, gt_group: tuple[str, str, str, str], *, mtu: int = 9000,
                init_clk_mhz: float = 100.0, rsfec: bool = True) -> str:
    """Vivado Tcl that generates ``ip_name``: AXI4-Stream user interface, no AXI4-Lite, flow
    control off, RS-FEC included, placed on ``cmac_site`` and ``gt_group``.

    Parameters
    ----------
    ip_name : str
        Module name of the IP (``cmac_usplus_0``).
    cmac_site : str
        The CMAC hard block, e.g. ``"CMACE4_X0Y3"``.
    gt_group : tuple of 4 str
        The four GTY channels of the QSFP28 cage, lane 1 first, e.g. ``("X0Y24", ..., "X0Y27")``.
    mtu : int
        Wirereduce MTU in bytes; the CMAC's receive limit becomes 14 + mtu + 4 (FCS) bytes.
    init_clk_mhz : float
        Frequency of ``init_clk`` in MHz (the IP's ``GT_DRP_CLK``).
    rsfec : bool
        Include the RS-FEC (always included when True; enabled by :class:`Cmac100G` ``rsfec``).

    Raises
    ------
    ValueError
        On a bad ``mtu`` (:func:`wirereduce.config.check_mtu`) or a ``gt_group`` not of 4 channels.
    """
    check_mtu(mtu)
    if len(gt_group) != 4:
        raise ValueError(f"gt_group must name the 4 GTY channels of the cage, not {gt_group!r}")
    lanes = " ".join(f"CONFIG.LANE{k + 1}_GT_LOC {{{loc}}}" for k, loc in enumerate(gt_group))
    unused = " ".join(f"CONFIG.LANE{k}_GT_LOC {{NA}}" for k in range(5, 11))
    return (
        f"create_ip -name cmac_usplus -vendor xilinx.com -library ip -module_name {ip_name}\n"
        f"set_property -dict [list CONFIG.CMAC_CAUI4_MODE {{1}} CONFIG.NUM_LANES {{4x25}} "
        f"CONFIG.GT_REF_CLK_FREQ {{161.1328125}} CONFIG.USER_INTERFACE {{AXIS}} "
        f"CONFIG.GT_DRP_CLK {{{init_clk_mhz:.2f}}} CONFIG.ENABLE_AXI_INTERFACE {{0}} "
        f"CONFIG.INCLUDE_STATISTICS_COUNTERS {{0}} CONFIG.TX_FLOW_CONTROL {{0}} CONFIG.RX_FLOW_CONTROL {{0}} "
        f"CONFIG.INCLUDE_RS_FEC {{{int(rsfec)}}} CONFIG.RX_GT_BUFFER {{1}} CONFIG.GT_RX_BUFFER_BYPASS {{0}} "
        f"CONFIG.ENABLE_PIPELINE_REG {{1}} CONFIG.RX_MAX_PACKET_LEN {{{ETH_HEADER_BYTES + mtu + 4}}} "
        f"CONFIG.CMAC_CORE_SELECT {{{cmac_site}}} CONFIG.GT_GROUP_SELECT {{{gt_group[0]}~{gt_group[3]}}} "
        f"{lanes} {unused}] [get_ips {ip_name}]\n"
        f"set_property GENERATE_SYNTH_CHECKPOINT false [get_files {ip_name}.xci]\n"
        f"generate_target all [get_ips {ip_name}]\n"
    )
