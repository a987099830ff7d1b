"""The README's account of what hetsync asks of a script is the real diff of the examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _code_lines(path: Path) -> list[str]:
    """Code lines after the module docstring, without comments and indentation: re-indenting
    a loop body or marking a line `# hetsync` is not a change of it."""
    body = path.read_text().split('"""', 2)[2]
    lines = [line.split("  #")[0].split("# ")[0].strip() for line in body.splitlines()]
    return [line for line in lines if line]


def count_changes(before: Path, after: Path) -> tuple[int, int, int]:
    """Lines added, changed and removed from `before` to `after`, as `after` marks them
    (`# hetsync (added)`, `# hetsync (changed)`), checked against the real diff: every line
    of `after` that `before` lacks is marked, and each changed line replaced one of
    `before`'s; the rest of `before`'s missing lines were removed."""
    old, new = _code_lines(before), _code_lines(after)
    marks = [line for line in after.read_text().splitlines() if "# hetsync (" in line]
    added = sum("# hetsync (added)" in line for line in marks)
    changed = sum("# hetsync (changed)" in line for line in marks)
    only_new = [line for line in new if line not in old]
    only_old = [line for line in old if line not in new]
    assert len(only_new) == added + changed, f"unmarked new lines among {only_new}"
    assert len(only_old) >= changed, f"more changed lines than replaced ones: {only_old}"
    return added, changed, len(only_old) - changed


def test_the_readme_and_the_example_give_the_real_line_counts():
    counts = count_changes(ROOT / "examples" / "plain_script.py",
                           ROOT / "examples" / "own_script.py")
    pattern = r"(\d+) lines? (?:are )?added,\s+(\d+) changed and (\d+) removed"
    for doc in (ROOT / "README.md", ROOT / "examples" / "own_script.py"):
        stated = re.search(pattern, doc.read_text())
        assert stated is not None, f"{doc.name} does not state the line counts"
        assert tuple(int(n) for n in stated.groups()) == counts, doc.name


STRANGERS = sorted(p.name for p in (ROOT / "examples" / "strangers").iterdir()
                   if (p / "plain.py").is_file())


@pytest.mark.parametrize("script", STRANGERS)
def test_a_strangers_script_is_at_most_five_lines_from_its_plain_version(script):
    folder = ROOT / "examples" / "strangers" / script
    added, changed, removed = count_changes(folder / "plain.py", folder / "with_hetsync.py")
    assert added + changed + removed <= 5, (added, changed, removed)
