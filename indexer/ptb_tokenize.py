"""The COCO caption toolkit's tokenisation, in Python, token for token.

``pycocoevalcap``'s ``PTBTokenizer`` writes every caption of a dict on a line of one file, runs
Stanford CoreNLP 3.4.1's PTBTokenizer over it (``-preserveLines -lowerCase``), splits the output
into lines again and drops the tokens in ``PUNCTUATIONS``. This module does the same without Java:
the scanner's rules (``indexer/ptb_lexer_rules.py``, from its ``PTBLexer.flex``) run with JFlex's
semantics — at every position the longest match over all rules (a rule's trailing context counts
towards its length but is not consumed), ties to the earlier rule — and the same actions
(``<unk>``-like tags kept whole, ``(`` → ``-lrb-``, ``"`` → `````` or ``''``, clitics split off,
``cannot`` → ``can not``, an abbreviation ending a sentence followed by a period of its own, ...).

``tokenize_for_eval`` reproduces the toolkit's whole pipeline, including its two quirks: a caption's
last token can depend on the next caption in the file (``etc.`` before a capitalised line gets a
period of its own), and line-break characters other than ``\\n`` inside a caption (``\\r``, U+2028,
...) shift the lines the way the Java output does. ``coco_tokenize`` tokenises one caption alone.
tests/test_caption_metrics.py checks both against the toolkit's jar (when Java is present) on the
grammar's hard cases, random strings, and every Flickr8k caption.

Speed: a fast path skips the rule scan for plain ASCII words followed by a space, a newline or the
end (no rule can take such a word other than whole, except the assimilations ``cannot``, ``gonna``,
...), and every match is confined to a window (this line, blank lines, the next line: the farthest
any rule's trailing context reaches; the whole rest of the text for ``<``, whose tags' quoted
attributes may span lines), because ``regex`` may scan to the end of its window for a pattern's
required characters before matching.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache

import regex

from indexer.ptb_lexer_rules import compile_rules

# pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS, as the toolkit filters them (case-sensitive).
PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-",
                          "--", "...", ";"])

_NEWLINE = object()
_FAST_WORD = regex.compile(r"[A-Za-z]+(?=[ \n]|\Z)")
_ASSIMILATIONS = frozenset({"cannot", "gonna", "gotta", "lemme", "gimme", "wanna"})
_AMP = regex.compile(r"&amp;", regex.IGNORECASE)
_QUOTES_LEFT = str.maketrans({"'": "`", '"': "``"})
_QUOTES_RIGHT = str.maketrans({"'": "'", '"': "''"})
_QUOTES_CURLY = str.maketrans({"\u0091": "`", "\u2018": "`", "\u201B": "`", "\u2039": "`", "\u0092": "'",
                               "\u2019": "'", "\u203A": "'", "\u0093": "``", "\u201C": "``", "\u00AB": "``",
                               "\u0094": "''", "\u201D": "''", "\u00BB": "''"})
_FRACTIONS = str.maketrans({"\u00BC": "1/4", "\u00BD": "1/2", "\u00BE": "3/4", "\u2153": "1/3", "\u2154": "2/3"})
_CURRENCY = str.maketrans({"\u00A2": "cents", "\u00A3": "#", "\u0080": "$", "\u00A4": "$", "\u20A0": "$", "\u20AC": "$"})
_PARENS = str.maketrans({"(": "-LRB-", ")": "-RRB-"})
_SPACENL = frozenset(" \t\u00A0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u3000"
                     "\r\n\u2028\u2029\u000B\u000C\u0085")
_NON_BMP = regex.compile(r"[\U00010000-\U0010FFFF]")
_SURROGATE_PAIR = regex.compile(r"[\uD800-\uDBFF][\uDC00-\uDFFF]")
_SURROGATE = regex.compile(r"[\uD800-\uDFFF]")


@cache
def _rules() -> tuple[list, dict[str, list]]:
    """The compiled rules (built on first use: ~1 s), and for each ASCII character the rules that can
    match text starting with it (regex's partial matching decides; a non-ASCII character tries all)."""
    rules = compile_rules()
    return rules, {chr(c): [r for r in rules if r[0].match(chr(c), partial=True) is not None] for c in range(128)}


def _to_utf16(text: str) -> str:
    """Characters outside the BMP as two surrogates each: the Java scanner sees UTF-16 code units."""
    return _NON_BMP.sub(lambda m: "".join(chr(u) for u in _units(m.group())), text)


def _units(ch: str) -> tuple[int, int]:
    c = ord(ch) - 0x10000
    return 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF)


def _from_utf16(token: str) -> str:
    """Surrogate pairs back to characters; a lone surrogate becomes '?' (Java's UTF-8 encoder)."""
    if token.isascii():
        return token
    token = _SURROGATE_PAIR.sub(lambda m: chr(0x10000 + ((ord(m.group()[0]) - 0xD800) << 10)
                                              + ord(m.group()[1]) - 0xDC00), token)
    return _SURROGATE.sub("?", token)


def _latex_quotes(tok: str, left: bool) -> str:
    tok = tok.replace("&apos;", "'").replace("&quot;", '"')
    return tok.translate(_QUOTES_LEFT if left else _QUOTES_RIGHT).translate(_QUOTES_CURLY)


def _act(action: str, head: str) -> tuple[str | object | None, int]:
    """(token text, None to emit nothing, or _NEWLINE; characters of the head given back for rescanning)."""
    if action in ("keep", "period"):
        return head, (1 if action == "period" else 0)
    if action == "soft":
        return head.replace("\u00AD", "") or "-", 0
    if action == "amp":
        return _AMP.sub("&", head), 0
    if action in ("skip", "drop"):
        return None, 0
    if action == "newline":
        return _NEWLINE, 0
    if action in ("left", "right"):
        return _latex_quotes(head, action == "left"), 0
    if action.startswith("split:"):
        n = int(action[6:])
        return head[:-n], n
    if action == "acronym":  # "I." → "I" then "."; "U.S." → "U.S." then "." (the period scanned again)
        return (head[:-1], 1) if len(head) == 2 else (head, 1)
    if action == "hyphens":
        return ("--" if 3 <= len(head) <= 4 else head), 0
    if action in ("nbsp", "phone"):
        head = head.replace(" ", "\u00A0")
        return (head.translate(_PARENS) if action == "phone" else head), 0
    fixed = {"dash": "--", "ellipsis": "...", "lt": "<", "gt": ">"}
    if action in fixed:
        return fixed[action], 0
    table = {"fraction": _FRACTIONS, "currency": _CURRENCY, "paren": _PARENS}
    if action in table:
        return head.translate(table[action]), 0
    if action.startswith("="):
        return action[1:], 0
    raise ValueError(f"unknown PTB lexer action {action!r}")


def _window_end(text: str, pos: int) -> int:
    """End of the text any match starting at ``pos`` can reach: the rest of this line, any blank lines,
    and the next line with its line break (everything for a ``<``)."""
    e = text.find("\n", pos)
    if e < 0 or text[pos] == "<":
        return len(text)
    j = e
    while j < len(text) and text[j] in _SPACENL:
        j += 1
    e2 = text.find("\n", j)
    return len(text) if e2 < 0 else e2 + 1


def scan(text: str, *, fast: bool = True) -> Iterator[str | object]:
    """The scanner's tokens of ``text`` (before lower-casing), and ``_NEWLINE`` for every line break.
    ``fast=False`` runs every position through the rules (the fast path's reference in the tests)."""
    rules, by_first = _rules()
    text = _to_utf16(text)
    pos, end = 0, len(text)
    while pos < end:
        c = text[pos]
        if fast and c == " ":
            pos += 1
            continue
        if fast and c == "\n":
            yield _NEWLINE
            pos += 1
            continue
        window = _window_end(text, pos)
        m = _FAST_WORD.match(text, pos, window) if fast and c.isascii() and c.isalpha() else None
        if m is not None and m.group().lower() not in _ASSIMILATIONS:
            yield m.group()
            pos = m.end()
            continue
        best, best_len = None, 0
        for quick, posix, action in by_first.get(c, rules):
            if quick.match(text, pos, window) is None:
                continue
            mm = posix.match(text, pos, window)
            if mm.end() - pos > best_len:
                best, best_len = (mm, action), mm.end() - pos
        if best is None:  # cannot happen: the last rule takes any character but \n
            pos += 1
            continue
        mm, action = best
        tok, give_back = _act(action, mm.group("h"))
        pos = mm.end("h") - give_back
        if tok is not None:
            yield tok


def _lower(tok: str) -> str:
    return _from_utf16(tok).lower()


def ptb_lines(text: str) -> list[list[str]]:
    """Lower-cased tokens of every line of ``text``, as the toolkit's ``-preserveLines -lowerCase``
    command writes them (before the punctuation filter)."""
    lines: list[list[str]] = [[]]
    for tok in scan(text):
        if tok is _NEWLINE:
            lines.append([])
        else:
            lines[-1].append(_lower(tok))
    return lines


def ptb_tokens(text: str) -> list[str]:
    """Lower-cased PTB tokens of one caption on its own (line breaks inside it only separate tokens)."""
    return [t for line in ptb_lines(text.replace("\n", " ")) for t in line]


def _filtered(tokens: Sequence[str]) -> str:
    return " ".join(t for t in tokens if t not in PUNCTUATIONS)


def coco_tokenize(text: str) -> str:
    """One caption as ``pycocoevalcap``'s PTBTokenizer returns it when it is alone in the file:
    PTB tokens, lower-cased, the toolkit's punctuation tokens removed, joined by single spaces."""
    return _filtered(ptb_tokens(text))


def tokenize_for_eval(captions: dict) -> dict:
    """``{key: [caption, ...]}`` → ``{key: [tokenised caption, ...]}``, exactly as
    ``PTBTokenizer().tokenize`` returns it for ``{key: [{"caption": caption}, ...]}``: one file of all
    captions in dict order, the Java output split into lines, paired with the keys (``zip``)."""
    keys = [k for k, v in captions.items() for _ in range(len(v))]
    text = "\n".join(c.replace("\n", " ") for v in captions.values() for c in v)
    out = "\n".join(" ".join(line) for line in ptb_lines(text))
    result: dict = {}
    for k, line in zip(keys, out.split("\n")):
        result.setdefault(k, []).append(" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS))
    return result
