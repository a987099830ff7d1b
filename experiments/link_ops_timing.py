"""What averaging and unpacking a model cost on one thread: `Link.mix_into` and
`Link.unpack_into` beside the same arithmetic done tensor by tensor in Python (how they worked
before they used torch's multi-tensor ops), for a built-in workload's tensors.

    python experiments/link_ops_timing.py [--workload resnet] [--inputs 2] [--calls 200]

Prints milliseconds a call, the median of 5 rounds; the results of both ways are compared
bit for bit first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hetsync.transport.links import Link
from hetsync.workloads import get_workload


def _ms(call: Callable[[], object], calls: int) -> float:
    rounds = []
    for _ in range(5):
        call()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter() - start) / calls * 1000)
    return statistics.median(rounds)


def _slices(flat: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per tensor, a Python slice of `flat` shaped as it: the per-tensor way."""
    out, offset = [], 0
    for t in tensors:
        out.append(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet")
    parser.add_argument("--inputs", type=int, default=2, help="updates mixed in (Hop: in-degree)")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = get_workload(args.workload).build_model()
    tensors = [t.data for t in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    numel = sum(t.numel() for t in tensors)
    link = Link.default()
    weight = 1.0 / (args.inputs + 1)
    flats = [torch.randn(numel) for _ in range(args.inputs)]
    inputs = [(flat, weight) for flat in flats]

    def mix_per_tensor() -> None:
        views = [_slices(flat, tensors) for flat in flats]
        for i, t in enumerate(tensors):
            t.mul_(weight)
            for view in views:
                t.add_(view[i], alpha=weight)

    def unpack_per_tensor() -> None:
        for t, piece in zip(tensors, _slices(flats[0], tensors), strict=True):
            t.copy_(piece)

    start = [t.clone() for t in tensors]
    results = []
    for mix in (mix_per_tensor, lambda: link.mix_into(tensors, weight, inputs)):
        for t, s in zip(tensors, start, strict=True):
            t.copy_(s)
        mix()
        results.append(torch.cat([t.reshape(-1) for t in tensors]))
    assert torch.equal(*results), "mix_into differs from the per-tensor arithmetic"

    print(f"{args.workload}: {len(tensors)} tensors, {numel * 4 / 1e6:.2f} MB, "
          f"{args.inputs} input(s), one thread")
    print(f"mix, tensor by tensor:  {_ms(mix_per_tensor, args.calls):.2f} ms")
    print(f"mix, Link.mix_into:     "
          f"{_ms(lambda: link.mix_into(tensors, weight, inputs), args.calls):.2f} ms")
    print(f"unpack, tensor by tensor: {_ms(unpack_per_tensor, args.calls):.2f} ms")
    print(f"unpack, Link.unpack_into: "
          f"{_ms(lambda: link.unpack_into(flats[0], tensors), args.calls):.2f} ms")


if __name__ == "__main__":
    main()
