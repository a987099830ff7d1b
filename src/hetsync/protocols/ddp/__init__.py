"""DDP: torch's DistributedDataParallel, with All-Reduce's decisions (`allreduce.core`)."""
