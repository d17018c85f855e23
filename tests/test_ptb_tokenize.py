"""The Python port of the COCO toolkit's tokenizer (indexer/ptb_tokenize.py) against the toolkit's own
jar: hand-checked cases, the cases the scanner's grammar documents, seeded random strings built from
its hard pieces and from across the Basic Multilingual Plane, the toolkit's whole dict pipeline, every
Flickr8k caption, and ``coco_scores`` against pycocoevalcap's tokenizer-plus-scorers pipeline."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from indexer.ptb_tokenize import PUNCTUATIONS, coco_tokenize, ptb_lines, scan, tokenize_for_eval

pytest.importorskip("pycocoevalcap")
HAS_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs java for the toolkit's Stanford PTBTokenizer")

TRICKY = [
    ("A man's dog doesn't like the colour grey (or red).", "a man 's dog does n't like the colour grey -lrb- or red -rrb-"),
    ('Two "people" are walking; one is holding an umbrella!', "two people are walking one is holding an umbrella"),
    ("The t-shirt costs $5.50 and/or 3/4 of it... isn't it?", "the t-shirt costs $ 5.50 and/or 3/4 of it is n't it"),
    ("She said 'hello' -- then left & waved ... OK?", "she said hello then left & waved ok"),
    ("gonna wanna can't won't I'm we're they'll you'd cannot", "gon na wan na ca n't wo n't i 'm we 're they 'll you 'd can not"),
    ("U.S. flag at 10:30 a.m. e.g. etc.", "u.s. flag at 10:30 a.m. e.g. etc."),
    ("He's running. Mr. Smith's cat; Dogs' toys", "he 's running mr. smith 's cat dogs toys"),
    ("Kids play in the sprinkler  with   extra   spaces", "kids play in the sprinkler with extra spaces"),
    ("A dog [jumps] over {the} fence 50% *star*", "a dog -lsb- jumps -rsb- over -lcb- the -rcb- fence 50 % * star *"),
    ("Café — an em dash – en dash … “curly” ‘single’", "café an em dash en dash curly single"),
    ("A small child slides down a slip 'n' slide .", "a small child slides down a slip 'n' slide"),
    ("An ant 's-eye-view of people", "an ant 's eye-view of people"),
    ("It's 1,000 people, 3.14, .5 pieces hello..world ok!! why?? well ?!",
     "it 's 1,000 people 3.14 .5 pieces hello world ok !! why ?? well ?!"),
    ('A man with a shirt saying " -ependent " faces the camera', "a man with a shirt saying ependent faces the camera"),
    # issue 43: a tag-like token stays whole (the scanner's SGML rule); a bare angle bracket is a token
    ("a man in a red shirt is sitting on a <unk>", "a man in a red shirt is sitting on a <unk>"),
    ("<unk> dogs < unk > x<y 3>2 <pad><bos>", "<unk> dogs < unk > x < y 3 > 2 <pad> <bos>"),
    ("a <a href='x'>link</a> here", "a <a\u00a0href='x'> link </a> here"),
]

# the grammar's own examples (PTBLexer.flex comments and options), and its traps
GRAMMAR_CASES = [
    "The U.S. The dog", "I. The end", "Inc. The firm", "etc. and so on", "etc.", "Jan. 5", "Sept. The",
    "pty. ltd", "co. limited", "ca. 1900", "fig. 3", "no. 7 and no more", "Mr. Ms. Dr. St. Mt. vs. cf.",
    "5 7/8 inches", "1 1/2", "(555) 123-4567 or 555-123-4567 or 12.34.567.890", "3-4-2014", "9/11/01",
    "o'clock 'n' y'all 'til 'till 'cause c'mon e'er li'l nat'l cont'd ev'ry nor'easter O'Neil d'Arc l'amour",
    "don'ts can't've Cap'n c'est 'twas 'tis '90s '05 'em rock'n'roll", "it's' 'quoted' \"x\" ``y'' `z'",
    "C.D.s S&P-500 S&Ls AT&T R&D pro- anti- -LRB- -rrb-", "c++ c# f# C++", "me@x.com <me@x.com> @user #tag",
    "http://x.com/a?b=c. www.x.org, x.com; file.txt! a.k.a. Ph.D. e.g.,", "US$ 5 $ 5 # 5 € 5 £ 5 ¢ 5 ¥",
    "a -- b --- c ---- d ----- e _ f __ *** \\* ... .. . . . .... … ¼ ½ ¾ ⅓ ⅔ ⅛",
    ":) :-( ;D =P ^_^ x_x (^-^) <3 >:( :O", "& &amp; &lt; &gt; &quot; &apos; &nbsp; &mdash; &eacute;",
    "soft\u00adhyphen non\u00a0breaking zero\u200bwidth \ufeffbom \x7fdel", "a\tb", "ÀÉÎÕÜ straße İstanbul ΣΑΣ",
]


def _java_raw(lines: list[str], tmp_path: Path) -> list[str]:
    """The toolkit's command on lines: its raw output lines (before the punctuation filter)."""
    import pycocoevalcap.tokenizer.ptbtokenizer as tk

    src = tmp_path / "lines.txt"
    src.write_bytes("\n".join(lines).encode())
    jar = Path(tk.__file__).parent / tk.STANFORD_CORENLP_3_4_1_JAR
    out = subprocess.run(["java", "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
                          "-lowerCase", str(src)], capture_output=True, timeout=600)
    return out.stdout.decode().split("\n")


def _assert_same_as_java(lines: list[str], tmp_path: Path) -> None:
    java = _java_raw(lines, tmp_path)
    port = [" ".join(line) for line in ptb_lines("\n".join(lines))]
    differ = [(raw, j, p) for raw, j, p in zip(lines, java, port) if j != p]
    assert len(port) == len(lines) and not differ[:5], differ[:5]


PIECES = ("a dog The U.S. Mr. etc. Inc. I. cannot Gonna don't can't it's dogs' 'tis o'clock 'n' y'all '90s <unk> <pad> "
          "< > <3 << >> &amp; &lt; 3 3.5 1,000 10:30 1/2 3-4 555-1234 $5 # @ #tag me@x.com http://x.com/a www.x.org "
          "x.com c++ A&B ( ) [ ] { } . , ; : ! ? ?! ... .. - -- --- _ * / \\ = % + ~ ^ | ' \" ` `` '' :) ^_^ café "
          "naïve 中文 Москва ß İ ½ € £ ¢ © ° × — – … ‘ ’ “ ” « » \u00ad \u00a0 \u200b 😀 𝐀 x-ray t-shirt pro- -LRB- "
          "ca. no. St. vs. Calif. Jan. Ph.D. 's n't N'T 'LL d'Arc O'Neil \x7f \x00").split(" ")


def random_lines(seed: int, n: int) -> list[str]:
    """Lines glued from the grammar's hard pieces (with and without spaces between them)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) + rng.choice([" ", " ", ""]) for _ in range(rng.randint(0, 12)))
            for _ in range(n)]


def random_unicode_lines(seed: int, n: int) -> list[str]:
    """Lines of characters drawn from across the BMP (and a few emoji), no line breaks inside."""
    rng = random.Random(seed)
    blocks = [(0x20, 0x7E), (0x80, 0x2FF), (0x300, 0x6FF), (0x900, 0xE7F), (0x1800, 0x1CFF), (0x2000, 0x2BFF),
              (0x3000, 0x30FF), (0x4E00, 0x4E80), (0xA600, 0xABFF), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F)]
    breaks = dict.fromkeys(map(ord, "\r\x85\u2028\u2029\x0b\x0c"), " ")

    def char() -> str:
        lo, hi = rng.choice(blocks)
        return chr(rng.randint(lo, hi))

    return ["".join(char() if rng.random() < 0.4 else rng.choice(["a", "b", " ", "dog", "1", ".", "'"])
                    for _ in range(rng.randint(0, 20))).translate(breaks) for _ in range(n)]


@pytest.mark.parametrize("raw, expected", TRICKY)
def test_python_ptb_tokenizer_on_tricky_strings(raw, expected):
    assert coco_tokenize(raw) == expected


def test_the_fast_path_equals_the_rule_scan():
    """Plain words skip the rule scan: the tokens are those of scanning every position."""
    for text in random_lines(7, 300) + GRAMMAR_CASES + [raw for raw, _ in TRICKY]:
        assert list(scan(text)) == list(scan(text, fast=False)), text


@pytest.mark.slow
@needs_java
def test_python_ptb_tokenizer_agrees_with_the_java_one(tmp_path):
    """The toolkit's exact command (-preserveLines -lowerCase) on the cases above and 3,000 random lines."""
    lines = [raw for raw, _ in TRICKY] + GRAMMAR_CASES + random_lines(0, 2000) + random_unicode_lines(0, 1000)
    _assert_same_as_java(lines, tmp_path)


@needs_java
def test_tokenize_for_eval_is_the_toolkit_pipeline():
    """``PTBTokenizer().tokenize`` itself: captions of several keys in one file, so ``etc.`` ending a
    caption depends on the next one, and line breaks other than \\n inside a caption shift the lines."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    caps = {"a": ["The dog etc.", "Then U.S.", "The cat"], 7: ["e.g. <unk> x", "line\nbreak"],
            "b": ["a <unk> sits on a <unk>.", "etc."], "c": ["two\rlines", "x\u2028y", "z"], "d": ["last etc."]}
    assert tokenize_for_eval(caps) == PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in caps.items()})


@pytest.mark.slow
@needs_java
def test_every_bmp_character_is_scanned_as_the_jar_scans_it(tmp_path):
    """Each BMP character alone, as x.Cy (one word iff a letter) and as .C (one number iff a digit):
    the letter and digit classes, untokenizable characters and the Unicode version of the jar's tables."""
    chars = [chr(c) for c in range(0x80, 0x10000) if not 0xD800 <= c <= 0xDFFF and chr(c) not in "\r\x85\u2028\u2029\x0b\x0c"]
    for form in ("{}", "x.{}y", ".{}"):
        _assert_same_as_java([form.format(c) for c in chars], tmp_path)


@pytest.mark.realdata
@needs_java
def test_python_ptb_tokenizer_agrees_with_java_on_every_flickr8k_caption():
    import json

    from conftest import flickr8k_json
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    path = flickr8k_json()
    if path is None:
        pytest.skip("needs the Flickr8k dataset: set LTD_DATA_DIR")
    caps = {im["filename"]: [s["raw"] for s in im["sentences"]] for im in json.loads(path.read_text())["images"]}
    want = PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in caps.items()})
    assert sum(map(len, caps.values())) == 40_000 and tokenize_for_eval(caps) == want


def _toolkit_scores(gts: dict, res: dict, meteor: bool) -> dict:
    """pycocoevalcap's own pipeline: its PTBTokenizer, then Bleu, Rouge, Cider (and Meteor)."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tok = PTBTokenizer()
    g = tok.tokenize({k: [{"caption": c} for c in v] for k, v in gts.items()})
    r = tok.tokenize({k: [{"caption": c} for c in v] for k, v in res.items()})
    out = {f"BLEU-{n}": b for n, b in enumerate(Bleu(4).compute_score(g, r, verbose=0)[0], 1)}
    out["ROUGE-L"] = Rouge().compute_score(g, r)[0]
    out["CIDEr-D"], per = Cider().compute_score(g, r)
    out["per_caption"], out["tokens"] = dict(zip(g, per)), (g, r)
    if meteor:
        scorer = Meteor()
        out["METEOR"] = scorer.compute_score(g, r)[0]
        del scorer  # stops its Java process
    return out


@pytest.mark.slow
@needs_java
@pytest.mark.parametrize("meteor", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["no_meteor", "meteor"])
def test_coco_scores_equal_the_toolkit_pipeline_on_hard_candidates(meteor):
    """Issue 43's acceptance: candidates with <unk>, angle brackets, hyphens, apostrophes, digits and
    non-ASCII text, scored by ``coco_scores`` (Python tokenizer) and by pycocoevalcap end to end (Java).
    METEOR (a minute of Java start-up each) only in the slow run: it reads the same tokens."""
    from indexer.caption_metrics import coco_scores

    rng = random.Random(43)
    subjects = ["a man", "two dogs", "a young girl", "the children", "a woman in a red t-shirt", "an old man's dog"]
    actions = ["runs on", "is sitting on", "jumps over", "plays in", "walks along", "is looking at"]
    things = ["the grass", "a bench", "the snow-covered hill", "a wooden fence", "the water", "a brick wall"]
    extras = ["<unk>", "< unk >", "<pad>", "a <unk> <unk>", "3 kids", "1,000 people", "the 1990's", "café",
              "naïve façade", "über-cool", "d'Arc", "o'clock", "isn't", "dog's", "x<y", "5>3", "-- well-known",
              "日本の犬", "Москва", "½ price", "e.g. etc.", '"quoted"', "(maybe)", "😀 smile"]
    gts, res = {}, {}
    for i in range(40):
        s, a, t = rng.choice(subjects), rng.choice(actions), rng.choice(things)
        gts[i] = [f"{s.capitalize()} {a} {t}.", f"{rng.choice(subjects)} {a} {rng.choice(things)} .",
                  f"{s} {rng.choice(actions)} {t} {rng.choice(extras)}"]
        res[i] = [f"{s} {a} {rng.choice([t, rng.choice(things)])} {rng.choice(extras)} {rng.choice(extras)}"]
    ours, theirs = coco_scores(gts, res, meteor=meteor), _toolkit_scores(gts, res, meteor)
    assert (tokenize_for_eval(gts), tokenize_for_eval(res)) == theirs["tokens"]
    for k in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D") + (("METEOR",) if meteor else ()):
        assert ours[k] == pytest.approx(theirs[k], abs=1e-6), k
    for k, v in theirs["per_caption"].items():
        assert ours["per_caption_CIDEr-D"][k] == pytest.approx(v, abs=1e-6)
    assert any("<unk>" in " ".join(v) for v in tokenize_for_eval(res).values())


def test_punctuation_filter_is_the_toolkits():
    import pycocoevalcap.tokenizer.ptbtokenizer as tk

    assert PUNCTUATIONS == frozenset(tk.PUNCTUATIONS)
