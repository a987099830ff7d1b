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


@pytest.mark.parametrize(
    ("edges", "args", "fragment"),
    [
        ("0 1\n1 0\n2 3\n3 2\n", [], "cannot be reached"),
        ("0 1\n1 1\n1 2\n2 3\n3 0\n", [], "self loop on rank 1"),
        ("0 1\n1 9\n", [], "rank 9 is outside 0..3"),
        ("0 1\n1 2\n2 3\n3 0\n", ["--weights", "metropolis"], "undirected"),
    ],
)
def test_bad_graphs_are_refused_before_spawning(edges, args, fragment, tmp_path, capsys):
    graph = tmp_path / "graph.txt"
    graph.write_text(edges)
    out = tmp_path / "run"
    code = main(["train", "--protocol", "dpsgd", "--workers", "4", "--topology",
                 f"edges:{graph}", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err
    assert not out.exists()


def test_dpsgd_refuses_weights_that_are_not_doubly_stochastic(tmp_path, capsys):
    star = tmp_path / "star.txt"
    star.write_text("0 1\n1 0\n0 2\n2 0\n0 3\n3 0\n")
    assert main(["train", "--protocol", "dpsgd", "--workers", "4",
                 "--topology", f"edges:{star}"]) == 2
    assert "doubly stochastic" in capsys.readouterr().err


def test_adpsgd_needs_a_bipartite_graph(capsys):
    assert main(["train", "--protocol", "adpsgd", "--workers", "3"]) == 2
    assert "adpsgd needs a bipartite graph" in capsys.readouterr().err
