"""`--pin` and `--slowdown cpu:` refused in one line before anything starts (no processes)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch import cpu_quota
from hetsync.launch.cpu_placement import physical_cores, plan_pinning
from hetsync.launch.cpu_quota import CpuQuota
from hetsync.launch.launcher import evaluates_while_running, run


def test_pinning_gives_each_worker_its_own_cores_and_the_launcher_the_rest():
    pinning = plan_pinning(2, 2, {0, 1, 2, 3, 4, 5}, physical=[])
    assert pinning.workers == [{0, 1}, {2, 3}] and pinning.launcher == {4, 5}
    assert not pinning.launcher_shares
    assert pinning.note == "--pin: 2 workers on cores 0-3 (2 each), the launcher on cores 4-5"


def test_without_cores_to_spare_the_launcher_shares_the_last_workers_and_says_so():
    pinning = plan_pinning(2, 1, {3, 7}, physical=[])
    assert pinning.workers == [{3}, {7}] and pinning.launcher == {7}
    assert pinning.note == ("--pin: 2 workers on 2 cores: the launcher shares core 7 with rank 1 "
                            "(its evaluation at the lowest priority)")
    assert pinning.launcher_shares


#: A machine of 4 physical cores with 2 threads each, numbered as many x86 machines number
#: them: each core's second thread half the machine away (0 and 4 share a physical core).
HALF_APART = [frozenset({0, 4}), frozenset({1, 5}), frozenset({2, 6}), frozenset({3, 7})]
#: The same machine numbered as others number it: siblings side by side.
SIDE_BY_SIDE = [frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})]


@pytest.mark.parametrize("physical", [HALF_APART, SIDE_BY_SIDE], ids=["half-apart", "adjacent"])
def test_one_core_each_puts_no_two_workers_on_one_physical_core(physical):
    pinning = plan_pinning(4, 1, set(range(8)), physical=physical)
    of = {core: group for group in physical for core in group}
    assert len({of[core] for cores in pinning.workers for core in cores}) == 4
    assert pinning.launcher == set(range(8)) - set().union(*pinning.workers)
    assert "one thread of each physical core first" in pinning.note


@pytest.mark.parametrize("physical", [HALF_APART, SIDE_BY_SIDE], ids=["half-apart", "adjacent"])
def test_two_cores_each_are_a_whole_physical_core(physical):
    pinning = plan_pinning(3, 2, set(range(8)), physical=physical)
    assert all(cores in physical for cores in pinning.workers)
    assert pinning.launcher in physical and pinning.launcher not in pinning.workers
    assert "whole physical cores" in pinning.note


def test_physical_cores_are_read_from_sysfs(tmp_path):
    for core, siblings in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3"), (4, "4")]:
        topology = tmp_path / f"cpu{core}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(siblings + "\n")
    (tmp_path / "cpufreq").mkdir()
    assert physical_cores(tmp_path) == [{0, 2}, {1, 3}, {4}]
    (tmp_path / "cpu5" / "topology").mkdir(parents=True)
    (tmp_path / "cpu5" / "topology" / "thread_siblings_list").write_text("5-7\n")
    assert physical_cores(tmp_path)[-1] == {5, 6, 7}


def test_pin_with_more_workers_than_cores_is_one_line():
    with pytest.raises(ConfigError) as error:
        plan_pinning(3, 1, {0, 1})
    assert str(error.value) == ("--pin: 3 workers x 1 core(s) need 3 cores, but this process "
                                "may run on 2 (cores 0-1): use fewer workers or leave --pin out")


def test_pin_refusal_comes_before_the_run_directory(tmp_path, capsys):
    cores = len(os.sched_getaffinity(0))  # two workers of all of them: more than there are
    out = tmp_path / "run"
    code = main(["train", "--workload", "svm", "--workers", "2", "--pin", "--cpus-per-worker",
                 str(cores), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("hetsync: error: --pin:") and "\n" not in err
    assert not out.exists()


def test_cpus_per_worker_needs_pin():
    with pytest.raises(ConfigError, match="add --pin"):
        RunConfig(workers=2, cpus_per_worker=2).validate()
    with pytest.raises(ConfigError, match="--cpus-per-worker must be >= 1"):
        RunConfig(workers=2, pin=True, cpus_per_worker=0).validate()


def test_no_cgroup_hierarchy_is_one_line_before_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_quota, "CGROUP_ROOT", tmp_path / "no-cgroups")
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        run(RunConfig(workload="svm", workers=2, slowdown="cpu:ranks=1,share=0.5", out=out,
                      quiet=True))
    assert "--slowdown cpu needs the cgroup cpu controller" in str(error.value)
    assert "\n" not in str(error.value) and not out.exists()


def test_a_cgroup_the_kernel_refuses_is_one_line_and_leaves_nothing(tmp_path):
    """A directory that looks like a v1 cpu hierarchy but is not a cgroup file system: the
    new cgroup has no control files, as if the kernel had refused it."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    quota = CpuQuota({1: 0.5}, "test", root=tmp_path)
    with pytest.raises(ConfigError) as error:
        quota.create()
    assert "is not a cgroup cpu hierarchy" in str(error.value) and "\n" not in str(error.value)
    assert sorted(p.name for p in (tmp_path / "cpu").iterdir()) == ["cpu.cfs_quota_us"]


def test_a_cgroup_that_cannot_be_made_is_one_line(tmp_path):
    """mkdir refused (here: a file of that name is in the way), as on a read-only mount."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "hetsync-test-rank0").write_text("")
    with pytest.raises(ConfigError) as error:
        CpuQuota({0: 0.5}, "test", root=tmp_path).create()
    assert str(error.value).startswith("--slowdown cpu: cannot create cgroup ")
    assert "\n" not in str(error.value)


def test_under_torchrun_there_is_no_launcher_to_pin_or_cap(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    code = main(["train", "--workload", "svm", "--slowdown", "cpu:ranks=0,share=0.5",
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "applied by hetsync's launcher" in err and "\n" not in err


def test_a_pinned_run_that_does_not_stop_at_the_target_evaluates_after_its_workers():
    """Nothing in such a run depends on the evaluation, and a launcher evaluating beside
    pinned workers takes a core next to them; unless its snapshots would fill the disk."""
    pinned = RunConfig(workers=2, pin=True, stop_at_target=False, max_time=30, eval_every=2)
    mb = 2**20
    assert not evaluates_while_running(pinned, set_bytes=90 * mb, free_bytes=10 * 2**30)
    # 17 sets of 90 MB are 1.5 GB: more than a quarter of 4 GB free
    assert evaluates_while_running(pinned, set_bytes=90 * mb, free_bytes=4 * 2**30)
    assert evaluates_while_running(RunConfig(workers=2, pin=True, max_time=30), mb, 2**40)
    assert evaluates_while_running(RunConfig(workers=2, stop_at_target=False, max_time=30),
                                   mb, 2**40)
    assert evaluates_while_running(RunConfig(workers=2, pin=True, stop_at_target=False,
                                             max_iterations=100), mb, 2**40)


def _gone_pid() -> int:
    """A pid no process has (one that has just exited)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_new_run_removes_the_empty_cgroups_of_launchers_that_no_longer_run(tmp_path):
    """On a directory shaped like a v1 hierarchy: an empty directory is removed as an empty
    cgroup is, and a full one refused, as a cgroup with a process in it is (EBUSY)."""
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    dead = _gone_pid()
    for name in (f"hetsync-{dead}-rank0", f"hetsync-{dead}-rank1", "hetsync-1-rank0",
                 "hetsync-test-rank0", "other"):
        (cpu / name).mkdir()
    (cpu / f"hetsync-{dead}-rank1" / "in-use").write_text("")
    quota = CpuQuota({}, str(os.getpid()), root=tmp_path)
    assert quota.remove_stale() == [cpu / f"hetsync-{dead}-rank0"]
    assert {p.name for p in cpu.iterdir() if p.is_dir()} == {
        f"hetsync-{dead}-rank1", "hetsync-1-rank0", "hetsync-test-rank0", "other"}


def _v2_root(tmp_path: Path, enabled: str) -> Path:
    """A directory shaped like a cgroup v2 root with the cpu controller, `enabled` in its
    subtree (a plain file keeps what is written last, where the kernel's adds and removes)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.subtree_control").write_text(enabled + "\n")
    return tmp_path


def test_under_cgroup_v2_a_run_that_enabled_the_cpu_controller_disables_it_after(tmp_path):
    root = _v2_root(tmp_path, "memory")
    quota = CpuQuota({}, "test", root=root)
    quota.create()
    assert (root / "cgroup.subtree_control").read_text() == "+cpu\n" and quota.enabled_cpu
    assert quota.remove() == []
    assert (root / "cgroup.subtree_control").read_text() == "-cpu\n"


def test_under_cgroup_v2_the_cpu_controller_stays_where_it_was_or_another_run_needs_it(
        tmp_path):
    root = _v2_root(tmp_path / "enabled", "cpu memory")
    quota = CpuQuota({}, "test", root=root)
    quota.create()
    assert quota.remove() == [] and not quota.enabled_cpu
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory\n"
    root = _v2_root(tmp_path / "shared", "memory")
    (root / "hetsync-1-rank0").mkdir()  # pid 1's: a run that goes on
    quota = CpuQuota({}, "test", root=root)
    quota.create()
    assert quota.remove() == []
    assert (root / "cgroup.subtree_control").read_text() == "+cpu\n"
