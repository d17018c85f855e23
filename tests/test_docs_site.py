"""The documentation site builds offline and strictly (a broken link, a page missing from the build, a
module mkdocstrings cannot collect all fail it), its generated references cover every command and route,
and the links of README, RESULTS, BENCHMARKS and the guides resolve both on GitHub and in the site."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
           if importlib.util.find_spec(m.split(".")[0]) is None
           or (m == "mkdocstrings_handlers.python" and importlib.util.find_spec(m) is None)]
needs_mkdocs = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed (the test extra "
                                  "installs mkdocs, mkdocs-material and mkdocstrings: pip install -e '.[test]')")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "RESULTS.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def test_relative_links_resolve_on_github():
    """Every relative link of the top-level documents and the guides names a file or folder that exists."""
    for page in _pages():
        for target in _LINK.findall(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.relative_to(ROOT)}: the link {target} names nothing"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    titles = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", t.strip().lower()).replace(" ", "-") for t in titles}


def test_anchors_resolve_on_github():
    """A link to a section (``#anchor``, ``OTHER.md#anchor``) names a heading that exists."""
    for page in _pages():
        for target in _LINK.findall(page.read_text()):
            if "#" not in target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, anchor = target.split("#", 1)
            doc = (page.parent / path).resolve() if path else page
            if doc.suffix == ".md":
                assert anchor in _anchors(doc), f"{page.relative_to(ROOT)}: {target} names no heading"


def test_readme_cli_at_a_glance_parses():
    """Every line of the README's CLI block is a command the parser accepts (options renamed since fail)."""
    import shlex

    from app.cli.parser import build_parser

    text = (ROOT / "README.md").read_text()
    block = text.split("## The CLI at a glance\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("  #")[0] for ln in block.splitlines() if ln.startswith("ltd ")]
    assert len(lines) >= 10
    parser = build_parser()[0]
    for line in lines:
        parser.parse_args(shlex.split(line)[1:])


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@needs_mkdocs
def test_site_links_are_rewritten_to_the_site_layout():
    hooks = _hooks()
    readme = "[guide](docs/guides/coco.md) [r](RESULTS.md#headline) [src](training/fsio.py) [log](docs/results/LOG.md)"
    assert hooks.site_links(readme, "", "") == (
        "[guide](guides/coco.md) [r](RESULTS.md#headline) src [log](results/LOG.md)")
    guide = "[b](../../BENCHMARKS.md) [d](distributed.md#speed) [readme](../../README.md#two-commands) [w](https://x.org)"
    assert hooks.site_links(guide, "docs/guides", "guides") == (
        "[b](../BENCHMARKS.md) [d](distributed.md#speed) [readme](../index.md#two-commands) [w](https://x.org)")
    grid = next(p for p in sorted((ROOT / "docs" / "results").iterdir()) if (p / "results.md").is_file())
    assert hooks.site_links(f"[g](docs/results/{grid.name}/)", "", "") == f"[g](results/{grid.name}/results.md)"


@needs_mkdocs
@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    from app.cli.parser import build_parser

    cli = (site / "reference" / "cli.html").read_text()
    hooks = _hooks()
    for name, _ in hooks._parsers(build_parser()[0], "ltd"):
        assert f"<code>{name}</code>" in cli, name
    rest = (site / "reference" / "rest.html").read_text()
    for path in hooks.openapi_schema()["paths"]:
        assert path in rest, path
    for module in ("training.loop", "indexer.metrics", "search", "app.api.main", "ui.app"):
        page = (site / "reference" / "python" / f"{module}.html").read_text()
        assert 'class="doc doc-' in page, f"{module}: mkdocstrings rendered nothing"
    for guide in (ROOT / "docs" / "guides").glob("*.md"):
        assert (site / "guides" / f"{guide.stem}.html").is_file(), guide.name
