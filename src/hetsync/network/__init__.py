"""The cluster's network: a cost model without I/O, its parsing, and its emulation in real runs."""
