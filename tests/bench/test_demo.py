"""`hetsync demo` checks its options before it touches --out, and removes only what an earlier
demo wrote there: a bench suite, a run or a user's files in --out are refused, never deleted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetsync import cli, demo
from hetsync.bench.runner import BenchOptions


@pytest.fixture
def benched(monkeypatch) -> list[Path]:
    """The folders the demo ran its bench into; the bench itself writes a suite.json only."""
    calls: list[Path] = []

    def bench(options: BenchOptions, out: Path) -> Path:
        calls.append(out)
        (out / "suite.json").write_text("{}\n")
        return out / "results.md"

    monkeypatch.setattr(demo, "bench", bench)
    monkeypatch.setattr(cli, "_default_workload", lambda: "digits")  # no Fashion-MNIST load
    return calls


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def _suite_with_notes(folder: Path) -> dict[str, str]:
    """A finished `hetsync bench` suite beside a user's notes."""
    run = folder / "runs" / "homogeneous" / "allreduce" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"protocol": "allreduce"}))
    (folder / "suite.json").write_text(json.dumps({"suite": "headline"}))
    (folder / "results.md").write_text("# results\n")
    (folder / "NOTES.txt").write_text("my notes\n")
    return _files(folder)


@pytest.mark.parametrize(("args", "fragment"), [
    (["--max-time", "-1"], "--max-time must not be negative (got -1.0)"),
    (["--max-time", "0"], "--max-time must be > 0 seconds"),
    (["--workers", "0"], "--workers must be >= 1 (got 0)"),
    ([], "holds files that no hetsync demo wrote: pass another --out, or remove it"),
])
def test_a_folder_that_is_not_a_demo_is_kept(args, fragment, tmp_path, capsys, benched):
    out = tmp_path / "suite"
    before = _suite_with_notes(out)
    assert cli.main(["demo", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsync: error: ") and fragment in err, err
    assert err.count("\n") == 1, err
    assert _files(out) == before
    assert benched == []


def test_a_run_folder_is_kept(tmp_path, capsys, benched):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"protocol": "hop"}))
    (out / "config.json").write_text("{}")
    assert cli.main(["demo", "--out", str(out)]) == 2
    assert "holds files that no hetsync demo wrote" in capsys.readouterr().err
    assert sorted(_files(out)) == ["config.json", "summary.json"]


def test_an_earlier_demo_is_replaced_but_not_the_users_files(tmp_path, benched):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out)]) == 0  # a fresh folder
    assert (out / demo.DEMO_MARK).is_file()
    (out / "runs" / "x").mkdir(parents=True)
    (out / "results.md").write_text("old\n")
    (out / "NOTES.txt").write_text("my notes\n")
    assert cli.main(["demo", "--out", str(out)]) == 0
    assert benched == [out, out]
    assert sorted(_files(out)) == [demo.DEMO_MARK, "NOTES.txt", "suite.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["demo", "--out", str(empty)]) == 0


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, capsys, benched):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    assert cli.main(["demo", "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"hetsync: error: --out {afile} is a file, not a folder\n"
    assert afile.read_text() == "mine\n"
    # Root ignores chmod: a path under a file stands for a read-only one (Not a directory).
    assert cli.main(["demo", "--out", str(afile / "demo")]) == 2
    assert capsys.readouterr().err == (f"hetsync: error: --out {afile / 'demo'} cannot be "
                                       "written: Not a directory\n")


def test_a_demo_written_before_the_mark_is_still_replaced(tmp_path, benched):
    """`make demo` again over a demo from before the mark: only a demo's files in it."""
    out = tmp_path / "demo"
    (out / "runs" / "x").mkdir(parents=True)
    for name in ("suite.json", "results.json", "results.md"):
        (out / name).write_text("{}\n")
    assert cli.main(["demo", "--out", str(out)]) == 0
    assert benched == [out]
    assert (out / demo.DEMO_MARK).is_file() and not (out / "runs" / "x").exists()
