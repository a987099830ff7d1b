"""A script whose loop ends by itself (`optimizer.iterate(batches, epochs=E)`) ends the run
cleanly under every protocol and every option that changes how a protocol ends.

The commonest way a script ends: its epochs run out, and `close()` comes without a step that
the run's stop conditions flagged last. Overlapped Prague waited forever there. Workers may
also run out at different iterations (`uneven`: rank r has r more batches an epoch), which
only protocols whose workers stop independently allow (a lock-step protocol's workers must
see the same number of batches), and the run's stop (`--max-iterations`) may come first or
in between. lr = 0 from different models: the sum of the models must be conserved.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parents[1] / "launch" / "scripts" / "epochs.py"
EPOCHS, BATCHES = 2, 4
SLOW = pytest.mark.slow

RANDOM = {"gg_policy": "random", "group_size": 2}
# protocol, options, workers, uneven shards
ENDINGS = [
    ("prague", {}, 3, True),  # overlap, ready groups: the default
    pytest.param("prague", {**RANDOM, "group_buffer": True}, 3, True,
                 marks=SLOW),  # the paper's policy, overlapped; CI time
    pytest.param("prague", {**RANDOM, "overlap": False}, 3, True, marks=SLOW),  # between steps
    ("prague", {"schedule": "static"}, 3, True),
    pytest.param("prague", RANDOM, 3, True, marks=SLOW),
    pytest.param("prague", {"overlap": False}, 3, True, marks=SLOW),
    pytest.param("prague", {**RANDOM, "group_buffer": True, "overlap": False}, 3, True,
                 marks=SLOW),
    pytest.param("hop", {}, 2, False, marks=SLOW),
    pytest.param("dpsgd", {}, 2, False, marks=SLOW),  # also tests/protocols/test_decentralized
    ("adpsgd", {}, 2, True),
    pytest.param("hop", {"skip": True, "staleness": 2}, 3, True, marks=SLOW),
    pytest.param("allreduce", {}, 2, False, marks=SLOW),
    pytest.param("ddp", {}, 2, False, marks=SLOW),
    pytest.param("ps", {"ps_mode": "sync"}, 2, False, marks=SLOW),
    pytest.param("ps", {"ps_mode": "async"}, 2, True, marks=SLOW),
]


def _run(tmp_path: Path, protocol: str, options: dict, workers: int, uneven: bool,
         max_iterations: int | None) -> tuple[list[int], str | None]:
    """Run the script; check the sum of the models; the iterations each worker ran and the
    run's stop reason."""
    out = tmp_path / "run"
    out.mkdir()
    script = [str(SCRIPT), str(out), str(EPOCHS), str(BATCHES), *(["uneven"] if uneven else [])]
    result = run(RunConfig(protocol=protocol, workers=workers, script=script, out=out,
                           max_iterations=max_iterations, max_time=120, hang_timeout=10.0,
                           quiet=True, device="cpu", **options))
    saved = [torch.load(out / f"final_rank{r}.pt") for r in range(workers)]
    # The PS's server model is the run's, the workers' copies. Hop with --skip: a worker that
    # leaves first has its last updates unapplied by the others (the sum drifts; open, not a hang).
    if protocol != "ps" and not options.get("skip"):
        initial = torch.stack([s["initial"] for s in saved]).sum(0)
        assert torch.allclose(torch.stack([s["final"] for s in saved]).sum(0), initial,
                              atol=1e-5)
    assert result.summary["iterations"] == [s["iteration"] for s in saved]
    return [s["iteration"] for s in saved], result.summary["stop_reason"]


@pytest.mark.parametrize(("protocol", "options", "workers", "uneven"), ENDINGS)
def test_the_loop_ends_by_itself(protocol, options, workers, uneven, tmp_path):
    iterations, reason = _run(tmp_path, protocol, options, workers, uneven, None)
    assert reason is not None and reason.startswith("loop ended after iteration")
    assert iterations == [EPOCHS * (BATCHES + (r if uneven else 0)) for r in range(workers)]


@pytest.mark.parametrize(("protocol", "options", "workers", "uneven"),
                         [ENDINGS[0], *(pytest.param(*getattr(p, "values", p), marks=SLOW)
                                        for p in ENDINGS[1:])])
def test_the_runs_stop_comes_first(protocol, options, workers, uneven, tmp_path):
    """--max-iterations before the loop's end; with uneven shards after rank 0's end, before
    the others' (each ends at the earlier of the two)."""
    k = EPOCHS * BATCHES + (1 if uneven else -3)
    iterations, _ = _run(tmp_path, protocol, options, workers, uneven, k)
    ends = [EPOCHS * (BATCHES + (r if uneven else 0)) for r in range(workers)]
    assert iterations == [min(k, end) for end in ends]


def test_uneven_shards_under_a_lock_step_protocol_name_the_worker_whose_loop_ended(tmp_path):
    """All-reduce's workers wait for each other every step: the worker whose data ran out
    first is named, not blamed for a deadlock."""
    script = [str(SCRIPT), str(tmp_path), "1", "3", "uneven"]
    with pytest.raises(WorkerFailed, match="rank 0 ended its loop by itself after iteration 3"):
        run(RunConfig(protocol="allreduce", workers=2, script=script, out=tmp_path / "run",
                      hang_timeout=3.0, quiet=True, device="cpu"))
