"""The launcher evaluates a GPU run's snapshots on the GPU: a full-width ResNet-18's held-out
pass takes the CPU minutes (the `gpu` suite's runs ended by waiting for it)."""

from __future__ import annotations

import pytest
import torch

from hetsync.metrics.evaluator import WorkloadMeasure
from hetsync.workloads import get_workload

pytestmark = pytest.mark.gpu


def test_a_measure_on_the_device_gives_the_cpus_loss_and_accuracy(gpu_device):
    workload = get_workload("digits")
    state = workload.build_model().state_dict()
    on_cpu = WorkloadMeasure(workload, 100, device="cpu")
    on_device = WorkloadMeasure(workload, 100, device=gpu_device)
    assert next(on_device.model.parameters()).device.type == torch.device(gpu_device).type
    for subset in (True, False):
        (loss, accuracy), (loss_d, accuracy_d) = on_cpu(state, subset), on_device(state, subset)
        assert loss_d == pytest.approx(loss, rel=1e-4) and accuracy_d == accuracy
