"""The parameter server: sync (with backup workers) or async, served by a thread on rank 0."""
