"""Amaranth gateware: fp32 adder lanes, frame gates, the reduce pipeline and the node."""
