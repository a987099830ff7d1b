"""Hop's defaults: the options left unset are resolved from the run's graph to settings that
tolerate a straggler, the same way for the simulator and a real run; the paper's stay reachable
by flags."""

import pytest

from hetsync import cli
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.protocols.hop.core import HopConfig
from hetsync.protocols.hop.options import STALE_SKIP
from hetsync.simulator.run import SimOptions, build, run_events
from hetsync.topology import build as build_topology

_BACKUP_SKIP = HopConfig(backup=1, skip=True)
_STALE_SKIP = HopConfig(**STALE_SKIP)
_PAPER = HopConfig()


def _config(*flags: str) -> HopConfig:
    """The core's configuration that `hetsync train --protocol hop FLAGS` runs."""
    config = cli.config_from_args(cli.build_parser().parse_args(
        ["train", "--protocol", "hop", *flags])).validate()
    return config.hop_config(build_topology(config.topology, config.workers, config.weights))


@pytest.mark.parametrize(("flags", "expected"), [
    (["--workers", "8"], _BACKUP_SKIP),
    (["--workers", "3"], _BACKUP_SKIP),
    (["--workers", "8", "--topology", "complete"], _BACKUP_SKIP),
    # A ring of 2 or a directed ring: one in-neighbour each, so no backup worker.
    (["--workers", "2"], _STALE_SKIP),
    (["--workers", "8", "--topology", "directed-ring"], _STALE_SKIP),
    (["--workers", "1"], _PAPER),
    # The paper's Hop, by flags; a backup worker given, the rest stays as it was.
    (["--workers", "8", "--backup", "0", "--no-skip"], _PAPER),
    (["--workers", "8", "--backup", "0"], _PAPER),
    (["--workers", "2", "--backup", "0", "--staleness", "0", "--no-skip"], _PAPER),
    (["--workers", "8", "--topology", "directed-ring", "--backup", "0", "--staleness", "0",
      "--no-skip"], _PAPER),
    (["--workers", "8", "--backup", "1", "--no-skip"], HopConfig(backup=1)),
    (["--workers", "2", "--staleness", "2", "--no-average-once"],
     HopConfig(staleness=2, skip=True, send_ahead=1)),
    (["--workers", "8", "--hop-mode", "notify-ack"], HopConfig(mode="notify-ack")),
])
def test_unset_options_resolve_from_the_graph(flags, expected):
    assert _config(*flags) == expected


def test_a_default_that_cannot_hold_is_named_as_one():
    with pytest.raises(ConfigError, match=r"^--max-gap must be > --staleness 12 \(its default on "
                       r"this graph\) \(got 4\)"):
        RunConfig(protocol="hop", workers=2, max_gap=4).validate()
    with pytest.raises(ConfigError, match=r"^--backup must be < the in-degree 1 of rank 0"):
        RunConfig(protocol="hop", workers=2, backup=1).validate()


@pytest.mark.parametrize("workers", [2, 8])
def test_the_defaults_keep_pace_beside_a_slow_worker(workers):
    """Simulated, one worker 5x slow: Hop with no options runs well ahead of its paper
    settings, which wait for the slow one every iteration (at its pace: 1/5 of the others')."""
    def iterations(**options: object) -> int:
        config = RunConfig(protocol="hop", workload="svm", workers=workers, step_time=50.0,
                           slowdown="deterministic:ranks=0,factor=5", max_time=5.0, quiet=True,
                           **options).validate().resolved()
        sim = build(config, SimOptions(progress=False))
        run_events(sim, [], progress=False)
        return sum(len(worker.rows) for worker in sim.workers)

    assert iterations() > 2 * iterations(backup=0, staleness=0, skip=False)
