"""`hetsync bench` refuses bad input in one line, before any run starts."""

from __future__ import annotations

import pytest

from hetsync.bench import runner
from hetsync.cli import main


@pytest.fixture
def no_run(monkeypatch):
    """A run that starts fails the test at once (a refused option must start none)."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr(runner, "launch", started)
    monkeypatch.setattr(runner, "simulate", started)


@pytest.mark.parametrize(("args", "fragment"), [
    (["--repeats", "0"], "--repeats must be >= 1 (got 0)"),
    (["--workload", "imagenet"], "unknown workload 'imagenet'"),
    (["--resume"], "holds no suite run (suite.json missing)"),
    (["--step-time", "-5"], "no run of the suite can start: --step-time must not be negative"),
    (["--variants", ""], "--variants names no variant (suite headline's: "),
    (["--variants", " , "], "--variants names no variant"),
    (["--max-time", "0"], "no run of the suite can start: --max-time must be > 0 seconds"),
    (["--max-time", "-1"], "no run of the suite can start: --max-time must not be negative"),
])
def test_bad_bench_options(args, fragment, tmp_path, capsys, no_run):
    out = tmp_path / "suite"
    assert main(["bench", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1, err
    assert not (out / "runs").exists()


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, capsys, no_run):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    args = ["bench", "--suite", "smoke", "--workload", "digits", "--out"]
    assert main([*args, str(afile)]) == 2
    assert capsys.readouterr().err == f"hetsync: error: --out {afile} is a file, not a folder\n"
    assert afile.read_text() == "mine\n"
    # Root ignores chmod: a path under a file stands for a read-only one (Not a directory).
    assert main([*args, str(afile / "b")]) == 2
    assert capsys.readouterr().err == (f"hetsync: error: --out {afile / 'b'} cannot be "
                                       "written: Not a directory\n")


@pytest.mark.parametrize("record", ['{"suite": "smo', '{"suite": "smoke", "bogus": 1}', "[]"])
def test_resuming_a_damaged_suite_record_is_one_line(record, tmp_path, capsys, no_run):
    (tmp_path / "suite.json").write_text(record)
    assert main(["bench", "--resume", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'suite.json'} is not a suite's record (" in err
    assert err.count("\n") == 1, err
    assert (tmp_path / "suite.json").read_text() == record


def test_unknown_suite_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--suite", "fast"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_list_names_every_suite(capsys):
    assert main(["bench", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["headline", "smoke", "homogeneous", "deterministic", "random", "scaling",
                     "everything", "regimes", "regimes-small", "paper", "scaling-sim", "gpu",
                     "real", "real-small", "epochs", "epochs-lm"]
