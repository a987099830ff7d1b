"""End-to-end tests of hetsync.report on small synthetic run directories."""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from hetsync.cli import main
from hetsync.report import load_run, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(
    root: Path,
    label: str,
    *,
    time_to_target: float | None,
    samples_per_s: float,
    step_s: float = 0.2,
    with_eval: bool = True,
    workers: int = 4,
    rows: int = 50,
) -> Path:
    """Write a well-formed run directory; rank 3 is a straggler at a third of the speed."""
    run = root / label
    (run / "workers").mkdir(parents=True)
    iterations = []
    for rank in range(workers):
        step = step_s * (3 if rank == workers - 1 else 1)
        lines = [
            json.dumps({"t": round(i * step, 3), "iteration": i, "loss": 2.0 / i,
                        "compute_s": step, "injected_delay_s": 0.0, "sync_wait_s": 0.01,
                        "bytes_sent": 1024})
            for i in range(1, rows + 1)
        ]
        (run / "workers" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
        iterations.append(rows)
    # A worker killed mid-write leaves a truncated last line.
    with (run / "workers" / "rank0.jsonl").open("a") as f:
        f.write('{"t": 99.0, "itera')
    if with_eval:
        slower = 1.0 if time_to_target is not None else 1.6  # consistent with time_to_target
        evals = [
            {"t": float(t), "model": model, "loss": 2.0 * slower / (t + 1),
             "accuracy": t / 20 / slower,
             "iterations": iterations}
            for t in range(0, 12, 2)
            for model in ("consensus", "rank0")
        ]
        evals.append({"t": 12.0, "model": "final", "loss": 0.2, "accuracy": 0.6,
                      "iterations": iterations})
        (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (run / "config.json").write_text(json.dumps({"label": label}))
    summary = {
        "protocol": "allreduce", "workload": "mnist-mlp", "workers": workers, "label": label,
        "slowdown": "rank3:3x", "step_time_ms": 200, "batch_size": 32, "lr": 0.1, "seed": 0,
        "wall_time_s": rows * step_s * 3, "iterations": iterations,
        "samples_per_s": samples_per_s, "time_to_target_s": time_to_target,
        "target_loss": 0.25, "final_loss": 0.2, "final_accuracy": 0.6,
        "sync_wait_fraction": 0.125, "stop_reason": "max_iterations",
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    return [
        make_run(tmp_path, "sync allreduce", time_to_target=8.0, samples_per_s=100.0),
        make_run(tmp_path, "gossip", time_to_target=None, samples_per_s=250.0, step_s=0.1),
    ]


def table_row(report: str, label: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_load_run_reads_all_files(two_runs: list[Path]) -> None:
    run = load_run(two_runs[0])
    assert run.label == "sync allreduce"
    assert run.summary["time_to_target_s"] == 8.0
    assert sorted(run.worker_rows) == [0, 1, 2, 3]
    assert all(len(rows) == 50 for rows in run.worker_rows.values())  # truncated line skipped
    assert len(run.eval_rows) == 13


def test_label_defaults_to_protocol(two_runs: list[Path]) -> None:
    summary_file = two_runs[0] / "summary.json"
    summary = json.loads(summary_file.read_text())
    del summary["label"]
    summary_file.write_text(json.dumps(summary))
    assert load_run(two_runs[0]).label == "allreduce"


def test_write_report_creates_markdown_and_pngs(two_runs: list[Path], tmp_path: Path) -> None:
    report = write_report(two_runs, tmp_path / "out")
    assert report == tmp_path / "out" / "report.md"
    text = report.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    expected = {"loss_vs_time.png", "accuracy_vs_time.png", "iterations_vs_time.png",
                "iterations_per_worker_sync_allreduce.png", "iterations_per_worker_gossip.png"}
    assert set(images) == expected
    for name in expected:
        data = (report.parent / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_table_compares_runs(two_runs: list[Path], tmp_path: Path) -> None:
    text = write_report(two_runs, tmp_path / "out").read_text()
    header = table_row(text, "run")
    assert "speedup vs sync allreduce" in header
    assert "throughput vs sync allreduce" in header
    base = dict(zip(header, table_row(text, "sync allreduce"), strict=True))
    other = dict(zip(header, table_row(text, "gossip"), strict=True))
    assert base["time to target (s)"] == "8.0"
    assert other["time to target (s)"] == "not reached"
    assert base["speedup vs sync allreduce"] == "1.00x"
    assert other["speedup vs sync allreduce"] == "-"
    assert other["throughput vs sync allreduce"] == "2.50x"
    assert base["final accuracy"] == "60.0%"
    assert base["iterations (min / median / max)"] == "50 / 50 / 50"


def test_speedup_ratio(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "base", time_to_target=9.0, samples_per_s=100.0),
            make_run(tmp_path, "fast", time_to_target=3.0, samples_per_s=150.0)]
    text = write_report(runs, tmp_path / "out").read_text()
    header = table_row(text, "run")
    fast = dict(zip(header, table_row(text, "fast"), strict=True))
    assert fast["speedup vs base"] == "3.00x"
    assert fast["throughput vs base"] == "1.50x"


def test_run_without_eval_still_reports(tmp_path: Path) -> None:
    run = make_run(tmp_path, "no-eval", time_to_target=None, samples_per_s=10.0,
                   with_eval=False)
    assert load_run(run).eval_rows == []
    report = write_report([run], tmp_path / "out")
    assert "| no-eval |" in report.read_text()
    assert not (report.parent / "loss_vs_time.png").exists()
    assert (report.parent / "iterations_vs_time.png").read_bytes().startswith(PNG_MAGIC)


def test_missing_run_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_run(missing)
    missing.mkdir()
    with pytest.raises(FileNotFoundError, match="summary.json"):
        load_run(missing)


def test_no_run_dirs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no run directories given"):
        write_report([], tmp_path / "out")


# `hetsync report` refuses a damaged run or an unwritable --out in one line (exit status 2),
# never a traceback, and leaves the user's files as they were.

BINARY = bytes(range(128, 256)) * 4


def _summary(run: Path, **changes: object) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, **changes}))


def _row_of_rank1(run: Path) -> None:
    with (run / "workers" / "rank1.jsonl").open("a") as f:
        f.write(json.dumps({"t": "x", "iteration": 51}) + "\n")


DAMAGE: list[tuple[str, Callable[[Path], object], str]] = [
    ("binary eval.jsonl", lambda run: (run / "eval.jsonl").write_bytes(BINARY),
     "eval.jsonl is not a text file (not UTF-8)"),
    ("binary worker rows", lambda run: (run / "workers" / "rank0.jsonl").write_bytes(BINARY),
     "rank0.jsonl is not a text file (not UTF-8)"),
    ("empty summary", lambda run: (run / "summary.json").write_text("{}"),
     "summary.json is not a run summary (no protocol)"),
    ("a string for a number", lambda run: _summary(run, wall_time_s="fast"),
     "summary.json: wall_time_s must be a number or null (got 'fast')"),
    ("a string in iterations", lambda run: _summary(run, iterations=[50, "x"]),
     "summary.json: iterations must be a list of numbers or null"),
    ("a number for the label", lambda run: _summary(run, label=3),
     "summary.json: label must be a string (got 3)"),
    ("a row's time a string", _row_of_rank1,
     "rank1.jsonl, row 51: t must be a number (got 'x')"),
]


@pytest.mark.parametrize(("damage", "fragment"), [(d, f) for _, d, f in DAMAGE],
                         ids=[name for name, _, _ in DAMAGE])
def test_a_damaged_run_is_one_line(damage, fragment, tmp_path, capsys):
    run = make_run(tmp_path, "run", time_to_target=8.0, samples_per_s=100.0)
    damage(run)
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsync: error: ") and fragment in err, err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "report").exists()  # refused before writing anything


def test_an_out_that_is_a_file_is_one_line_and_kept(tmp_path, capsys):
    run = make_run(tmp_path, "run", time_to_target=8.0, samples_per_s=100.0)
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    assert main(["report", str(run), "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"hetsync: error: --out {afile} is a file, not a folder\n"
    assert afile.read_text() == "mine\n"
    # An --out that cannot be made (root ignores chmod: under a file, as on a read-only disk).
    assert main(["report", str(run), "--out", str(afile / "sub")]) == 2
    assert capsys.readouterr().err == (f"hetsync: error: --out {afile / 'sub'} cannot be "
                                       "written: Not a directory\n")


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    def full(self: Figure, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    run = make_run(tmp_path, "run", time_to_target=8.0, samples_per_s=100.0)
    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"hetsync: error: --out {out} cannot be written: "
                                       "No space left on device\n")
