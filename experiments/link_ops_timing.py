"""What averaging, packing and unpacking a model cost on one thread: `mixing.mix_into`,
`Link.flat` and `Link.unpack_into` on separate tensors (torch's multi-tensor ops) and on the
same tensors laid out in one buffer (`hetsync.transport.contiguous.lay_out`, as
`SyncOptimizer` lays a model out), beside the same arithmetic done tensor by tensor in Python
(how they worked before either), for a built-in workload's tensors. With `--inputs 1` (a
pair's mean: Hop's on a ring of 2, D-PSGD's) `mix` is one lerp; the row "scaled sum" is the
same mean as a scaling and an add (how it was made before), on the laid-out buffer.

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

from hetsync.transport.contiguous import lay_out, span
from hetsync.transport.links import Link
from hetsync.transport.mixing import mix, mix_into
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
            mix(t, weight, [(view[i], weight) for view in views])

    def unpack_per_tensor() -> None:
        for t, piece in zip(tensors, _slices(flats[0], tensors), strict=True):
            t.copy_(piece)

    laid = [t.clone() for t in tensors]
    assert lay_out(laid)
    start = [t.clone() for t in tensors]
    results = []
    for average, target in ((mix_per_tensor, tensors),
                            (lambda: mix_into(link, tensors, weight, inputs), tensors),
                            (lambda: mix_into(link, laid, weight, inputs), laid)):
        for t, s in zip(target, start, strict=True):
            t.copy_(s)
        average()
        results.append(torch.cat([t.reshape(-1) for t in target]))
    assert all(torch.equal(results[0], r) for r in results), \
        "mix_into differs from the per-tensor arithmetic"

    print(f"{args.workload}: {len(tensors)} tensors, {numel * 4 / 1e6:.2f} MB, "
          f"{args.inputs} input(s), one thread")
    out = torch.empty(numel)
    whole = span(laid)
    assert whole is not None

    def scaled_sum() -> None:
        whole.mul_(weight)
        for flat in flats:
            whole.add_(flat, alpha=weight)

    rows = [
        ("mix", "scaled sum, one buffer", scaled_sum),
        ("mix", "tensor by tensor", mix_per_tensor),
        ("mix", "mixing.mix_into", lambda: mix_into(link, tensors, weight, inputs)),
        ("mix", "mixing.mix_into, one buffer", lambda: mix_into(link, laid, weight, inputs)),
        ("pack", "Link.flat", lambda: link.flat(tensors, out=out)),
        ("pack", "Link.flat, one buffer", lambda: link.flat(laid, out=out)),
        ("unpack", "tensor by tensor", unpack_per_tensor),
        ("unpack", "Link.unpack_into", lambda: link.unpack_into(flats[0], tensors)),
        ("unpack", "Link.unpack_into, one buffer", lambda: link.unpack_into(flats[0], laid)),
    ]
    for op, way, call in rows:
        print(f"{op + ',':<7} {way + ':':<30} {_ms(call, args.calls):6.3f} ms")


if __name__ == "__main__":
    main()
