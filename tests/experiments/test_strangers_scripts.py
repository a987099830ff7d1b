"""experiments/strangers_scripts.py's table: clean exits, the first failure's line, the gaps."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture(scope="module")
def bench(experiments_on_path):
    return importlib.import_module("strangers_scripts")


def _ok(value: float) -> dict:
    return {"value": value, "metric": "test_accuracy", "higher_is_better": True, "wall_s": 10.0}


def test_the_table_gives_each_protocol_its_exits_and_its_gaps_to_ddp_and_plain(bench):
    rows = {
        bench.PLAIN: [_ok(0.90), _ok(0.92)],
        "ddp w2": [_ok(0.95), _ok(0.97)],
        "hop w2": [_ok(0.93), {"error": "TypeError: no closure", "wall_s": 2.0}],
    }
    lines = bench.table("bare_loop", rows).splitlines()
    plain, ddp, hop = lines[-3:]
    assert plain.startswith(f"| {bench.PLAIN} | 1 | 2/2 |") and "0.9100 ± 0.0141" in plain
    assert ddp.startswith("| ddp | 2 | 2/2 |") and ddp.endswith("| - | +0.0500 |")
    assert hop.startswith("| hop | 2 | 1/2: TypeError: no closure | 6.0 ± 5.7 | 0.9300 |")
    assert hop.endswith("| -0.0300 | +0.0200 |")
