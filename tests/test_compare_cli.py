"""`ltd compare --words` and `ltd compare --html` (app/cli/compare.py, ui/report.py) on the two tiny models."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from app.cli import main

# every test here uses the session's trained models (tests/conftest.py marks them; this keeps the fast
# tier from importing the module at all)
pytestmark = [pytest.mark.slow, pytest.mark.training]


class _Refs(HTMLParser):
    """Every URL the page would load (src/href) and every tag name."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.urls += [v or "" for k, v in attrs if k in ("src", "href")]


def test_words_table_and_plot(tiny_index_pair, tmp_path, capsys):
    plot = tmp_path / "w.png"
    assert main(["compare", "--index", str(tiny_index_pair["bl"]), "--index", str(tiny_index_pair["ltd"]), "--words",
                 "--min-count", "2", "--plot", str(plot), "--top", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "### Words ltd uses and bl ignores" in out and "### Words bl uses and ltd ignores" in out
    assert len(re.findall(r"^\| \w+ \| \d+ \| \d+ \| \d\.\d\d \| \d\.\d\d \| [-+]\d\.\d\d ", out, flags=re.M)) >= 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*tmp*"))


def test_html_report_is_self_contained_and_escaped(tiny_index_pair, tmp_path, capsys):
    out = tmp_path / "report.html"
    hostile = '<script>alert("x")</script> a red circle'
    assert main(["compare", "--index", str(tiny_index_pair["bl"]), "--index", str(tiny_index_pair["ltd"]),
                 "--html", str(out), "--query", hostile, "--n", "2", "--k", "3", "--words", "--min-count", "2",
                 "--plot", str(tmp_path / "w.png"), "--no-progress"]) == 0
    html = out.read_text()
    refs = _Refs()
    refs.feed(html)
    assert "script" not in refs.tags and "&lt;script&gt;" in html
    assert refs.urls and all(u.startswith("data:image/jpeg;base64,") or u == "#" for u in refs.urls), refs.urls[:5]
    assert html.count('<section class="ltd-report-q"><h2>Query') == 1  # --query given: only it
    assert html.count('class="ltd-attr"') == 1 and "Words over the whole split" in html
    assert "rsum" in html and html.count('<section class="ltd-col">') == 2


def test_html_report_defaults_to_the_most_disputed_captions(tiny_index_pair, tmp_path):
    out = tmp_path / "r.html"
    assert main(["compare", "--index", str(tiny_index_pair["bl"]), "--index", str(tiny_index_pair["ltd"]),
                 "--html", str(out), "--n", "2", "--k", "2"]) == 0
    html = out.read_text()
    assert html.count("<h2>Query") == 2 and html.count("dataset caption #") == 2


def test_report_of_an_unknown_caption_says_so(tiny_index_pair, tmp_path):
    out = tmp_path / "r.html"
    assert main(["compare", "--index", str(tiny_index_pair["bl"]), "--index", str(tiny_index_pair["ltd"]),
                 "--html", str(out), "--caption-id", "999999999"]) == 0
    assert "is not in model" in out.read_text()


def test_user_mistakes_are_one_line_and_exit_2(tiny_index_pair, tmp_path, capsys):
    """A wrong --index count or a folder that is not an index: exit 2 and one line saying what to fix,
    never a traceback (training.errors.UserError at the CLI's boundary)."""
    bl = str(tiny_index_pair["bl"])
    cases = [(["--index", bl], "exactly two --index"),
             (["--index", bl, "--index", str(tmp_path), "--words", "--no-progress"], "not an index directory"),
             (["--index", bl, "--index", str(tmp_path / "nope"), "--html", str(tmp_path / "r.html")],
              "not an index directory")]
    for args, message in cases:
        assert main(["compare", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and "internal error" not in err, err
    assert not (tmp_path / "r.html").exists()
