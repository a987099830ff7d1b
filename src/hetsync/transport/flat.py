"""One flat buffer per synchronisation: a single collective instead of one per tensor.

The last element of a gradient buffer carries this worker's stop vote, so that all workers
agree to stop at the same iteration without an extra collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "broadcast_model",
    "flatten",
    "flatten_with_vote",
    "model_tensors",
    "ring_allreduce_bytes",
    "unflatten_into",
]


def flatten(tensors: Sequence[torch.Tensor], *extra: float) -> torch.Tensor:
    """A new 1-D buffer: the tensors' values (detached), then the `extra` scalars (headers,
    votes) in the tensors' dtype."""
    first = tensors[0]
    tail = torch.tensor(extra, dtype=first.dtype, device=first.device)
    return torch.cat([t.detach().reshape(-1) for t in tensors] + [tail])


def flatten_with_vote(tensors: Sequence[torch.Tensor], vote: bool) -> torch.Tensor:
    """Concatenate `tensors` and a trailing 1.0 (stop) or 0.0 (go on) into a new buffer."""
    return flatten(tensors, 1.0 if vote else 0.0)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of `flat` back into `tensors` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def ring_allreduce_bytes(buffer: torch.Tensor, world_size: int) -> int:
    """Bytes one worker sends in a bandwidth-optimal (ring) all-reduce of `buffer`."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * buffer.numel() * buffer.element_size() / world_size)


def model_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors that make up a model's state to share: parameters and floating buffers."""
    return [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]


def broadcast_model(model: nn.Module, src: int = 0) -> None:
    """Give every worker `src`'s floating-point parameters and buffers (one broadcast)."""
    tensors = model_tensors(model)
    if not tensors:
        return
    with torch.no_grad():
        flat = flatten(tensors)
        dist.broadcast(flat, src)
        unflatten_into(flat, tensors)
