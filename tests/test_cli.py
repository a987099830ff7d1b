"""Bad input gets a one-line error naming the problem, before any process is spawned; --help
shows every default; docs/configuration.md lists every option."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from hetsync import cli
from hetsync.cli import main
from hetsync.config import RunConfig, load_toml, option_fields
from hetsync.protocols.catalog import OPTIONS_OF, TOLERATE_LOSS, all_variants
from hetsync.protocols.option_field import spec_of
from hetsync.transport.placement import visible_gpus


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
        (["--device", "gpu"], "--device must be auto or cpu or cuda"),
    ],
)
def test_bad_train_options(args, fragment, capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1, err
    assert not out.exists()  # nothing was started


@pytest.mark.skipif(visible_gpus() > 0, reason="this machine has a CUDA device")
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--device", "cuda"], "--device cuda needs a CUDA device; none is visible"),
        (["--backend", "nccl"], "--backend nccl needs CUDA devices; none is visible here"),
    ],
)
def test_gpu_options_without_a_gpu_fail_in_one_line_before_spawning(args, line, capsys,
                                                                      tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--workload", "svm", "--workers", "2", "--out", str(out), *args]) == 2
    assert capsys.readouterr().err == f"hetsync: error: {line}\n"
    assert not out.exists()  # nothing was started


def test_nccl_with_models_on_the_cpu_is_refused_before_spawning(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--workload", "svm", "--out", str(out), "--backend", "nccl",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetsync: error: --backend nccl sends device memory") and \
        err.count("\n") == 1, err
    assert not out.exists()


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
    assert "script /no/script.py not found" in capsys.readouterr().err


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


def _option_help(command: str, capsys) -> dict[str, str]:
    """Each option of `hetsync COMMAND --help` (its first flag) and its whole help text."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    entries: dict[str, str] = {}
    current = None
    for line in text[text.index("options:"):].splitlines()[1:]:
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = line.strip()
        elif current is not None and line.startswith("    "):
            entries[current] += " " + line.strip()
    return entries


@pytest.mark.parametrize("command", ["train", "launch", "bench", "demo", "report"])
def test_help_shows_every_default(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    options = _option_help(command, capsys)
    assert options
    for flag, text in options.items():
        if flag == "-h" or (command == "report" and flag == "--out"):  # help; required
            continue
        assert "default:" in text, f"hetsync {command} --help: {flag} shows no default: {text}"
        assert "(default: None)" not in text, text


@pytest.mark.parametrize("command", ["train", "launch"])
def test_help_defaults_are_run_configs(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    options = _option_help(command, capsys)
    for f in option_fields():
        value = f.default
        if f.name not in ("workload", "script") and isinstance(value, int | float | str):
            flag = "--" + f.name.replace("_", "-")
            if value is True:
                flag = "--no-" + flag[2:]
            shown = ("on" if value else "off") if isinstance(value, bool) else value
            assert f"(default: {shown})" in options[flag], options[flag]
    assert "(default: 8, or" in options["--max-gap"] and "(default: 4)" in options["--workers"]


# docs/configuration.md: the TOML keys, generated from RunConfig so that the doc cannot drift.
CONFIG_DOC = Path(__file__).parents[1] / "docs" / "configuration.md"
TABLE_START = "<!-- keys: generated by tests/test_cli.py, HETSYNC_WRITE_DOCS=1 rewrites them -->"
TABLE_END = "<!-- end of keys -->"
_TOML_TYPES = {"str": "string", "int": "integer", "float": "float", "bool": "boolean",
               "Path": "string (path)", "list[str]": "array of strings"}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # numbers, strings and lists of strings: TOML reads JSON's form


def _key_rows(fields: list[dataclasses.Field[object]]) -> list[str]:
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields:
        declared = str(f.type)
        kind = _TOML_TYPES[declared.removesuffix(" | None")]
        if declared.endswith(" | None"):
            kind += ", optional"
        has_factory = f.default_factory is not dataclasses.MISSING
        default = f.default_factory() if has_factory else f.default
        shown = f"`{_toml_value(default)}`" if default is not None else "unset"
        spec = spec_of(f)
        if f.name in cli._DEFAULT_TEXT or (spec is not None and spec.default_text):
            shown += f": {cli.default_text(f)}"
        assert spec_of(f) is not None or f.name in cli._RUN_HELP, (
            f"RunConfig.{f.name}: add its meaning to cli._RUN_HELP")
        meaning = cli.meaning(f).replace("|", "\\|")
        rows.append(f"| `{f.name}` | {kind} | {shown} | {meaning} |")
    return rows


def config_table() -> str:
    """The tables of docs/configuration.md: every run option, then each protocol's, with
    type and default."""
    run = [f for f in dataclasses.fields(RunConfig) if f.name != "protocol_options"]
    rows = _key_rows(run)
    for protocol, options in OPTIONS_OF.items():
        rows += ["", f"Protocol `{protocol}`, in its table `[{protocol}]` (or flat, as above):",
                 "", *_key_rows(list(dataclasses.fields(options)))]
    return "\n".join(rows)


def test_configuration_doc_lists_every_key():
    doc = CONFIG_DOC.read_text()
    head, rest = doc.split(TABLE_START)
    table, tail = rest.split(TABLE_END)
    table = table.strip("\n")
    expected = config_table()
    if table != expected and os.environ.get("HETSYNC_WRITE_DOCS") == "1":
        CONFIG_DOC.write_text(f"{head}{TABLE_START}\n{expected}\n{TABLE_END}{tail}")
        return
    listed = {row.split("`")[1] for row in table.splitlines() if row.startswith("| `")}
    fields = {f.name for f in option_fields()}
    assert listed == fields, f"missing {sorted(fields - listed)}, stale {sorted(listed - fields)}"
    assert table == expected, "docs/configuration.md is stale: HETSYNC_WRITE_DOCS=1 " \
        "pytest tests/test_cli.py -k configuration_doc rewrites its table"


def test_configuration_doc_example_is_valid(tmp_path):
    example = CONFIG_DOC.read_text().split("```toml\n")[1].split("```")[0]
    path = tmp_path / "run.toml"
    path.write_text(example)
    config = RunConfig.from_dict(load_toml(path), source=str(path))
    assert config.validate() is config and config.protocol != RunConfig.protocol


@pytest.mark.parametrize("variant", all_variants(), ids=lambda variant: variant.label)
def test_train_flags_give_back_a_variants_options(variant):
    """The fault fuzz prints each case as `hetsync train` flags: they must run the variant."""
    args = cli.build_parser().parse_args(["train", *cli.train_flags(variant.run_options)])
    assert cli.config_from_args(args) == RunConfig(**variant.run_options)


def test_on_failure_help_names_the_protocols_that_tolerate_a_loss(capsys):
    text = " ".join(_option_help("train", capsys)["--on-failure"].split())
    assert TOLERATE_LOSS and all(f"{name}," in text for name in TOLERATE_LOSS)


@pytest.mark.parametrize("command", [["train", "--workload", "svm"], ["report", "runs/x"],
                                     ["bench"], ["demo"]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*command, "--out", ""])
    assert stop.value.code == 2
    assert "argument --out: is empty: give a path" in capsys.readouterr().err
