"""AD-PSGD in real processes (slow): its models travel in the wire format of `--compress`, each
request charged and counted at its encoded size, and a link too slow for the run ends it at
`--max-time` rather than as a deadlock (review 4, item 3)."""

from __future__ import annotations

import json

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.protocols.adpsgd.wire import frame
from hetsync.transport.codec import Codec
from hetsync.transport.flat import model_tensors
from hetsync.workloads import get_workload

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _request_bytes(compress: str) -> int:
    """What one request of digits' model weighs on the wire: the header, then the model."""
    model = frame(model_tensors(get_workload("digits").build_model()))
    return model.words * 8 + Codec(compress).nbytes(model.numel, model.dtype)


@pytest.mark.parametrize("compress", ["bf16", "int8"])
def test_compressed_models_are_counted_at_their_wire_size_and_still_train(compress, tmp_path):
    summary = run(RunConfig(protocol="adpsgd", workload="digits", workers=2, compress=compress,
                            max_iterations=150, stop_at_target=False, quiet=True,
                            out=tmp_path / "run")).summary
    rows = [json.loads(line) for line in
            (tmp_path / "run" / "workers" / "rank1.jsonl").read_text().splitlines()]
    assert summary["stop_reason"] == "max_iterations"
    assert {row["bytes_sent"] for row in rows} == {_request_bytes(compress)}  # the active's
    assert _request_bytes(compress) < _request_bytes("none") / 1.9
    assert summary["final_loss"] < 0.5  # from 2.3


def test_a_link_too_slow_for_the_run_ends_it_at_max_time_not_as_a_deadlock(tmp_path):
    """A 10 MB request over 1 Mbit/s: the passive worker's serving thread sleeps 80 s of it,
    cut at --max-time and announced, while the active worker waits for the reply."""
    summary = run(RunConfig(protocol="adpsgd", workload="digits", workers=2, max_time=6.0,
                            hang_timeout=2.0, network="bandwidth=1mbit,latency=50us",
                            payload="10MB", quiet=True, out=tmp_path / "run")).summary
    assert summary["stop_reason"] == "max_time"
