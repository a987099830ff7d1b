"""Every relative markdown link in README.md, DEVELOPERS.md and docs/, and every doc path the
code names, is a file that exists, so that moving a document or a run folder cannot leave a
reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A markdown link or image, `[text](target)` or `[text](target "title")`.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def dead_links(document: Path) -> list[str]:
    """The relative links of `document` (outside code) whose file does not exist."""
    text = _CODE.sub("", _FENCE.sub("", document.read_text(encoding="utf-8")))
    dead = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or a heading of the same file
        path = target.split("#", 1)[0]
        if not (document.parent / path).exists():
            dead.append(target)
    return dead


def test_every_relative_link_in_the_docs_resolves() -> None:
    dead = {str(doc.relative_to(ROOT)): links for doc in documents()
            if (links := dead_links(doc))}
    assert dead == {}


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    document = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("")
    document.write_text("[ok](b.md#x) [gone](c.md) ![gone too](p/d.png) [web](https://x.org) "
                        "`[code](e.md)` [here](#y)\n```\n[fenced](f.md)\n```\n")
    assert dead_links(document) == ["c.md", "p/d.png"]


def test_every_doc_path_named_in_the_code_exists() -> None:
    """A docstring or comment that sends the reader to a doc under docs/ names one that
    exists."""
    named = re.compile(r"\bdocs/[\w./-]*\w\.md\b")
    missing = {}
    for folder in ("src", "experiments", "examples", "tests"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            paths = [p for p in named.findall(source.read_text(encoding="utf-8"))
                     if not (ROOT / p).exists()]
            if paths:
                missing[str(source.relative_to(ROOT))] = paths
    assert missing == {}
