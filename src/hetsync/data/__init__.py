"""Data for a run's workers: each epoch dealt out as they ask (`DynamicSampler`, `deal`)."""

from hetsync.data.sampler import DynamicSampler, deal

__all__ = ["DynamicSampler", "deal"]
