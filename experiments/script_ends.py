"""Does the plainest script end its run cleanly under every protocol, both ways it can end?

tests/launch/scripts/plain_loop.py (a `for` loop of `step()` calls that never reads
`should_stop` and calls nothing of hetsync at its end), 2 workers, under every protocol family:
its loop running out (6 steps: the exit closes the run), and an endless loop that
`--max-iterations 8` stops (its next `step()` raises `hetsync.RunStopped`). One line a run: the
stop reason and the iterations, or the first line of the failure. About 10 s a run here.

    python experiments/script_ends.py [--out runs/script-ends]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "launch" / "scripts" / "plain_loop.py"
PROTOCOLS = (("allreduce", {}), ("ddp", {}), ("ps", {"ps_mode": "sync"}),
             ("ps", {"ps_mode": "async"}), ("dpsgd", {}), ("adpsgd", {}), ("hop", {}),
             ("prague", {}), ("localsgd", {}))
#: How each run ends: the loop's length (the script's argument) and the run's limit.
ENDINGS = {"runs out": ("6", {}), "stopped": ("forever", {"max_iterations": 8})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/script-ends"))
    args = parser.parse_args()
    for ending, (steps, limits) in ENDINGS.items():
        for protocol, options in PROTOCOLS:
            label = "-".join([protocol, *map(str, options.values())])
            out = args.out / ending.replace(" ", "-") / label
            out.mkdir(parents=True, exist_ok=True)
            began = time.monotonic()
            try:
                summary = run(RunConfig(protocol=protocol, workers=2, script=[str(SCRIPT),
                                        str(out), steps], out=out, quiet=True, device="cpu",
                                        overwrite=True, **options, **limits)).summary
                tracebacks = sorted(p.name for p in (out / "logs").glob("rank*.log"))
                said = f"{summary['stop_reason']} {summary['iterations']}"
                said += f" (tracebacks: {tracebacks})" if tracebacks else ""
            except Exception as error:  # noqa: BLE001 - a failed run is a row, not the end
                said = f"FAILED: {str(error).splitlines()[0]}"
            print(f"{ending:8} {label:12} {time.monotonic() - began:5.1f} s  {said}", flush=True)


if __name__ == "__main__":
    main()
