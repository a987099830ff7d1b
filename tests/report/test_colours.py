"""One colour per protocol family: what hetsync.report.colours returns, and that every
figure draws with it (figures drawn with the Agg backend, their lines' colours read back)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from hetsync.bench.plots import plot_speedups
from hetsync.report import load_run
from hetsync.report.colours import (
    FAMILY_COLOURS,
    OTHER_COLOUR,
    family,
    protocol_colour,
    protocol_styles,
    rank_shades,
)
from hetsync.report.plots import plot_iterations, plot_iterations_per_worker, plot_loss

PRAGUE = to_hex(FAMILY_COLOURS["prague"])


@pytest.mark.parametrize(("label", "protocol", "expected"), [
    ("prague", None, "prague"), ("prague-paper", None, "prague"), ("prague-lag", None, "prague"),
    ("prague dynamic", None, "prague"), ("hop-stale-skip", None, "hop"), ("ps-sync", None, "ps"),
    ("ps-backup1", None, "ps"), ("adpsgd", None, "adpsgd"), ("dpsgd", None, "dpsgd"),
    ("diloco", "localsgd", "diloco"), ("DDP", None, "ddp"),
    ("sync allreduce", "allreduce", "allreduce"), ("alone", None, None), ("raw send", None, None),
])
def test_family_is_the_labels_leading_name_else_the_protocol(
        label: str, protocol: str | None, expected: str | None) -> None:
    assert family(label, protocol) == expected


def test_every_family_has_its_own_colour_and_none_is_the_others() -> None:
    colours = [to_hex(c) for c in FAMILY_COLOURS.values()]
    assert set(FAMILY_COLOURS) == {"allreduce", "ddp", "ps", "dpsgd", "adpsgd", "hop",
                                   "prague", "localsgd", "diloco"}
    assert len(set(colours)) == len(colours)
    assert to_hex(OTHER_COLOUR) not in colours
    assert protocol_colour("alone") == to_hex(OTHER_COLOUR)


def test_variants_share_the_family_colour_and_differ_in_line_and_shade() -> None:
    styles = protocol_styles(["prague-paper", "allreduce", "prague", "prague-lag"])
    prague = [styles[label] for label in ("prague", "prague-lag", "prague-paper")]
    assert {s.colour for s in prague} == {PRAGUE}
    assert prague[0].fill == PRAGUE and prague[0].linestyle == "-"
    assert len({(s.linestyle, s.marker) for s in prague}) == 3
    assert len({s.fill for s in prague}) == 3
    # The order the labels come in does not change a label's style.
    assert protocol_styles(["prague-lag", "prague", "prague-paper"]) == {
        label: styles[label] for label in ("prague-lag", "prague", "prague-paper")}


def test_rank_shades_are_distinct_shades_of_one_colour() -> None:
    shades = rank_shades(PRAGUE, 4)
    assert len(set(shades)) == 4
    assert rank_shades(PRAGUE, 1) == [PRAGUE]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, list[str]]]:
    """Each saved figure's line colours by legend label, and its bars' under "bars"."""
    figures: list[dict[str, list[str]]] = []
    save = Figure.savefig

    def record(self: Figure, *args: object, **kwargs: object) -> None:
        lines: dict[str, list[str]] = {}
        for ax in self.axes:
            for line in ax.get_lines():
                lines.setdefault(line.get_label(), []).append(to_hex(line.get_color()))
            lines.setdefault("bars", []).extend(to_hex(bar.get_facecolor())
                                                for bar in ax.patches)
        figures.append(lines)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


def _run(root: Path, label: str, protocol: str, *, evaluated: bool = True) -> Path:
    run = root / label
    (run / "workers").mkdir(parents=True)
    for rank in range(2):
        (run / "workers" / f"rank{rank}.jsonl").write_text("".join(
            json.dumps({"t": 0.1 * i, "iteration": i}) + "\n" for i in range(1, 6)))
    if evaluated:
        (run / "eval.jsonl").write_text("".join(
            json.dumps({"t": float(t), "model": "consensus", "loss": 1.0 / (t + 1)}) + "\n"
            for t in range(4)))
    (run / "summary.json").write_text(json.dumps({"protocol": protocol, "label": label}))
    return run


def test_two_figures_of_one_report_give_prague_one_colour(
        tmp_path: Path, drawn: list[dict[str, list[str]]]) -> None:
    """Numbered colours gave prague its position's: here the third run of one setting and
    the second of the next, the first of them never evaluated."""
    first = [load_run(_run(tmp_path / "a", name, protocol, evaluated=name != "ddp"))
             for name, protocol in (("allreduce", "allreduce"), ("ddp", "ddp"),
                                    ("prague", "prague"))]
    second = [load_run(_run(tmp_path / "b", name, protocol))
              for name, protocol in (("allreduce", "allreduce"), ("prague", "prague"),
                                     ("my prague", "prague"))]
    for runs in (first, second):
        plot_loss(runs, tmp_path)
        plot_iterations(runs, tmp_path)
    assert len(drawn) == 4
    assert all(figure["prague"] == [PRAGUE] for figure in drawn)
    assert all(figure["allreduce"] == [to_hex(FAMILY_COLOURS["allreduce"])] for figure in drawn)
    assert drawn[2]["my prague"] == [PRAGUE]  # a user's label: its run's protocol decides
    plot_iterations_per_worker(second[1:2], tmp_path)
    assert drawn[4]["rank 0"] + drawn[4]["rank 1"] == rank_shades(PRAGUE, 2)


def test_the_speedup_bars_give_prague_its_colour(
        tmp_path: Path, drawn: list[dict[str, list[str]]]) -> None:
    def row(label: str) -> dict[str, object]:
        return {"label": label, "speedup_vs_allreduce": {"value": 1.5, "kind": "exact"},
                "throughput_vs_allreduce": 1.4}

    results = {"settings": [{"name": "one", "workers": 2,
                             "results": [row("allreduce"), row("hop"), row("prague")]}]}
    assert plot_speedups(results, tmp_path) is not None
    # Bars are drawn bottom up: the first variant on top.
    assert drawn[0]["bars"] == [PRAGUE, to_hex(FAMILY_COLOURS["hop"]),
                                to_hex(FAMILY_COLOURS["allreduce"])]
