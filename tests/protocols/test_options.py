"""A protocol's options are its own: declared field by field (`option_field.option`), held by
the run's config for the chosen protocol only, and never ambiguous on the command line."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from hetsync.config import RunConfig, load_toml, option_fields
from hetsync.errors import ConfigError
from hetsync.protocols.catalog import OPTIONS_OF, option_clashes, option_owners
from hetsync.protocols.hop.options import Options as HopOptions
from hetsync.protocols.option_field import check_values, option, spec_of
from hetsync.protocols.prague.options import Options as PragueOptions

RUN_OPTIONS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "protocol_options"]


@pytest.mark.parametrize("protocol", sorted(OPTIONS_OF))
def test_every_option_is_declared_with_its_help(protocol):
    for f in dataclasses.fields(OPTIONS_OF[protocol]):
        spec = spec_of(f)
        assert spec is not None and spec.help, (
            f"{protocol}'s option {f.name}: declare it with option(default, help=...)")
        assert not spec.choices or f.default in spec.choices, f.name


def test_no_option_clashes_with_another_or_a_run_option():
    assert option_clashes(RUN_OPTIONS) == []
    assert {"max_gap", "group_size", "ps_mode", "adpsgd_mode"} <= set(option_owners())


def test_a_clash_is_found():
    @dataclass
    class Mine:
        backup: int = option(1, help="mine: something else than Hop's")
        seed: int = option(0, help="a run option's name")

    clashes = option_clashes(RUN_OPTIONS, {"hop": HopOptions, "mine": Mine})
    assert len(clashes) == 2 and "hop and mine both declare option backup" in clashes[0]
    assert "mine's option seed" in clashes[1]


def test_values_are_checked_by_their_declaration():
    with pytest.raises(ConfigError, match="--backup must not be negative"):
        check_values(HopOptions(backup=-1))
    with pytest.raises(ConfigError, match="--max-gap must be >= 1"):
        check_values(HopOptions(max_gap=0))
    with pytest.raises(ConfigError, match="--hop-mode must be queues or notify-ack"):
        check_values(HopOptions(hop_mode="fast"))
    with pytest.raises(ConfigError, match="--ready-wait must be a finite number"):
        check_values(PragueOptions(ready_wait=float("inf")))


def test_the_config_holds_the_chosen_protocols_options_only():
    config = RunConfig(protocol="hop", max_gap=4)
    assert config.protocol_options == HopOptions(max_gap=4) and config.max_gap == 4
    assert RunConfig().protocol_options is None
    # Read, another protocol's option is its default: a script may run another protocol than
    # the run's (SyncOptimizer(..., protocol="prague")); it is never stored or set.
    assert config.group_size == PragueOptions().group_size
    assert config.protocol_options == HopOptions(max_gap=4)
    with pytest.raises(AttributeError):
        config.no_such_option  # noqa: B018
    with pytest.raises(ConfigError, match=r"^--group-size applies to --protocol prague \(this "
                       r"run's protocol is hop\)$"):
        RunConfig(protocol="hop", group_size=2)
    assert dataclasses.replace(config, backup=1).backup == 1 and config.backup is None  # unset


def test_the_flags_are_every_protocols_options_once():
    names = [f.name for f in option_fields()]
    assert len(names) == len(set(names))
    assert set(names) == set(RUN_OPTIONS) | set(option_owners())


def _toml(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_toml(path)


def test_a_protocols_table_or_flat_keys(tmp_path):
    table = RunConfig.from_dict(_toml(tmp_path, 'protocol = "hop"\n[hop]\nmax_gap = 4\n'))
    flat = RunConfig.from_dict(_toml(tmp_path, 'protocol = "hop"\nmax-gap = 4\n'))
    assert table == flat == RunConfig(protocol="hop", max_gap=4)
    both = {"protocol": "hop", "hop": {"max_gap": 4}, "max_gap": 6}  # a flag over a file
    assert RunConfig.from_dict(both).max_gap == 6


@pytest.mark.parametrize(("text", "match"), [
    ('protocol = "prague"\n[hop]\nmax_gap = 4\n', r"run.toml: \[hop\] sets hop's options, but "
     "the protocol is prague"),
    ('protocol = "hop"\n[hop]\nmax_gaps = 4\n', r"run.toml: unknown option 'max_gaps' in \[hop\]"),
    ('protocol = "hop"\n[hop]\nmax_gap = "4"\n', "run.toml: max_gap must be an integer"),
    ("max_gap = 4\n", r"run.toml: --max-gap applies to --protocol hop \(this run's protocol "
     r"is allreduce\)"),
    ('protocol = "hop"\nhop = 4\n', "run.toml: hop must be a table of hop's options"),
])
def test_a_wrong_table_is_one_line(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as error:
        RunConfig.from_dict(_toml(tmp_path, text), source="run.toml")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("protocol", ["hop", "prague", "allreduce"])
def test_config_json_round_trips(tmp_path, protocol):
    config = RunConfig(protocol=protocol, workers=3, out=tmp_path).resolved()
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    assert RunConfig.read(path) == config
    recorded = json.loads(path.read_text())
    assert (protocol in recorded) == (protocol in OPTIONS_OF)


def test_hetsync_config_tables_override_inits_keywords(tmp_path, monkeypatch):
    from hetsync.session import ENV_CONFIG, _read_config

    path = tmp_path / "run.toml"
    path.write_text("[hop]\nmax_gap = 4\n")
    monkeypatch.setenv(ENV_CONFIG, str(path))
    config = _read_config({"protocol": "hop", "max_gap": 2, "backup": 1}, None)
    assert (config.max_gap, config.backup) == (4, 1)
