"""RESULTS.md's headline table (issue 36 / 39): one short row per claim, each with its number and a
verdict in the words the statistics allow, and every headline number written once on the page."""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
VERDICTS = ("ahead", "behind", "not shown", "no detectable difference", "below", "above", "–")


def _headline() -> list[list[str]]:
    text = RESULTS.read_text()
    block = text.split("<!-- headline:start -->", 1)[1].split("<!-- headline:end -->", 1)[0]
    rows = [ln for ln in block.strip().splitlines() if ln.startswith("|")][2:]  # header, separator
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]


def _words(row: list[str]) -> int:
    text = re.sub(r"\]\([^)]*\)", "]", " ".join(row))  # a link counts as its text
    return len([w for w in text.replace("→", " ").split() if re.search(r"\w", w)])


def test_headline_rows_are_short_and_each_has_a_verdict_and_a_link():
    rows = _headline()
    assert len(rows) >= 10
    for row in rows:
        assert len(row) == 4, row
        assert _words(row) <= 40, f"{_words(row)} words: {row[0]}"
        assert row[2].startswith(VERDICTS), row
        assert re.fullmatch(r"\[→\]\(#[^)]+\)", row[3]), row


def test_headline_numbers_are_written_once_on_the_page():
    text = RESULTS.read_text()
    for row in _headline():
        for number in re.findall(r"[+−-]?\d+\.\d+ ± \d+\.\d+", row[1]):
            assert text.count(number) == 1, f"{number} is written {text.count(number)} times in RESULTS.md"


def test_headline_links_point_at_sections_that_exist():
    text = RESULTS.read_text()

    def anchor(title: str) -> str:  # GitHub's: lower case, punctuation dropped, spaces to hyphens
        return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
    anchors = {anchor(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    for row in _headline():
        target = re.search(r"\(#([^)]+)\)", row[3]).group(1)
        assert target in anchors, target
