"""What a new model-sized buffer costs against one reused: the page faults behind a fresh
allocation (glibc maps anything above its mmap threshold, at most 32 MB, as new pages).

For each size, the time of `torch.empty(n).copy_(x)` (what a driver that allocates per message
pays) against `buf.copy_(x)` into one buffer allocated once, in one thread; median of
`--repeats` runs of a loop of 20. Takes seconds. Quoted in docs/notes/real-compute-log.md
("Model-sized buffers").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

SIZES_MB = (1, 8, 45, 100)
"""45 MB: full-width ResNet-18 (`--workload resnet-wide`) in fp32."""


def _ms(work: Callable[[], object], loops: int = 20) -> float:
    work()
    began = time.perf_counter()
    for _ in range(loops):
        work()
    return (time.perf_counter() - began) / loops * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| MB | new buffer (ms) | reused buffer (ms) | new / reused |")
    print("| --- | --- | --- | --- |")
    for mb in SIZES_MB:
        n = mb * 2**20 // 4
        x, reused = torch.randn(n), torch.empty(n)
        new = statistics.median(_ms(lambda n=n, x=x: torch.empty(n).copy_(x))
                                for _ in range(args.repeats))
        kept = statistics.median(_ms(lambda x=x, reused=reused: reused.copy_(x))
                                 for _ in range(args.repeats))
        print(f"| {mb} | {new:.2f} | {kept:.2f} | {new / kept:.1f}x |")


if __name__ == "__main__":
    main()
