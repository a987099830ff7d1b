"""`--pin` and `--slowdown cpu:` in real runs: what the workers see of the kernel's placement,
and the quota cgroups gone after the run, however it ended. Needs root and a cgroup cpu
controller (skipped without), and two cores for --pin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError, WorkerFailed
from hetsync.launch.cpu_placement import CpuPlacement, plan_pinning
from hetsync.launch.cpu_quota import CpuQuota
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "placement.py"


def _quota_permitted() -> bool:
    quota = CpuQuota({0: 0.5}, f"probe{os.getpid()}")
    try:
        quota.create()
    except ConfigError:
        return False
    quota.remove()
    return True


needs_quota = pytest.mark.skipif(not _quota_permitted(),
                                 reason="cgroup CPU quotas need root and a cpu controller")
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin: 2 cores")


def _our_cgroups() -> list[Path]:
    """This process's runs' quota cgroups (the launcher's pid is the run id)."""
    quota = CpuQuota({}, "")
    return sorted(quota.base.glob(f"hetsync-{os.getpid()}-rank*"))


def _facts(out: Path, name: str) -> list[dict]:
    return [json.loads((out / f"rank{r}.{name}json").read_text()) for r in range(2)]


def _cpu_cgroup(facts: dict) -> str:
    """The worker's cgroup in the cpu hierarchy (v1), or its only one (v2)."""
    lines = [line.split(":", 2) for line in facts["cgroups"]]
    return next((path for _, names, path in lines if "cpu" in names.split(",")), lines[-1][2])


@needs_quota
@needs_two_cores
def test_pinned_workers_on_cores_of_their_own_and_a_quarter_core_straggler(tmp_path,
                                                                           busy_loops_of):
    result = run(RunConfig(script=[str(SCRIPT), str(tmp_path)], protocol="adpsgd", workers=2,
                           pin=True, keep_awake=True, slowdown="cpu:ranks=1,share=0.25",
                           max_time=2.0, out=tmp_path / "run", quiet=True))
    start, end = _facts(tmp_path, "start."), _facts(tmp_path, "")
    training = _facts(tmp_path, "training.")
    plan = plan_pinning(2, 1, os.sched_getaffinity(0))  # this machine's cores, however many
    own = [sorted(cores) for cores in plan.workers]
    assert [f["cores"] for f in start] == own and own[0] != own[1]
    # the straggler starts up at full speed and joins its quota as its training starts
    assert "hetsync-" not in _cpu_cgroup(start[1])
    assert _cpu_cgroup(training[1]).endswith(f"/hetsync-{os.getpid()}-rank1")
    assert "hetsync-" not in _cpu_cgroup(training[0])
    # The kernel's guarantee, whatever else runs here: at most a quarter of a core (a
    # period's rounding of slack); how much rank 0 gets depends on the machine's load.
    assert end[1]["cpu_fraction"] < 0.3 and end[1]["iterations"] > 0
    assert result.summary["placement"] == {
        "cores": {"0": own[0], "1": own[1]}, "launcher_cores": sorted(plan.launcher),
        "kept_awake": True, "cpu_share": {"1": 0.25},
        "cgroup": "v1" if not CpuQuota({}, "").v2 else "v2"}
    assert _our_cgroups() == []
    assert busy_loops_of(os.getpid()) == []  # --keep-awake's, gone with the run


@needs_quota
def test_the_cgroup_goes_after_a_killed_worker(tmp_path):
    with pytest.raises(WorkerFailed, match="rank 1"):
        run(RunConfig(script=[str(SCRIPT), str(tmp_path)], workers=2, max_time=30.0,
                      slowdown="cpu:ranks=1,share=1", fault="kill:rank=1,at=1s",
                      out=tmp_path / "run", quiet=True))
    training = json.loads((tmp_path / "rank1.training.json").read_text())
    assert _cpu_cgroup(training).endswith(f"/hetsync-{os.getpid()}-rank1")
    assert _our_cgroups() == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["placement"]["cpu_share"] == {"1": 1.0}


@needs_quota
def test_the_next_quota_set_up_removes_a_killed_launchers_cgroups_but_not_one_in_use():
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid: a launcher that no longer runs
    base = CpuQuota({}, "").base
    stale, in_use = base / f"hetsync-{gone.pid}-rank0", base / f"hetsync-{gone.pid}-rank1"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        stale.mkdir()
        in_use.mkdir()
        (in_use / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        quota = CpuQuota({0: 0.5}, str(os.getpid()))
        quota.create()
        assert not stale.exists() and in_use.exists()
        assert quota.remove() == [] and _our_cgroups() == []
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (stale, in_use):
            _rmdir_when_empty(path)


def _rmdir_when_empty(path: Path) -> None:
    """A cgroup whose last process has just died may take a moment to be empty."""
    deadline = time.monotonic() + 5
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.slow  # a launcher's start: 11 s on a loaded 2-core VM
@needs_quota
def test_a_sigkilled_launchers_cgroup_is_removed_by_the_next_run(tmp_path, processes_of):
    """SIGKILL as soon as its cgroup exists (made before the workers are spawned): nothing of
    the launcher's own removes it, and its workers die with it."""
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import sys; from hetsync.config import RunConfig; from hetsync.launch.launcher "
        "import run; run(RunConfig(workload='svm', workers=2, max_time=60.0, quiet=True, "
        "slowdown='cpu:ranks=1,share=1', out=sys.argv[1]))"), str(out)])
    left = CpuQuota({}, "").base / f"hetsync-{launcher.pid}-rank1"
    try:
        deadline = time.monotonic() + 60
        while not left.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        launcher.kill()
        launcher.wait()
    assert left.exists()
    deadline = time.monotonic() + 10
    while processes_of(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(out) == []
    quota = CpuQuota({0: 0.5}, str(os.getpid()))
    try:
        quota.create()
        assert not left.exists()
    finally:
        quota.remove()
        if left.exists():
            _rmdir_when_empty(left)


@needs_quota
@needs_two_cores
def test_busy_loops_that_cannot_start_undo_the_quota_and_the_pinning(monkeypatch, tmp_path):
    """Each step of the placement is undone when a later one fails: no cgroup stays behind
    and the launcher gets its cores back."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    cores = os.sched_getaffinity(0)
    config = RunConfig(workers=2, pin=True, keep_awake=True, slowdown="cpu:ranks=1,share=0.5")
    with pytest.raises(FileNotFoundError), CpuPlacement(config, str(os.getpid())):
        pytest.fail("the placement should not have opened")
    assert _our_cgroups() == [] and os.sched_getaffinity(0) == cores


@pytest.mark.slow
@needs_quota
@needs_two_cores
@pytest.mark.parametrize("options", [
    {"protocol": "adpsgd", "workload": "digits"},
    # A step longer than the quota's throttled spells (75 ms of each 100 ms): with digits'
    # few-ms steps rank 1 stops for dozens of rank 0's steps at a time, more than staleness 12.
    {"protocol": "hop", "staleness": 12, "max_gap": 16, "skip": True, "send_ahead": 1,
     "average_once": True, "workload": "resnet"},
], ids=["adpsgd", "hop-stale-skip"])
def test_a_quarter_core_straggler_completes_at_most_0_4_of_the_iterations(options, train_run):
    """Real compute, no emulated step time: rank 1, capped at a quarter of its core, falls
    behind rank 0 by about its share, under AD-PSGD (asynchronous: rank 0 goes on) and under
    Hop with staleness and skipping (rank 0 goes on with stale updates, rank 1 skips to its
    newest ones). Needs an otherwise idle machine: under load rank 0 gets less than its core,
    and the ratio rises."""
    result = train_run(**options, pin=True, max_time=8.0,
                       slowdown="cpu:ranks=1,share=0.25", stop_at_target=False)
    iterations = result.summary["iterations"]
    assert iterations[1] <= 0.4 * iterations[0]
    if options["protocol"] == "hop":
        rows = read_jsonl(result.run_dir / "workers" / "rank1.jsonl")
        assert sum(row.get("skipped", 0) for row in rows) > 0
