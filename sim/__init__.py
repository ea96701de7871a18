"""Simulation: numpy golden models, the N-node network top and the cocotb runner glue."""
