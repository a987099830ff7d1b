"""The regime suites: their runs carry the emulated network and payload, and the regime map
names a winner per cell."""

from __future__ import annotations

from hetsync.bench.markdown import paper_lines, regime_lines
from hetsync.bench.regime_map import regime_cells
from hetsync.bench.runner import BenchOptions, plan
from hetsync.bench.suites import PAPER, REGIMES, REGIMES_SMALL


def test_regime_runs_carry_network_and_payload(tmp_path):
    runs = plan(REGIMES_SMALL, BenchOptions(suite="regimes-small", workload="svm"), tmp_path)
    assert {r.config.payload for r in runs} == {"none", "100MB"}
    assert {r.config.network for r in runs} == {"bandwidth=10Gbit,latency=50us"}
    assert not any(r.not_applicable for r in runs)
    assert {r.variant.label for r in runs} >= {"prague", "prague-paper", "ps-backup1"}


def test_the_full_regime_suite_covers_the_grid():
    assert len(REGIMES.settings) == 4 * 2 * 3 * 2
    assert {s.workers for s in PAPER.settings} == {16}


def _row(label, ttt, throughput):
    return {"label": label, "repeats_done": 1, "time_to_target_s": ttt,
            "samples_per_s": throughput, "time_to_target_above_s": None if ttt else 15.0,
            "speedup_vs_allreduce": None, "speedup_vs_ddp": None,
            "throughput_vs_allreduce": None, "throughput_vs_ddp": None}


def _results(suite: str, settings: list[tuple[str, tuple[str, ...], list[dict]]]) -> dict:
    from hetsync.bench.results import speedup

    out = []
    for name, regime, rows in settings:
        base = next(r for r in rows if r["label"] == "allreduce")
        for row in rows:
            row["speedup_vs_allreduce"] = speedup(base, row)
            row["throughput_vs_allreduce"] = row["samples_per_s"] / base["samples_per_s"]
        out.append({"name": name, "regime": list(regime), "results": rows})
    return {"suite": suite, "settings": out}


def test_regime_map_names_the_winner_and_its_speedup(tmp_path):
    results = _results("regimes-small", [
        ("a", ("none", "10Gbit", "homogeneous", "8w"),
         [_row("allreduce", 10.0, 100.0), _row("prague", 8.0, 120.0)]),
        ("b", ("100MB", "10Gbit", "homogeneous", "8w"),
         [_row("allreduce", None, 20.0), _row("adpsgd", None, 50.0)]),
    ])
    cells = regime_cells(results)[("homogeneous", "8w")]
    assert [(c["winner"], c["text"]) for c in cells] == [("prague", "1.25x"),
                                                          ("adpsgd", "2.50x thr.")]
    (tmp_path / "plots").mkdir()
    text = "\n".join(regime_lines(results, tmp_path))
    assert "| 10Gbit | prague 1.25x | adpsgd 2.50x thr. |" in text
    assert (tmp_path / "plots" / "regime_map.png").is_file()


def test_paper_ratios_sit_beside_the_measured_ones():
    results = _results("paper", [
        ("paper · homogeneous", (), [_row("allreduce", 12.0, 100.0), _row("prague", 10.0, 110.0),
                                     _row("prague-paper", 15.0, 90.0), _row("adpsgd", 20.0, 80.0),
                                     _row("ps-sync", 30.0, 50.0)]),
    ])
    text = "\n".join(paper_lines(results))
    # The paper's own loop first, then the overlapped default; a variant not run is "-".
    assert ("| paper · homogeneous | allreduce | 1.2x | 0.80x (throughput 0.90x) | 1.20x "
            "(throughput 1.10x) | - (throughput -) |") in text
    assert "| paper · homogeneous | ps-sync | 5.3x | 2.00x (throughput 1.80x) | 3.00x" in text


def test_the_paper_suite_runs_the_papers_prague_beside_the_overlapped_default(tmp_path):
    """`prague-paper` ran with --overlap, D-PSGD's update, while the reports called it the
    paper's: it is the paper's loop now, and every overlapped variant says what it is."""
    from hetsync.bench.markdown import legend_lines
    from hetsync.bench.suites import EVERY_PROTOCOL

    runs = plan(PAPER, BenchOptions(suite="paper", workload="svm"), tmp_path)
    paper = {r.variant.label: r.config for r in runs}
    assert {"prague-paper", "prague", "prague-paper-overlap"} <= set(paper)
    loop = paper["prague-paper"]
    assert (loop.gg_policy, loop.group_buffer, loop.overlap) == ("random", True, False)
    assert paper["prague"].overlap and paper["prague-paper-overlap"].overlap
    for variant in EVERY_PROTOCOL:
        if variant.options["protocol"] == "prague" and variant.options.get("overlap", True):
            assert "overlapped" in variant.about and "combine-then-adapt" in variant.about
    legend = "\n".join(legend_lines(runs))
    assert "- `prague-paper`: the Prague paper's loop" in legend
    assert "- `prague`: Prague with ready groups, overlapped: D-PSGD's" in legend
