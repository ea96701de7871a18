"""Host side: the sans-IO allreduce protocol core and its transports."""
