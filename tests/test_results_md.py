"""RESULTS.md's headline rows say only what their intervals show (issue 56).

The rule, stated in RESULTS.md's "How to read": a claim whose seed-level t-interval includes 0 (or the published
number it is compared with) is "not shown". This test reads the headline table and, for every row:

- the **main verdict** (the verdict cell before any parenthesis) is checked against the row's own t-interval
  (``t [a, b]`` in the number cell): a directional word (ahead, below, falls, beats, …) needs an interval on
  that side of the reference (0, or the published number the clause names, e.g. "below FV's 300.0"); "not
  shown" / "no detectable difference" needs one that contains it; a directional verdict without a t-interval
  fails (an image-bootstrap interval alone measures the test set, not training);
- every **other clause** of the verdict (split at ``;`` and ``,`` inside the parentheses) that uses a
  directional word must carry its own signed number (``+6.3``, ``−0.0051``), whose interval is then looked up
  in the section the row links to and must lie on that side of 0; a null clause with a number must have an
  interval there that contains 0;
- every signed number in the verdict has an interval in that section, and every bare number is a seed count
  or a published number of that section (a table line that says "published").

``check_headline`` is run on the current RESULTS.md and, as the test that the test can fail, on 13aba1f's
version of it (before issue 56), whose three parentheticals the issue names, which must fail.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "RESULTS.md"

NUM = r"[+\-−]?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"\[\s*({NUM})\s*,\s*({NUM})\s*\]")
# Words that assert a direction (up / down) or a size; "not shown" / "no detectable difference" assert none.
UP = r"ahead|above|beats?|gains?|helps?|keeps?|rises?|higher|larger|better|exceeds?|as large|nearly|more"
DOWN = r"behind|below|falls?|drops?|loses?|loss|hurts?|lower|smaller|worse|less"
NULL = r"not shown|no detectable difference"
# Signed numbers: + or − (U+2212), or an ASCII hyphen after a space/bracket (never the one in "batch-16").
SIGNED = re.compile(r"(?:(?<![\w@.\d])[+−]|(?<=[\s(\[])-)\d+(?:\.\d+)?")
BARE = re.compile(r"(?<![\w@.\d+−\-/~])\d+(?:\.\d+)?(?![\d/])")
SEED_COUNT = re.compile(r"^\s*(?:seeds?\b|of \d)")
NAME = re.compile(r"(?:batch|β|η|α|bi-GRU|epochs?)\s*$")  # "batch 16", "η 0.15": a setting's name, not a result


def norm(x: str) -> float:
    return float(x.replace("−", "-"))


def headline(text: str) -> list[list[str]]:
    block = text.split("<!-- headline:start -->", 1)[1].split("<!-- headline:end -->", 1)[0]
    rows = [ln for ln in block.strip().splitlines() if ln.startswith("|")][2:]  # header, separator
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]


def anchor(title: str) -> str:  # GitHub's: lower case, punctuation dropped, spaces to hyphens
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def section(text: str, target: str) -> str:
    parts = re.split(r"^(## .+)$", text, flags=re.M)
    for i in range(1, len(parts), 2):
        if anchor(parts[i][3:]) == target:
            return parts[i + 1]
    raise AssertionError(f"no section #{target}")


def direction(clause: str) -> str | None:
    c = clause.lower()
    if re.search(NULL, c):
        return "null"
    if re.search(rf"\b(?:{UP})\b", c):
        return "up"
    if re.search(rf"\b(?:{DOWN})\b", c):
        return "down"
    return None


def follows(word: str, lo: float, hi: float, ref: float) -> bool:
    return {"up": lo > ref, "down": hi < ref, "null": lo <= ref <= hi}[word]


def intervals_of(number: str, sec: str) -> list[tuple[float, float]]:
    """The interval written after each occurrence of ``number`` in a section: the number, optionally its ± sd,
    a % and a (k/n) seed count, then table bars or "t", then ``[a, b]``."""
    n = re.escape(number).replace("−", "[−-]").replace(r"\+", r"\+")
    pat = re.compile(rf"(?<![\d.]){n}(?![\d])(?:\s*±\s*[\d.]+)?\s*%?\s*(?:\(\d+/\d+[^)]*\))?[\s|]*(?:t\s*)?"
                     rf"\[\s*({NUM})\s*,\s*({NUM})\s*\]")
    variants = {sec, sec.replace("−", "-")}
    return [(norm(a), norm(b)) for s in variants for a, b in pat.findall(s)]


def published(number: str, sec: str) -> bool:
    return any("published" in ln.lower() and re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", ln)
               for ln in sec.splitlines())


def clauses(verdict: str) -> tuple[str, list[str]]:
    main, _, rest = verdict.partition("(")
    rest = rest.rsplit(")", 1)[0] if rest else ""
    return main.strip(), [c.strip() for c in re.split(r"[;,]", rest) if c.strip()]


def bare_numbers(clause: str) -> list[str]:
    """Bare numbers other than seed counts ("~4 seeds", "> 50 seeds", "3 seeds", "0/3") and settings ("batch 16")."""
    out = []
    for m in BARE.finditer(clause):
        if SEED_COUNT.match(clause[m.end():]) or NAME.search(clause[:m.start()]):
            continue
        out.append(m.group())
    return out


def check_row(row: list[str], text: str) -> list[str]:
    claim, number, verdict, link = row
    sec = section(text, re.search(r"\(#([^)]+)\)", link).group(1))
    errors = []
    t = re.search(rf"\bt\s*\[\s*({NUM})\s*,\s*({NUM})\s*\]", number)
    main, rest = clauses(verdict)
    word = direction(main)
    consts = [x for x in bare_numbers(main) if published(x, sec)]
    ref = norm(consts[0]) if consts else 0.0
    if word in ("up", "down") and not t:
        errors.append(f"{claim[:50]}: '{main}' without a seed-level t-interval")
    if word and t and not follows(word, norm(t.group(1)), norm(t.group(2)), ref):
        errors.append(f"{claim[:50]}: '{main}' but t [{t.group(1)}, {t.group(2)}] (reference {ref:g})")
    for c in rest:
        w, signed = direction(c), SIGNED.findall(c)
        consts = [x for x in bare_numbers(c) if published(x, sec)]
        for x in bare_numbers(c):
            if x not in consts:
                errors.append(f"{claim[:50]}: '{c}': {x} is neither a seed count nor a published number of the section")
        if w in ("up", "down") and not signed:
            if consts and t:  # "above FNE-MH 281.4": the row's own interval against that number
                if not follows(w, norm(t.group(1)), norm(t.group(2)), norm(consts[0])):
                    errors.append(f"{claim[:50]}: '{c}' but t [{t.group(1)}, {t.group(2)}]")
            else:
                errors.append(f"{claim[:50]}: '{c}' claims a direction with no number to check")
        for x in signed:
            found = intervals_of(x, sec)
            if not found:
                errors.append(f"{claim[:50]}: '{c}': {x} has no interval in its section")
            elif w and not all(follows(w, lo, hi, 0.0) for lo, hi in found):
                errors.append(f"{claim[:50]}: '{c}' but its interval is {found}")
    for x in SIGNED.findall(main):
        if not intervals_of(x, sec):
            errors.append(f"{claim[:50]}: '{main}': {x} has no interval in its section")
    return errors


def check_headline(text: str) -> list[str]:
    return [e for row in headline(text) for e in check_row(row, text)]


def test_every_headline_row_follows_the_rule():
    errors = check_headline(RESULTS.read_text())
    assert not errors, "\n".join(errors)


def test_the_rule_is_stated_where_readers_look():
    text = RESULTS.read_text()
    how = text.split("**How to read a comparison.**", 1)[1].split("\n\n", 1)[0]
    assert "seed-level t-interval includes 0" in how and "**not shown**" in how and "tests/test_results_md.py" in how


def test_the_old_wording_fails():
    try:
        old = subprocess.run(["git", "show", "13aba1f:RESULTS.md"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=20).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
        pytest.skip("13aba1f (the RESULTS.md the referee read) is not in this checkout's history")
    errors = "\n".join(check_headline(old))
    for phrase in ("falls too", "nearly as large without shortcuts", "both score above batch-16 LTD"):
        assert phrase in errors, f"the old parenthetical '{phrase}' passed:\n{errors}"


@pytest.mark.parametrize("verdict, number, ok", [
    ("ahead", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", True),
    ("ahead", "Δ +2.9 ± 2.4, 4/5, t [−0.1, +5.9]", False),
    ("not shown (~6 seeds)", "Δ +2.9 ± 2.4, 4/5, t [−0.1, +5.9]", True),
    ("no detectable difference", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", False),
    ("above FV", "316.9, images [305.2, 328.6]", False),
    ("ahead (3 seeds; it falls too)", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", False),
    ("ahead (3 seeds; x +5.0 falls)", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", False),
    ("ahead (3 seeds; y +7.0 ahead)", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", True),
    ("ahead (3 seeds; z +8.0 ahead)", "Δ +6.0 ± 1.4, 3/3, t [+2.6, +9.4]", False),
])
def test_the_checker_on_planted_rows(verdict, number, ok):
    text = ("<!-- headline:start -->\n| claim | number | verdict | link |\n|---|---|---|---|\n"
            f"| a claim | {number} | {verdict} | [→](#s) |\n<!-- headline:end -->\n\n## S\n\n"
            "| x | −5.0 ± 2.4 (0/3) | [−11.1, +1.0] | not shown |\n| y | +7.0 ± 1.0 (3/3) | [+4.0, +9.0] | ahead |\n"
            "| z | +8.0 ± 5.0 (2/3) | [−4.0, +20.0] | not shown |\n")
    assert (not check_headline(text)) == ok, check_headline(text)


def _stats():
    import importlib.util
    spec = importlib.util.spec_from_file_location("headline_stats", ROOT / "docs" / "results" / "headline_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # scipy.stats's import: ~1 s of CPU, several on a loaded machine
def test_each_headline_interval_recomputes_from_the_per_seed_files():
    stats = _stats()
    rows, recomputed = headline(RESULTS.read_text()), stats.rows()
    assert len(rows) == len(recomputed) == len(stats.CLAIMS), "one CLAIMS entry a headline row, in order"
    for row, r, (_, _, ref) in zip(rows, recomputed, stats.CLAIMS):
        t = re.search(rf"\bt\s*\[\s*({NUM})\s*,\s*({NUM})\s*\]", row[1])
        if not t:
            assert "mean" not in r or r["n"] < 2 or row[2].startswith("no detectable"), row[0]
            continue
        for shown, value in zip(t.groups(), (r["lo"] + ref, r["hi"] + ref)):
            decimals = len(shown.split(".")[1]) if "." in shown else 0
            assert abs(norm(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9, f"{row[0][:50]}: {shown} vs {value:.4f}"


@pytest.mark.slow
def test_the_multiplicity_table_is_the_scripts():
    text = RESULTS.read_text()
    sec = section(text, "multiplicity-how-many-headline-claims-survive-a-holm-correction")
    assert _stats().table() in sec
