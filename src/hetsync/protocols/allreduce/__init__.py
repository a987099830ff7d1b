"""All-Reduce: gradients averaged by one collective per iteration (the DDP-style baseline)."""
