"""bench/_common.replace_section: the benchmark scripts rewrite only their own BENCHMARKS.md section."""
from bench._common import publish, replace_section

DOC = "# Benchmarks\n\n## A (a.py)\n\nold a\n\n### sub\n\nold sub\n\n## B (b.py)\n\nkeep b\n"


def test_replaces_only_its_section_including_subsections(tmp_path):
    p = tmp_path / "BENCHMARKS.md"
    p.write_text(DOC)
    replace_section("## A (a.py)", "## A (a.py)\n\nnew a\n", p)
    assert p.read_text() == "# Benchmarks\n\n## A (a.py)\n\nnew a\n\n## B (b.py)\n\nkeep b\n"


def test_last_section_and_append(tmp_path):
    p = tmp_path / "BENCHMARKS.md"
    p.write_text(DOC)
    replace_section("## B (b.py)", "## B (b.py)\n\nnew b", p)
    assert p.read_text().endswith("## B (b.py)\n\nnew b\n") and "keep b" not in p.read_text()
    replace_section("## C (c.py)", "## C (c.py)\n\nc", p)
    text = p.read_text()
    assert text.endswith("new b\n\n## C (c.py)\n\nc\n") and "old a" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_heading_prefix_is_not_matched(tmp_path):
    p = tmp_path / "BENCHMARKS.md"
    p.write_text("# Benchmarks\n\n## A (a.py) extended\n\nother\n")
    replace_section("## A (a.py)", "## A (a.py)\n\nmine", p)
    assert "other" in p.read_text() and p.read_text().endswith("## A (a.py)\n\nmine\n")


def test_publish_prints_and_writes_only_with_write(tmp_path, capsys):
    p = tmp_path / "BENCHMARKS.md"
    p.write_text(DOC)
    publish("## A (a.py)", "## A (a.py)\n\nprinted only", False, p)
    assert capsys.readouterr().out == "## A (a.py)\n\nprinted only\n" and p.read_text() == DOC
    publish("## A (a.py)", "## A (a.py)\n\nwritten", True, p)
    assert "written" in capsys.readouterr().out and "## A (a.py)\n\nwritten\n\n## B" in p.read_text()
