"""`ltd compare`: two models on the same split, the CLI twin of the UI's Explorer.

- default: the per-query disagreement table (indexer/disagreement.py), markdown, optionally CSV;
- ``--words``: the words each model uses and the other ignores over the whole split (every caption's
  words removed in turn, search/word_usage.py; cached next to each index): two tables and a plot;
- ``--html OUT``: a self-contained report of a set of queries (both rankings with inlined thumbnails,
  word attributions, metrics) to send to someone (ui/report.py).
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from training.errors import UserValueError

log = logging.getLogger("ltd.compare")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser("compare", parents=[common],
                       help="two models on the same split: per-query disagreement, the words each uses, an HTML report")
    c.add_argument("--index", action="append", required=True, help="two index directories: A then B")
    c.add_argument("--top", type=int, default=20, help="rows in the markdown tables")
    c.add_argument("--direction", choices=("both", "t2i", "i2t"), default="both")
    c.add_argument("--no-relevance", action="store_true", help="skip nDCG (no ROUGE-L computation)")
    c.add_argument("--csv", help="also write every row to this CSV file")
    c.add_argument("--words", action="store_true",
                   help="the words each model uses and the other ignores over the split (a table and --plot)")
    c.add_argument("--min-count", type=int, default=5, help="--words: words seen at least this often (default 5)")
    c.add_argument("--plot", default="words.png", help="--words: where the plot goes (default words.png)")
    c.add_argument("--html", metavar="OUT", help="write a self-contained HTML report of a set of queries")
    c.add_argument("--query", action="append", default=[], help="--html: a free-text query (repeatable)")
    c.add_argument("--caption-id", action="append", type=int, default=[],
                   help="--html: a dataset caption id (repeatable); default: the --n most disputed captions")
    c.add_argument("--n", type=int, default=6, help="--html: how many disputed captions without --query/--caption-id")
    c.add_argument("--k", type=int, default=8, help="--html: results per model and query (default 8)")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=cmd_compare)


def _names(paths: list[str]) -> dict[str, str]:
    """{model name: index dir}: the folders' names, made distinct."""
    a, b = (Path(p).resolve().name or "A" for p in paths)
    if a == b:
        a, b = f"A_{a}", f"B_{b}"
    return {a: paths[0], b: paths[1]}


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.index) != 2:
        raise UserValueError("compare needs exactly two --index arguments (A then B)")
    if not (args.words or args.html):
        return _disagreement(args)
    from search import SearchError, SearchService

    models = _names(args.index)
    svc = SearchService(models)
    svc.registry.load()
    try:
        a, b = list(models)
        usage = _words(svc, a, b, args) if args.words else None
        if args.html:
            _report(svc, a, b, usage, args)
    except SearchError as e:
        raise UserValueError(e.detail) from None
    finally:
        svc.close()
    return 0


def _disagreement(args: argparse.Namespace) -> int:
    from indexer.disagreement import compare_indexes, to_csv, to_markdown
    from indexer.index import load_index_dir
    from training.fsio import atomic_write_text

    a, b = (load_index_dir(p) for p in args.index)
    dirs = ("t2i", "i2t") if args.direction == "both" else (args.direction,)
    rows = compare_indexes(a, b, relevance=not args.no_relevance, directions=dirs)
    if args.csv:
        atomic_write_text(args.csv, to_csv(rows))
    print(to_markdown(rows, a.name, b.name, top=args.top))
    return 0


def _words(svc, a: str, b: str, args: argparse.Namespace):
    from search.word_usage import usage_markdown
    from training.plots import save_png

    t0 = time.perf_counter()
    u = svc.explainer.word_usage(a, b, min_count=args.min_count)
    log.info("word usage of %s and %s: %.1f s (%d occurrences in %d captions)", a, b, time.perf_counter() - t0,
             u.occurrences, u.captions)
    print(usage_markdown(u, top=args.top))
    if args.plot:
        print(f"wrote {save_png(usage_figure(u), Path(args.plot))}")
    return u


def usage_figure(u, label: int = 8):
    """Each word as a point: how far removing it moves the caption's image under A (x) and under B (y),
    as the mean |log2 rank ratio|; above the diagonal B uses it more. Size: how often it occurs. The
    surest differences each way are named."""
    import numpy as np

    from training.plots import plt

    fig, ax = plt.subplots(figsize=(7.2, 6.6))
    x = np.array([w.a_moves for w in u.words])
    y = np.array([w.b_moves for w in u.words])
    n = np.array([w.n for w in u.words])
    shown = np.array([w.shown for w in u.words], dtype=bool)
    top = float(max(x.max(initial=0), y.max(initial=0))) * 1.05 or 1.0
    ax.plot([0, top], [0, top], color="#94a3b8", lw=1, ls="--", zorder=1)
    size = 8 + 30 * np.log10(np.maximum(n, 1))
    ax.scatter(x[~shown], y[~shown], s=size[~shown], color="#cbd5e1", label="gap's 95% CI includes 0", zorder=2)
    for more, color, who in ((y > x, "#0891b2", u.b), (y <= x, "#4f46e5", u.a)):
        m = shown & more
        ax.scatter(x[m], y[m], s=size[m], color=color, label=f"{who} uses it more (95% CI clustered by image)",
                   zorder=3)
    for w in [*u.b_uses(label), *u.a_uses(label)]:
        ax.annotate(w.word, (w.a_moves, w.b_moves), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(f"how far removing the word moves the caption's image under {u.a}\n(mean |log2 rank ratio|)")
    ax.set_ylabel(f"… under {u.b}")
    ax.set_title(f"Each word: how much {u.a} (x) and {u.b} (y) use it\n{len(u.words)} words seen ≥ {u.min_count}× "
                 f"in {u.captions:,} captions; the surest differences named", fontsize=10)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _report(svc, a: str, b: str, usage, args: argparse.Namespace) -> None:
    from training.fsio import atomic_write_text
    from ui.report import report_html

    queries = [{"query": q} for q in args.query] + [{"caption_id": c} for c in args.caption_id]
    if not queries:
        rows = svc.explorer(a, b, direction="t2i", limit=max(1, args.n))
        queries = [{"caption_id": int(r["query_id"])} for r in rows]
    html = report_html(svc, a, b, queries, k=args.k, usage=usage, top=min(args.top, 15))
    atomic_write_text(args.html, html)
    print(f"wrote {args.html} ({len(html.encode()) / 1e6:.1f} MB, {len(queries)} queries)")
