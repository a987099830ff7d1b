"""Hop (Luo et al., ASPLOS'19): update and token queues that bound the iteration gap."""
