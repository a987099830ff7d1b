"""Bad input gets a one-line error naming the problem, before any process is spawned."""

from __future__ import annotations

import pytest

from hetsync.cli import main


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--protocol", "gossip"], "unknown protocol 'gossip'"),
        (["--workload", "imagenet"], "unknown workload 'imagenet'"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--slowdown", "often"], "bad --slowdown 'often'"),
        (["--workers", "4", "--slowdown", "deterministic:ranks=7,factor=2"], "rank 7"),
        (["--config", "/no/such.toml"], "--config file /no/such.toml not found"),
        (["--max-time", "-5"], "--max-time must not be negative"),
        (["--step-time", "-1"], "--step-time must not be negative"),
        (["--max-iterations", "0"], "--max-iterations must be >= 1"),
        (["--data-dir", "/no/such/dir"], "--data-dir /no/such/dir is not a directory"),
        (["--backend", "mpi"], "--backend must be auto or gloo or nccl"),
    ],
)
def test_bad_train_options(args, fragment, capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1, err
    assert not out.exists()  # nothing was started


def test_unparsable_number_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--workers", "many"])
    assert exit_info.value.code == 2
    assert "--workers: invalid int value: 'many'" in capsys.readouterr().err


def test_config_file_supplies_options_and_flags_win(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('protocol = "gossip"\nworkers = 3\n')
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown protocol 'gossip'" in capsys.readouterr().err
    config.write_text('workers = 3\nslowdown = "deterministic:ranks=5,factor=2"\n')
    assert main(["train", "--config", str(config), "--workers", "8", "--max-time", "-1"]) == 2
    assert "--max-time must not be negative" in capsys.readouterr().err


def test_unknown_key_in_config_file(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text("wrokers = 3\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown option 'wrokers'" in capsys.readouterr().err


def test_launch_needs_an_existing_script(capsys):
    assert main(["launch", "--workers", "2", "/no/script.py"]) == 2
    assert "script '/no/script.py' not found" in capsys.readouterr().err


def test_report_of_a_missing_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "p")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_listings(capsys):
    assert main(["protocols"]) == 0
    assert "allreduce" in capsys.readouterr().out
    assert main(["workloads"]) == 0
    assert "Fashion-MNIST" in capsys.readouterr().out
