"""Time real gloo communications between processes in the namespaces of a `ShapedNetwork`.

`time_cases` (the parent) starts one process per worker inside its namespace, running this
file; rank 0 prints one JSON line with every case's durations. Each repetition starts at an
agreed instant (the clock is the machine's monotonic clock, shared by every namespace); it is
timed from the moment the last participant has woken up to begin (how late that was is
reported: a loaded machine wakes processes late) until the last participant is done. A warm-up
repetition is dropped.

Cases, `nbytes` each:
- p2p: rank 0 sends to rank 1, the others idle;
- allreduce: `dist.all_reduce` over every rank (gloo's ring, torch 2.13);
- incast: every other rank sends to rank 0 at once, which receives them all (a parameter
  server's gather).

Beside the time, each case reports how busy the processes and the machine were, so that a
CPU-bound run can be told from a network-bound one.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shaping import IFNAME, ShapedNetwork

CASES = ("p2p", "allreduce", "incast")
PORT = 29500  # every namespace has its own ports
START_MARGIN_S = 0.1


def time_cases(net: ShapedNetwork, cases: list[str], nbytes: int, repeats: int,
               realtime: bool = False, timeout_s: float = 600.0) -> dict[str, Any]:
    """Each case's durations (s), and CPU use, from processes in `net`'s namespaces; with
    `realtime`, the processes ask for real-time priority once torch is imported."""
    spec = json.dumps({"cases": cases, "nbytes": nbytes, "repeats": repeats,
                       "world": net.workers, "master": net.ips[0], "realtime": realtime})
    procs: list[subprocess.Popen[str]] = []
    env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, "OMP_NUM_THREADS": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}  # namespaces have no names for their addresses
    with tempfile.TemporaryDirectory() as logs:
        try:
            for rank in range(net.workers):
                argv = net.command(rank, [sys.executable, __file__, spec, str(rank)])
                with open(Path(logs) / f"{rank}.err", "w") as err:
                    procs.append(subprocess.Popen(
                        argv, env=env, text=True, stderr=err,
                        stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL))
            out, _ = procs[0].communicate(timeout=timeout_s)
            for p in procs[1:]:
                p.wait(timeout=30)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"shaped timing did not finish within {timeout_s:.0f} s") from e
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode]
        if failed:
            err = (Path(logs) / f"{failed[0]}.err").read_text().strip().splitlines()[-5:]
            raise RuntimeError(f"shaped timing: rank {failed[0]} failed: " + " | ".join(err))
    return json.loads(out.strip().splitlines()[-1])


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _realtime() -> bool:
    """Take the lowest real-time priority (SCHED_FIFO 1), which the threads gloo starts
    inherit: other sessions' load on a shared machine then no longer delays our wake-ups,
    which stall gloo's ring (it keeps only two segments in flight). Whether it was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        return False
    return True


def _worker(spec: dict[str, Any], rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    realtime = spec["realtime"] and _realtime()
    world = spec["world"]
    dist.init_process_group("gloo", init_method=f"tcp://{spec['master']}:{PORT}", rank=rank,
                            world_size=world)
    buf = torch.ones(spec["nbytes"] // 4)
    inbox = [torch.empty_like(buf) for _ in range(world)] if rank == 0 else []

    def run(case: str) -> bool:
        """This rank's part of `case`; whether it takes part."""
        if case == "p2p":
            if rank == 0:
                dist.send(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
            return rank < 2
        if case == "allreduce":
            dist.all_reduce(buf)
        elif rank == 0:
            for work in [dist.irecv(inbox[s], s) for s in range(1, world)]:
                work.wait()
        else:
            dist.send(buf, 0)
        return True

    results: dict[str, Any] = {}
    for case in spec["cases"]:
        durations, late, cpu, busy = [], [], [], []
        for rep in range(1 + spec["repeats"]):
            go = torch.tensor([time.perf_counter() + START_MARGIN_S], dtype=torch.float64)
            dist.broadcast(go, 0)
            time.sleep(max(0.0, go.item() - time.perf_counter()))
            cpu0, machine0 = _own_cpu(), _machine_busy()
            start = time.perf_counter()
            part = run(case)
            end = time.perf_counter()
            mine = torch.tensor([start, end, _own_cpu() - cpu0, float(part)], dtype=torch.float64)
            every = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(every, mine)
            machine1 = _machine_busy()
            if rep == 0:
                continue  # warm-up
            parts = [t for t in every if t[3]]
            wall = max(float(t[1]) for t in parts) - max(float(t[0]) for t in parts)
            durations.append(wall)
            late.append(max(float(t[0]) for t in parts) - go.item())
            cpu.append(sum(float(t[2]) for t in every) / wall)
            busy.append((machine1[0] - machine0[0]) / (machine1[1] - machine0[1]))
        results[case] = {"durations_s": durations, "late_start_s": late,
                         "process_cpu_cores": cpu, "machine_busy": busy}
    dist.barrier()
    if rank == 0:
        print(json.dumps({"cases": results, "realtime": realtime}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
