"""Where a worker computes and how its messages travel: decided once, from counts alone.

`place()` is a pure function of the options (`--backend`, `--device`), the number of visible
GPUs, the number of workers on this machine and the worker's local rank, so that the
launcher can check a run before spawning anything (a bad combination fails in one line,
before any worker starts) and every worker, under the launcher or under torchrun
(LOCAL_WORLD_SIZE, LOCAL_RANK), reaches the same answer by itself.

The rules:

- `--device auto` computes on a GPU when one is visible, else on the CPU; `--device cuda`
  without a GPU is refused. Workers share GPUs round-robin: local rank r computes on
  `cuda:(r % GPUs)`.
- NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so it is used only where
  every local worker has a GPU of its own and the models are on them. `--backend auto`
  picks NCCL there and gloo everywhere else; `--backend nccl` elsewhere is refused.
- A workstation with one GPU and 4 workers is expected to run: gloo, the four models on
  cuda:0, their messages staged through host memory (the note says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsync.errors import ConfigError

__all__ = ["BACKENDS", "DEVICES", "Placement", "place", "visible_gpus"]

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    """A worker's backend and compute device."""

    backend: str
    """"gloo" or "nccl"."""
    device: str
    """This worker's compute device: "cpu" or "cuda:<i>"."""
    note: str | None
    """One line saying what auto chose and why, where it is not the obvious choice; None
    otherwise."""


def place(backend: str, device: str, *, gpus: int, local_workers: int,
          local_rank: int) -> Placement:
    """The backend and compute device of the worker with `local_rank` among `local_workers`
    on a machine with `gpus` visible GPUs; ConfigError (one line) for what cannot run."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be {' or '.join(BACKENDS)} (got {backend!r})")
    if device not in DEVICES:
        raise ConfigError(f"--device must be {' or '.join(DEVICES)} (got {device!r})")
    if device == "cuda" and gpus == 0:
        raise ConfigError("--device cuda needs a CUDA device; none is visible")
    on_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    compute = f"cuda:{local_rank % gpus}" if on_gpu else "cpu"
    own_gpus = on_gpu and gpus >= local_workers
    if backend == "nccl":
        if device == "cpu":
            raise ConfigError("--backend nccl sends device memory, but --device cpu keeps the "
                              "models on the CPU: use --backend gloo or --device cuda")
        if not on_gpu:
            raise ConfigError("--backend nccl needs CUDA devices; none is visible here")
        if not own_gpus:
            raise ConfigError(f"--backend nccl needs a GPU per worker: {local_workers} workers "
                              f"on this machine, {_gpus(gpus)} visible; --backend gloo lets "
                              "them share")
    chosen = backend if backend != "auto" else ("nccl" if own_gpus else "gloo")
    note = None
    if backend == "auto" and on_gpu and not own_gpus:
        share = "cuda:0" if gpus == 1 else f"cuda:0..{gpus - 1}"
        note = (f"{local_workers} workers share {_gpus(gpus)}: gloo, the workers' models on "
                f"{share} round-robin, their messages staged through host memory")
    return Placement(backend=chosen, device=compute, note=note)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def visible_gpus() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    import torch  # late: a placement checked from the CLI must not cost a torch import

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
