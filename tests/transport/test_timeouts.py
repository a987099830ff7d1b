"""How long a worker's waits on its peers may last (`hetsync.transport.runtime.pg_timeout`):
under hetsync's launcher, which tells a busy worker from a hung one, beyond any run; without
it, torch's own default, or --hang-timeout where that is longer."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from hetsync.config import RunConfig
from hetsync.transport.runtime import Runtime, pg_timeout

_DAY = datetime.timedelta(days=1)


def test_under_the_launcher_no_wait_ends_before_the_longest_run():
    assert pg_timeout(True, 20.0) >= 30 * _DAY  # the longest --max-time
    assert pg_timeout(True, 20 * 86400.0) >= 4 * 20 * _DAY  # and well past --hang-timeout


def test_without_the_launcher_torchs_default_or_the_hang_timeout():
    assert pg_timeout(False, 20.0) == dist.default_pg_timeout == datetime.timedelta(minutes=30)
    assert pg_timeout(False, 7200.0) == datetime.timedelta(hours=2)


def test_a_protocols_own_waits_match_the_process_groups_under_the_launcher():
    for launched, expected in ((True, pg_timeout(True, 3.0).total_seconds()), (False, 3.0)):
        runtime = Runtime(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"),
                          backend="gloo", config=RunConfig(hang_timeout=3.0),
                          store=dist.HashStore(), t0=0.0, run_dir=None, launched=launched,
                          hang_timeout=3.0)
        assert runtime.wait_timeout == expected
        assert runtime.group_timeout == pg_timeout(launched, 3.0)
