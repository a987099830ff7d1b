"""The model arithmetic: every weighted average hetsync makes of a model and flat buffers of
its layout (`mix`, `pair_mean`), and the in-place averages of a model's tensors with such
buffers on a link (`mix_into`, `average_pair_into`), which take the fastest path that gives
the reference's bits (experiments/link_ops_timing.py measures them). No communication: the
links (`hetsync.transport.links`) move the buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hetsync.transport.contiguous import pieces, span, views

if TYPE_CHECKING:
    from hetsync.transport.links import Link

__all__ = ["average_pair_into", "mix", "mix_into", "pair_mean"]


def mix_into(link: Link, tensors: Sequence[torch.Tensor], self_weight: float,
             inputs: Sequence[tuple[torch.Tensor, float]],
             out: torch.Tensor | None = None) -> torch.Tensor | None:
    """tensors <- self_weight * tensors + sum(weight * flat) over `inputs` (flat buffers of
    the tensors' layout on this link), in `mix`'s arithmetic, as `flat`, `mix` and then
    `unpack_into` would give: bit for bit in fp32; in bf16 an element may differ by one
    rounding, where a tensor's boundary moves it between the kernels' vectorised and
    scalar loops, which round the scaled sum apart. Where every tensor is on the wire
    device in the buffers' dtype the sum is made in the tensors themselves: one pass over
    the model per term (one in all for a pair), and no model-sized buffer (through one, a
    45 MB model's average costs tens of ms more). Else it goes through a flat buffer
    (`out`, reused), returned for the next call."""
    flats = [flat for flat, _ in inputs]
    whole = span(tensors)
    if (whole is not None and whole.device == link.device
            and all(f.dtype == whole.dtype for f in flats)):
        n = whole.numel()  # a laid-out model: the reference's arithmetic, in place
        with torch.no_grad():
            mix(whole, self_weight, [(flat[:n], weight) for flat, weight in inputs])
        return out
    if all(t.device == link.device and all(t.dtype == f.dtype for f in flats)
           for t in tensors):
        with torch.no_grad():
            if _foreach_exact(tensors):
                # One call per term for all tensors, not a Python loop over a ResNet's
                # hundred small tensors (experiments/link_ops_timing.py).
                targets = [t.view(-1) for t in tensors]
                if _is_pair(self_weight, inputs):
                    torch._foreach_lerp_(targets, pieces(flats[0], tensors), inputs[0][1])
                    return out
                torch._foreach_mul_(targets, self_weight)
                for flat, weight in inputs:
                    torch._foreach_add_(targets, pieces(flat, tensors), alpha=weight)
                return out
            shaped = [views(flat, tensors) for flat in flats]
            for i, t in enumerate(tensors):  # torch._foreach_add_ rounds bf16 otherwise
                mix(t, self_weight, [(piece[i], weight) for (_, weight), piece
                                     in zip(inputs, shaped, strict=True)])
        return out
    average = link.flat(tensors, out=out)
    mix(average, self_weight, inputs)
    with torch.no_grad():
        link.unpack_into(average, tensors)
    return average


def average_pair_into(link: Link, tensors: Sequence[torch.Tensor], other: torch.Tensor,
                      out: torch.Tensor) -> None:
    """out <- the mean of tensors and other (`mix`'s for a pair), then tensors <- out: as
    `flat`, that mean and `unpack_into` would give, bit for bit (`other` and `out` are
    flat buffers of the tensors' layout on this link). Where every tensor is on the wire
    device in the buffers' dtype it goes tensor by tensor, each one's two passes while it
    is in cache; through the flat buffer it takes three passes over the whole model
    (AD-PSGD's serving, 45 MB a request with a full-width ResNet-18)."""
    whole = span(tensors)
    if whole is not None and whole.device == link.device and whole.dtype == out.dtype:
        n = whole.numel()  # a laid-out model: the reference's arithmetic, in place
        with torch.no_grad():
            mean = out[:n]
            pair_mean(whole, other[:n], mean)
            whole.copy_(mean)
        return
    if all(t.device == link.device and t.dtype == out.dtype for t in tensors):
        with torch.no_grad():
            for t, theirs, mean in zip(tensors, views(other, tensors),
                                       views(out, tensors), strict=True):
                pair_mean(t, theirs, mean)
                t.copy_(mean)
        return
    average = link.flat(tensors, out=out)
    pair_mean(average, other, average)
    link.unpack_into(average, tensors)


def mix(target: torch.Tensor, self_weight: float,
        inputs: Sequence[tuple[torch.Tensor, float]]) -> None:
    """target <- self_weight * target + sum(weight * x) over `inputs`, in place: the one
    arithmetic of every weighted average hetsync makes, whatever the path (`mix_into`).
    A pair (one input, the weights summing to 1) is torch's `lerp`, one pass over the model
    rather than a scaling and an add: two models being averaged are close (within a factor of
    2 of each other, their difference is exact), and there it gives the correctly rounded
    mean, as the scaled sum does; elsewhere (values of opposite signs) it is within a
    rounding of the larger value. On 45 MB, 5.1 -> 3.3 ms a mean (experiments/link_ops_timing.py
    --workload resnet-wide --inputs 1)."""
    with torch.no_grad():
        if _is_pair(self_weight, inputs):
            target.lerp_(inputs[0][0], inputs[0][1])
            return
        target.mul_(self_weight)
        for x, weight in inputs:
            target.add_(x, alpha=weight)


def pair_mean(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out <- the mean of a and b as `mix` makes a pair's (one lerp, one pass); `out` may be
    `a` or `b` itself. Not symmetric in its rounding where a and b are far apart: members who
    must agree bit for bit compute it in one order (or one of them does)."""
    with torch.no_grad():
        return torch.lerp(a, b, 0.5, out=out)


def _is_pair(self_weight: float, inputs: Sequence[tuple[torch.Tensor, float]]) -> bool:
    """Whether `mix`'s sum is a pair's weighted mean: one input, the weights summing to 1."""
    return len(inputs) == 1 and self_weight + inputs[0][1] == 1


def _foreach_exact(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether torch's multi-tensor ops give, bit for bit, what the same ops tensor by tensor
    give: on the CPU (a loop over the tensors in C++) in fp32 or fp64, on contiguous tensors
    (flattened as views). Elsewhere fused kernels may round otherwise (bf16 does)."""
    return bool(tensors) and all(t.device.type == "cpu" and t.is_contiguous()
                                 and t.dtype in (torch.float32, torch.float64) for t in tensors)
