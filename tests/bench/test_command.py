"""`hetsync bench` end to end on real processes: the smoke suite, its report, --resume."""

from __future__ import annotations

import json
import shutil

import pytest

from hetsync.cli import main

# Behind `slow`: the smoke suite (8 real runs, about 100 s) put the clean-clone CI at 26 minutes.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMOKE = ["bench", "--suite", "smoke", "--workload", "svm", "--max-time", "3"]


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke"
    assert main([*SMOKE, "--out", str(out)]) == 0
    return out


def test_results_json_has_every_figure_per_protocol_and_setting(suite_dir):
    results = json.loads((suite_dir / "results.json").read_text())
    assert results["runs_done"] == results["runs_total"] == 8
    assert [s["name"] for s in results["settings"]] == ["homogeneous", "one 5x slow"]
    assert [s["step_time"] for s in results["settings"]] == [50.0, 50.0]  # what the runs used
    for setting in results["settings"]:
        assert [row["label"] for row in setting["results"]] == ["allreduce", "ddp", "hop-skip",
                                                                 "localsgd"]
        for row in setting["results"]:
            assert row["samples_per_s"] > 0
            assert 0 < row["ideal_fraction"] <= 1.05
            assert 0 <= row["sync_wait_fraction"] < 1
            assert 0.5 < row["final_accuracy"] <= 1
            assert row["throughput_vs_allreduce"] is not None
            assert row["time_to_target_s"] is not None or row["time_to_target_above_s"]
    slow = {row["label"]: row for row in results["settings"][1]["results"]}
    # Hop with skipping leaves the 5x slow worker behind; All-Reduce waits for it.
    assert slow["hop-skip"]["throughput_vs_allreduce"] > 2
    assert results["headline"][1]["winner"] == "hop-skip"


def test_results_md_has_tables_and_plots(suite_dir):
    text = (suite_dir / "results.md").read_text()
    assert text.count("| protocol | time to target (s) | speed-up vs allreduce |") == 2
    assert "--suite smoke --workload svm --max-time 3" in text
    assert text.count("workers, 50 ms emulated compute per iteration, slowdown") == 2
    images = [line.split("](")[1].rstrip(")") for line in text.splitlines()
              if line.startswith("![")]
    assert "plots/speedup_vs_allreduce.png" in images
    assert "plots/one_5x_slow/loss_vs_time.png" in images
    assert "plots/one_5x_slow/consensus_distance_vs_time.png" in images
    assert all((suite_dir / image).is_file() for image in images)
    assert (suite_dir / "plots/one_5x_slow/iterations_per_worker_hop-skip.png").is_file()


def test_a_second_start_in_the_same_folder_is_refused(suite_dir, capsys):
    assert main([*SMOKE, "--out", str(suite_dir)]) == 2
    assert "already holds a suite run: pass --resume" in capsys.readouterr().err


def test_resume_with_other_options_is_refused(suite_dir, capsys):
    assert main([*SMOKE, "--max-time", "6", "--out", str(suite_dir), "--resume"]) == 2
    assert "was run with different options (max_time=3.0)" in capsys.readouterr().err


def test_resume_redoes_only_the_unfinished_run(suite_dir, capsys):
    runs = sorted(suite_dir.glob("runs/*/*/r0"))
    assert len(runs) == 8
    interrupted = runs[2]
    (interrupted / "summary.json").unlink()  # as if the suite was stopped during this run
    before = {run: (run / "summary.json").stat().st_mtime_ns for run in runs if run != interrupted}
    capsys.readouterr()
    # The options come from suite.json: --out and --resume are enough.
    assert main(["bench", "--out", str(suite_dir), "--resume"]) == 0
    output = capsys.readouterr().out
    assert "resuming: 7 of 8 runs already done" in output
    assert output.count("] ") == 1  # one run started
    assert (interrupted / "summary.json").is_file()
    assert before == {run: (run / "summary.json").stat().st_mtime_ns for run in before}


def test_an_interrupted_suite_writes_the_results_of_its_finished_runs(suite_dir, tmp_path,
                                                                      monkeypatch, capsys):
    """Ctrl-C, SIGTERM or a lease's time limit during a run: the finished runs' tables are
    written before the bench stops (a lent GPU machine's output is what it wrote)."""
    out = tmp_path / "copy"
    shutil.copytree(suite_dir, out)
    for name in ("results.json", "results.md"):
        (out / name).unlink()
    (sorted(out.glob("runs/*/*/r0"))[2] / "summary.json").unlink()

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr("hetsync.bench.runner.launch", interrupted)
    assert main(["bench", "--out", str(out), "--resume"]) == 130
    results = json.loads((out / "results.json").read_text())
    assert (results["runs_done"], results["runs_total"]) == (7, 8)
    assert "finished runs are kept" in capsys.readouterr().err
