"""`hetsync bench` refuses bad input in one line, before any run starts."""

from __future__ import annotations

import pytest

from hetsync.cli import main


@pytest.mark.parametrize(("args", "fragment"), [
    (["--repeats", "0"], "--repeats must be >= 1 (got 0)"),
    (["--workload", "imagenet"], "unknown workload 'imagenet'"),
    (["--resume"], "holds no suite run (suite.json missing)"),
    (["--step-time", "-5"], "no run of the suite can start: --step-time must not be negative"),
])
def test_bad_bench_options(args, fragment, tmp_path, capsys):
    out = tmp_path / "suite"
    assert main(["bench", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1, err
    assert not (out / "runs").exists()


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
                     "real", "real-small"]
