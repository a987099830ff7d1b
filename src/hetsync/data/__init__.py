"""Data for a run's workers: each epoch dealt out as they ask (`DynamicSampler`, `deal`)."""

from hetsync.data.sampler import Deal, DynamicSampler, deal

__all__ = ["Deal", "DynamicSampler", "deal"]
