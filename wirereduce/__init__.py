"""wirereduce: in-network allreduce gateware (Amaranth), simulation and host driver."""
