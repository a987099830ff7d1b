"""Bad input gets one line that names the problem, before any process starts (issue 14's
table of inputs; each row here is one of them)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from hetsync.config import RunConfig, default_out, load_toml
from hetsync.errors import ConfigError
from hetsync.launch.launcher import check_capacity
from hetsync.session import _read_config

BINARY = bytes(range(128, 256)) * 4


def _refused(config: RunConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as error:
        config.validate()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("options", "match"), [
    ({"lr": math.nan}, "--lr must be a finite number"),
    ({"target_loss": math.nan}, "--target-loss must be a finite number"),
    ({"step_time": math.inf}, "--step-time must be a finite number"),
    ({"momentum": 5.0}, r"--momentum must be in \[0, 1\)"),
    ({"protocol": "prague", "schedule": "static", "workers_per_node": 3, "workers": 4},
     "--workers-per-node 3 does not divide --workers 4"),
    ({"step_time": 1e12}, "--step-time 1e[+]12 ms is longer than 30 days"),
    ({"max_time": 1e12}, "--max-time 1e[+]12 s is longer than 30 days"),
    ({"step_time": 5000.0, "max_time": 3.0}, "no step would end"),
    ({"hang_timeout": 0.0}, "^--hang-timeout must be > 0 seconds$"),
    ({"checkpoint_every": 0.0}, "^--checkpoint-every must be > 0 seconds$"),
    ({"protocol": "prague", "ready_wait": 1e15}, "--ready-wait must be at most 60000"),
    ({"protocol": "prague", "ready_wait": math.nan}, "--ready-wait must be a finite number"),
    ({"protocol": "prague", "group_division": 3, "workers": 2},
     "--group-division must be in 1..1"),
    ({"topology": "edges:/missing.txt"}, "--topology shapes the graph of .*allreduce has none"),
    ({"protocol": "prague", "weights": "metropolis"}, "--weights shapes the graph of"),
])
def test_meaningless_numbers_are_refused(options, match):
    _refused(RunConfig(workload="svm", **options), match)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("workers", "four", "workers must be an integer"),
    ("lr", "fast", "lr must be a number"),
    ("skip", 1, "skip must be true or false"),
    ("script", "train.py", "script must be a list of strings"),
])
def test_a_config_value_of_the_wrong_type_is_named(key, value, match):
    with pytest.raises(ConfigError, match=f"run.toml: {match}"):
        RunConfig.from_dict({"protocol": "hop", key: value}, source="run.toml")


def test_a_file_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path):
    """A FIFO would block the read forever and /dev/zero fill the memory: refused by kind."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "is not a regular file"), (Path("/dev/zero"), "is not a regular"),
                       (tmp_path, "is a directory, not a file")):
        _refused(RunConfig(workload="svm", protocol="dpsgd", topology=f"edges:{path}"), kind)
        _refused(RunConfig(workload="svm", slowdown=f"trace:{path}"), kind)
        _refused(RunConfig(script=[str(path)]), f"script {path} {kind}")
        with pytest.raises(ConfigError, match=kind):
            load_toml(path)
    _refused(RunConfig(workload="svm", slowdown="trace:"), "trace file: no file given")


def test_a_launched_file_that_python_cannot_run_is_refused_before_spawning(tmp_path):
    """A binary, a file of another language or a script with a syntax error: one line, not
    every worker spawned to fail with a SyntaxError."""
    binary, shell, broken = tmp_path / "model.pt", tmp_path / "train.sh", tmp_path / "train.py"
    binary.write_bytes(b"PK-not-a-zip\0" + BINARY)
    shell.write_text("#!/bin/sh\nfor i in 1 2; do echo $i; done\n")
    broken.write_text("def main(:\n    pass\n")
    _refused(RunConfig(script=[str(binary)]), f"script {binary} is not a Python script")
    _refused(RunConfig(script=[str(shell)]), f"script {shell} is not valid Python: .*[(]line 2[)]")
    _refused(RunConfig(script=[str(broken)]), f"script {broken} is not valid Python")
    fine = tmp_path / "fine.py"
    fine.write_text("# -*- coding: latin-1 -*-\nprint('caf\xe9')\n", encoding="latin-1")
    RunConfig(script=[str(fine)]).validate()


def test_a_gpu_index_says_how_to_pick_a_gpu():
    _refused(RunConfig(workload="svm", device="cuda:1"), "CUDA_VISIBLE_DEVICES=1")


def test_one_option_spelled_two_ways_in_a_config_file_is_refused():
    with pytest.raises(ConfigError, match="'max-time' and 'max_time' are one option"):
        RunConfig.from_dict({"max-time": 3, "max_time": 4}, source="run.toml")
    with pytest.raises(ConfigError, match="out is empty"):
        RunConfig.from_dict({"out": ""}, source="run.toml")


def test_a_label_names_one_directory_under_runs():
    for label in ("../../escape", "a/b", ".."):
        out = default_out(RunConfig(label=label))
        assert out.parent == Path("runs") and ".." not in out.parts


def test_binary_files_are_refused_in_one_line(tmp_path):
    binary = tmp_path / "binary"
    binary.write_bytes(BINARY)
    with pytest.raises(ConfigError, match="is not a text file"):
        load_toml(binary)
    _refused(RunConfig(workload="svm", protocol="dpsgd", topology=f"edges:{binary}"),
             "is not a text file")
    _refused(RunConfig(workload="svm", slowdown=f"trace:{binary}"), "is not a text file")


def test_more_workers_than_memory_holds_says_what_fits(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n")  # 20 GiB
    check_capacity(100, meminfo)
    with pytest.raises(ConfigError, match=r"--workers 1000: .* 20.0 GiB .* about 102 workers"):
        check_capacity(1000, meminfo)


@pytest.mark.parametrize(("options", "match"), [
    ({"protocol": "nosuch"}, "unknown protocol 'nosuch'"),
    ({"workers": -1}, r"workers must be >= 1 \(got -1\)"),
    ({"bogus_option": 3}, "unknown option 'bogus_option'"),
])
def test_init_with_a_bad_option_is_one_line(options, match):
    with pytest.raises(ConfigError, match=match):
        _read_config(options, None)


def test_report_of_a_truncated_summary_is_one_line(tmp_path):
    from hetsync.report.runs import load_run

    (tmp_path / "summary.json").write_text('{"protocol": "allreduce"')
    with pytest.raises(ConfigError, match="cannot be read .truncated or not JSON"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_bytes(BINARY)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_run(tmp_path)


@pytest.mark.parametrize("with_math", [False, True])
def test_simulating_more_workers_than_memory_holds_says_what_fits(tmp_path, with_math):
    """`hetsync simulate --workers 100000000` ran until killed (Prague's check alone built a
    Group Generator that size): refused at once, before the run directory exists."""
    from hetsync.simulator.run import SimOptions, simulate

    config = RunConfig(workload="svm", protocol="prague", workers=10**9, step_time=100.0,
                       max_time=1.0, out=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"--workers 1000000000: .* GiB of memory available, "
                                          r"enough for about \d+ simulated workers"):
        simulate(config, SimOptions(math=with_math, progress=False))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["abc", "0", ""])
def test_a_bad_thread_count_is_refused_before_the_workers_start(tmp_path, monkeypatch, value):
    from hetsync.launch.launcher import run

    monkeypatch.setenv("HETSYNC_THREADS", value)
    with pytest.raises(ConfigError, match="HETSYNC_THREADS must be a positive integer"):
        run(RunConfig(workload="svm", workers=2, max_time=3.0, out=tmp_path / "run"))
    assert not (tmp_path / "run").exists()
