"""Run options refused before anything starts."""

from __future__ import annotations

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.errors import ConfigError


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA devices")
@pytest.mark.parametrize("protocol", ["allreduce", "ps", "adpsgd", "hop", "prague"])
def test_nccl_without_cuda_is_refused_in_one_line(protocol):
    with pytest.raises(ConfigError, match="--backend nccl needs CUDA devices"):
        RunConfig(protocol=protocol, workload="digits", backend="nccl").validate()
