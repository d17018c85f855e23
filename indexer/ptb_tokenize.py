"""The COCO caption toolkit's tokenisation, in Python.

``pycocoevalcap``'s ``PTBTokenizer`` shells out to Stanford CoreNLP 3.4.1's PTBTokenizer
(``-preserveLines -lowerCase``) and then drops the tokens in ``PUNCTUATIONS``. This module does
the same without Java, for the cases captions contain: clitics (``does n't``, ``dog 's``,
``ca n't``, ``gon na``), quotes (``"`` → ````/''``, curly quotes), brackets (``-lrb-``: lower-cased,
so the toolkit's filter, which lists ``-LRB-``, keeps them), sentence-final periods split off but
abbreviations (``mr.``, ``st.``, ``u.s.``, ``a.m.``) and numbers (``3.5``, ``1,000``, ``10:30``)
kept whole, dashes and ellipses normalised (``—`` → ``--``, ``…`` → ``...``).

Known differences from the Java lexer (tests/test_caption_metrics.py checks agreement on tricky
strings, and on all Flickr8k captions when the data and Java are present): the lexer's guess that
an abbreviation such as ``Inc.`` ends a sentence because the next word is capitalised is not
reproduced (lower-case input never triggers it); URLs and e-mail addresses are kept whole only in
their plain forms.
"""
from __future__ import annotations

import re

# pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS, as the toolkit filters them (case-sensitive).
PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-",
                          "--", "...", ";"])

# Abbreviations the lexer keeps with their period. Those in SENTENCE_FINAL also end a sentence at the
# end of a line, where the lexer then adds a separate "." (``etc.`` → ``etc. .``); titles do not.
_TITLES = {"mr", "mrs", "ms", "dr", "st", "mt", "prof", "gen", "rep", "sen", "gov", "lt", "col", "capt", "sgt",
           "rev", "messrs", "ft", "vs", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
           "sept", "oct", "nov", "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun", "ave", "blvd", "rd",
           "hwy", "fig", "approx", "dept", "est", "vol", "pp", "op", "cf", "al"}
_SENTENCE_FINAL = {"etc", "inc", "co", "corp", "ltd", "jr", "sr", "bros", "llc", "plc", "assn", "univ"}
_ACRONYM = re.compile(r"^(?:[a-z]\.){2,}$|^[a-z]\.(?:[a-z]\.)+$", re.I)  # u.s.  a.m.  e.g.
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:[.,:/]\d+)*|\.\d+)$")
_URLISH = re.compile(r"^(?:[a-z][a-z0-9+.-]*://\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)$", re.I)
_CLITIC = re.compile(r"^(.+?)(n't|'s|'m|'d|'re|'ll|'ve)$", re.I)
_SPLIT_WORDS = {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"), "wanna": ("wan", "na"),
                "gimme": ("gim", "me"), "lemme": ("lem", "me"), "dunno": ("du", "n", "no")}
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_SYMBOLS = set(",;!?%$*<>=+&#@~^|\\") | set(_BRACKETS)
_TRANSLATE = str.maketrans({"\u2014": " -- ", "\u2013": " -- ", "\u2026": " ... ", "\u201c": ' " ',
                            "\u201d": ' "" ', "\u2018": " ` ", "\u2019": "'", "\u00a0": " "})


def _symbol_token(ch: str) -> str:
    return _BRACKETS.get(ch, ch)


def _split_periods(word: str, last: bool) -> list[str]:
    """A word with trailing period(s): keep an abbreviation or number whole, else split the period off."""
    if word.endswith("..."):
        return _split_periods(word[:-3], False) + ["..."] if word[:-3] else ["..."]
    if not word.endswith(".") or word == ".":
        return [word] if word else []
    body = word[:-1]
    low = body.lower()
    if _ACRONYM.match(word):
        return [word]
    if low in _TITLES or (len(low) == 1 and low.isalpha() and not last):
        return [word]
    if low in _SENTENCE_FINAL:
        return [word, "."] if last else [word]
    if "." in body and not body.endswith("."):  # hello..world is handled by the caller; 3.5. → 3.5 .
        return [body, "."]
    return _split_periods(body, False) + ["."] if body.endswith(".") else [body, "."]


def _split_clitics(word: str) -> list[str]:
    low = word.lower()
    if low in _SPLIT_WORDS:
        out, i = [], 0
        for part in _SPLIT_WORDS[low]:
            out.append(word[i:i + len(part)])
            i += len(part)
        return out
    if low in ("'tis", "'twas"):
        return [word[:2], word[2:]]
    m = _CLITIC.match(word)
    if m and any(c.isalpha() for c in m.group(1)):
        head, tail = m.group(1), m.group(2)
        if tail.lower() == "n't" and head.lower() in ("ca", "wo", "do", "does", "did", "is", "was", "are", "were",
                                                      "has", "have", "had", "could", "would", "should", "must",
                                                      "need", "ai", "might", "sha", "dare"):
            return [head, tail]
        if tail.lower() == "n't":
            return [head, tail]
        return _split_clitics(head) + [tail]
    if len(word) > 1 and word.endswith("'") and word[-2].lower() == "s":  # dogs' → dogs '
        return [word[:-1], "'"]
    return [word]


def _chunk_tokens(chunk: str, last: bool) -> list[str]:
    """Tokens of one whitespace-free chunk."""
    if _URLISH.match(chunk) or _NUMBER.match(chunk) or chunk.lower() == "'n'":
        return [chunk]
    m = re.match(r"^('(?:s|m|d|re|ll|ve))-(.+)$", chunk, re.I)  # ant 's-eye-view → 's - eye-view
    if m:
        return [m.group(1), "-"] + _chunk_tokens(m.group(2), last)
    out: list[str] = []
    # leading symbols and opening quotes
    while chunk:
        if chunk.startswith('"'):
            out.append("``")
            chunk = chunk[1:]
        elif chunk.startswith("``"):
            out.append("``")
            chunk = chunk[2:]
        elif chunk[0] == "`":
            out.append("`")
            chunk = chunk[1:]
        elif chunk[0] == "'" and chunk.lower() not in ("'tis", "'twas") and not re.match(r"^'(s|m|d|re|ll|ve)$", chunk, re.I):
            if chunk.startswith("''"):
                out.append("''")
                chunk = chunk[2:]
            else:
                out.append("`")
                chunk = chunk[1:]
        elif chunk[0] in "!?":
            j = 0
            while j < len(chunk) and chunk[j] in "!?":
                j += 1
            out.append(chunk[:j])
            chunk = chunk[j:]
        elif chunk[0] in _SYMBOLS and chunk[0] not in "#@":
            out.append(_symbol_token(chunk[0]))
            chunk = chunk[1:]
        elif chunk.startswith("--"):
            out.append("--")
            chunk = chunk[2:]
        elif chunk[0] == "-" and len(chunk) > 1 and chunk[1].isalpha():
            out.append("-")
            chunk = chunk[1:]
        else:
            break
    # trailing symbols and closing quotes
    tail: list[str] = []
    while chunk:
        if chunk.endswith('""') or chunk.endswith("''"):
            tail.insert(0, "''")
            chunk = chunk[:-2]
        elif chunk.endswith('"'):
            tail.insert(0, "''")
            chunk = chunk[:-1]
        elif chunk[-1] in "!?":
            j = len(chunk)
            while j > 0 and chunk[j - 1] in "!?":
                j -= 1
            tail.insert(0, chunk[j:])
            chunk = chunk[:j]
        elif chunk[-1] in _SYMBOLS and chunk[-1] not in "#@":
            tail.insert(0, _symbol_token(chunk[-1]))
            chunk = chunk[:-1]
        elif chunk.endswith("--"):
            tail.insert(0, "--")
            chunk = chunk[:-2]
        elif chunk.endswith(":") and len(chunk) > 1:
            tail.insert(0, ":")
            chunk = chunk[:-1]
        elif chunk.endswith("'") and not (len(chunk) > 1 and chunk[-2].lower() == "s") and chunk not in ("'",) and \
                not re.search(r"'[a-z]+'$", chunk, re.I):
            tail.insert(0, "'")
            chunk = chunk[:-1]
        elif chunk.endswith(".") and tail:  # end."  → end . ''
            break
        else:
            break
    if not chunk:
        return out + tail
    return out + _middle(chunk, last and not tail) + tail


def _middle(chunk: str, last: bool) -> list[str]:
    if _URLISH.match(chunk) or _NUMBER.match(chunk):
        return [chunk]
    # inner symbols split the chunk (a=b, 3<4, 50%), keeping numbers and times together
    parts = re.split(r"([,;!?%$*<>=+&~^|\\(){}\[\]]|\.{2,}|--)", chunk)
    if len(parts) > 1:
        out: list[str] = []
        for i, p in enumerate(parts):
            if not p:
                continue
            if p in _SYMBOLS or p == "--":
                out.append(_symbol_token(p))
            elif re.fullmatch(r"\.{2,}", p):
                out.extend(["..."] if len(p) >= 3 else [".", "."])
            else:
                out.extend(_chunk_tokens(p, last and i == len(parts) - 1))
        return _rejoin_numbers(chunk, out)
    if chunk.endswith("."):
        words = _split_periods(chunk, last)
        return [t for w in words for t in (_split_clitics(w) if w not in (".", "...") else [w])]
    return _split_clitics(chunk)


def _rejoin_numbers(chunk: str, tokens: list[str]) -> list[str]:
    """``1,000`` / ``10,5`` stay whole: the split above broke them at the comma."""
    if re.fullmatch(r"\d+(?:,\d+)+", chunk):
        return [chunk]
    return tokens


def ptb_tokens(text: str) -> list[str]:
    """Lower-cased PTB tokens of one caption, before the toolkit's punctuation filter."""
    text = text.replace("\n", " ").translate(_TRANSLATE)
    chunks = text.split()
    out: list[str] = []
    for i, c in enumerate(chunks):
        out.extend(_chunk_tokens(c, i == len(chunks) - 1))
    return [t.lower() for t in out]


def coco_tokenize(text: str) -> str:
    """The caption as ``pycocoevalcap``'s PTBTokenizer returns it: PTB tokens, lower-cased, with the
    toolkit's punctuation tokens removed, joined by single spaces."""
    return " ".join(t for t in ptb_tokens(text) if t not in PUNCTUATIONS)


def tokenize_for_eval(captions: dict) -> dict:
    """``{key: [caption, ...]}`` → ``{key: [tokenised caption, ...]}`` (the toolkit's input format)."""
    return {k: [coco_tokenize(c) for c in v] for k, v in captions.items()}
