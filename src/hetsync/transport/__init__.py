"""Everything that touches torch.distributed: process-group set-up, flat buffers, the store."""
