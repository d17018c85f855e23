"""The UI in a real browser: `ltd serve` in a subprocess, headless Chromium driven by Playwright.

Runs a text search and a compare (and opens an Explorer row and the Training tab), checks that the
result images really load and that both compare columns render, and saves screenshots to
artifacts/screenshots/ for people to look at.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from bench import _server as live

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else shutil.which("chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tiny_index_pair, tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("needs Chromium at /usr/bin/chromium or on PATH (`make browser-deps` installs it)")
    pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install -e '.[test]')")
    logs = tmp_path_factory.mktemp("server")
    with live.serving(live.model_args(tiny_index_pair), logs / "serve.log") as (_, base):
        if live.status(base + "/ui/") != 200:
            pytest.fail("`ltd serve` answers /api/health but does not serve the UI at /ui/")
        yield base


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(30_000)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server + "/ui/", wait_until="load")
        pg.wait_for_selector(".ltd-chip b", timeout=60_000)  # the header once models are ready
        pg.errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _loaded_images(pg, selector: str, expected: int, timeout_s: float = 20) -> int:
    """How many <img> under ``selector`` have loaded (naturalWidth > 0), waiting for ``expected``."""
    js = f"""() => Array.from(document.querySelectorAll({selector!r}))
                 .filter(i => i.complete && i.naturalWidth > 0).length"""
    deadline = time.time() + timeout_s
    n = 0
    while time.time() < deadline:
        n = pg.evaluate(js)
        if n >= expected:
            break
        time.sleep(0.25)
    return n


def test_text_search_renders_images(page):
    page.get_by_role("tab", name="Search", exact=True).click()
    page.click("#search-random")
    page.wait_for_selector("#search-text-results .ltd-card img")
    cards = page.locator("#search-text-results .ltd-card").count()
    assert cards >= 5  # the tiny test split has 6 images, k = 10
    assert _loaded_images(page, "#search-text-results .ltd-card img", cards) == cards
    # a dataset caption: exactly one ground-truth image, outlined and marked
    assert page.locator("#search-text-results .ltd-card.gt").count() == 1
    assert page.locator("#search-text-results .ltd-card.gt .ltd-badge").inner_text() == "✓"
    assert "1st GT rank" in page.locator("#search-text-results .ltd-metrics").inner_text()
    page.screenshot(path=str(SHOTS / "search_text.png"), full_page=True)


def test_image_search_renders_captions(page):
    page.get_by_role("tab", name="Search", exact=True).click()
    page.get_by_label("Image → captions", exact=True).check()
    page.locator("#search-gallery img").first.click()
    page.wait_for_selector("#search-image-results .ltd-cap")
    assert page.locator("#search-image-results .ltd-cap").count() == 10
    assert page.locator("#search-image-results .ltd-cap.gt").count() >= 1
    assert _loaded_images(page, "#search-image-results .ltd-qimg", 1) == 1
    page.screenshot(path=str(SHOTS / "search_image.png"), full_page=True)


def test_compare_renders_both_columns(page):
    page.get_by_role("tab", name="Compare", exact=True).click()
    page.click("#compare-random")
    page.wait_for_selector("#compare-results .ltd-col .ltd-card img")
    heads = page.locator("#compare-results .ltd-col-head h3").all_inner_texts()
    assert heads == ["bl", "ltd"]
    cards = page.locator("#compare-results .ltd-col .ltd-card").count()
    assert cards >= 10  # two columns of 5+ images
    assert _loaded_images(page, "#compare-results .ltd-col .ltd-card img", cards) == cards
    assert page.locator("#compare-results .ltd-col:nth-child(1) .ltd-card.gt").count() == 1
    assert page.locator("#compare-results .ltd-col:nth-child(2) .ltd-card.gt").count() == 1
    assert "shared" in page.locator("#compare-results .ltd-overlap").inner_text()
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)


def test_explorer_row_opens_compare(page):
    page.get_by_role("tab", name="Explorer", exact=True).click()
    page.wait_for_selector("#explorer-summary .ltd-explorer-sum")
    page.wait_for_selector('#explorer-table [data-testid="cell-0-2"]')
    page.screenshot(path=str(SHOTS / "explorer.png"), full_page=True)
    direction = page.locator('#explorer-table [data-testid="cell-0-0"]').inner_text().strip()
    query_id = page.locator('#explorer-table [data-testid="cell-0-1"]').inner_text().strip()
    page.locator('#explorer-table [data-testid="cell-0-2"]').click()
    page.wait_for_selector("#compare-results .ltd-col", state="visible")
    page.wait_for_function("() => document.querySelector('#compare-results .ltd-tag') && "
                           f"document.querySelector('#compare-results .ltd-tag').textContent.includes('#{query_id}')")
    tag = page.locator("#compare-results .ltd-query .ltd-tag").first.inner_text()
    assert ("dataset image" if direction == "i2t" else "dataset caption") in tag
    assert page.locator("#compare-results .ltd-col").count() == 2
    page.screenshot(path=str(SHOTS / "explorer_to_compare.png"), full_page=True)


def test_training_tab_shows_report_and_curves(page):
    page.get_by_role("tab", name="Training", exact=True).click()
    page.wait_for_selector("#training-plot img", timeout=30_000)
    assert "rsum" in page.locator("#training-report").inner_text()
    page.screenshot(path=str(SHOTS / "training.png"), full_page=True)
    assert not page.errors, page.errors  # type: ignore[attr-defined]


def test_api_docs_render_offline(page, server):
    """/docs and /redoc load their scripts from the server itself: with every request to another host
    blocked (as on an offline machine), the operations are listed."""
    ctx = page.context.browser.new_context(viewport={"width": 1300, "height": 900})
    blocked: list[str] = []

    def offline(route):
        if route.request.url.startswith(server):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    ctx.route("**/*", offline)
    pg = ctx.new_page()
    pg.goto(server + "/docs", wait_until="load")
    pg.wait_for_selector(".opblock", timeout=30_000)
    ops = pg.locator(".opblock-summary-path").all_inner_texts()
    assert {"/api/search/text", "/api/search/image", "/api/compare", "/api/health"} <= {o.strip() for o in ops}
    pg.screenshot(path=str(SHOTS / "docs_offline.png"))
    assert blocked == []  # Swagger UI did not even try another host
    pg.goto(server + "/redoc", wait_until="load")
    pg.get_by_text("/api/search/text").first.wait_for(timeout=30_000)
    # ReDoc's bundle links its maker's logo from their site: the one outside request, and decorative
    assert all(u.startswith("https://cdn.redoc.ly/") and u.endswith("logo-mini.svg") for u in blocked), blocked
    ctx.close()


# ---- explanations and shared links (issue 40) ------------------------------------------------------
def _caption_id(tiny_index_pair) -> int:
    from indexer.index import load_index_dir

    ix = load_index_dir(tiny_index_pair["bl"], verify="counts")
    return next(int(i) for i, t in zip(ix.captions.ids, ix.captions.meta["texts"]) if len(t.split()) >= 5)


def _new_page(page):
    """A fresh page in its own context (a new visitor following a link)."""
    pg = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(30_000)
    return pg


def _compare_state(pg) -> dict:
    return {"heads": pg.locator("#compare-results .ltd-col-head h3").all_inner_texts(),
            "tag": pg.locator("#compare-results .ltd-query .ltd-tag").first.inner_text(),
            "cards": [c.get_attribute("data-image-id") for c in pg.locator("#compare-results .ltd-card").all()],
            "words": pg.locator("#compare-explain .ltd-w").all_inner_texts()}


def test_a_shared_url_reopens_the_same_comparison(page, server, tiny_index_pair):
    """A comparison made in the page is mirrored in its URL; that URL, opened in a new page, shows the
    same tab, models, query, k, rankings and word attributions."""
    cid = _caption_id(tiny_index_pair)
    pg = _new_page(page)
    pg.goto(f"{server}/ui/?tab=compare&a=ltd&b=bl&k=5&cid={cid}", wait_until="load")
    pg.wait_for_selector("#compare-explain .ltd-attr .ltd-w", timeout=60_000)
    first = _compare_state(pg)
    assert first["heads"] == ["ltd", "bl"] and f"#{cid}" in first["tag"] and len(first["cards"]) == 10
    assert pg.locator('#ltd-tabs button[role="tab"][aria-selected="true"]').inner_text().strip() == "Compare"
    pg.wait_for_function("() => location.search.includes('ex=')")  # the page wrote the explained image back
    shared = pg.url
    assert f"cid={cid}" in shared and "k=5" in shared and "a=ltd" in shared
    again = _new_page(page)
    again.goto(shared, wait_until="load")
    again.wait_for_selector("#compare-explain .ltd-attr .ltd-w", timeout=60_000)
    assert _compare_state(again) == first
    again.screenshot(path=str(SHOTS / "shared_url_compare.png"), full_page=True)
    again.close()
    pg.close()


def test_attribution_shading_and_a_clicked_image(page, server, tiny_index_pair):
    cid = _caption_id(tiny_index_pair)
    pg = _new_page(page)
    pg.goto(f"{server}/ui/?tab=compare&a=bl&b=ltd&k=5&cid={cid}", wait_until="load")
    pg.wait_for_selector("#compare-explain .ltd-attr .ltd-w", timeout=60_000)
    rows = pg.locator("#compare-explain .ltd-attr-row")
    assert rows.count() == 2
    n_words = rows.nth(0).locator(".ltd-w").count()
    assert n_words >= 5 and rows.nth(1).locator(".ltd-w").count() == n_words
    alphas = pg.evaluate("""() => Array.from(document.querySelectorAll('#compare-explain .ltd-w')).map(e =>
        parseFloat((getComputedStyle(e).backgroundColor.match(/rgba?\\(([^)]+)\\)/)[1].split(',')[3] || '1')))""")
    assert max(alphas) > 0.8 and len(set(round(a, 2) for a in alphas)) > 2  # shaded, and by degrees
    assert pg.locator("#compare-explain .ltd-attr-sum li").count() >= 1
    assert _loaded_images(pg, "#compare-explain .ltd-attr-img", 1) == 1
    pg.screenshot(path=str(SHOTS / "compare_attributions.png"), full_page=True)
    before = pg.locator("#compare-explain .ltd-attr-side .ltd-muted").inner_text()
    other = pg.locator("#compare-results .ltd-col:nth-child(1) .ltd-card:not(.gt)").first
    other_id = other.get_attribute("data-image-id")
    other.click()
    pg.wait_for_function(f"() => location.search.includes('ex={other_id}')", timeout=30_000)
    after = pg.locator("#compare-explain .ltd-attr-side .ltd-muted").inner_text()
    assert after != before and f"#{other_id}" in after and "picked from the results" in after
    pg.close()


def test_explorer_words_and_map_views_open_compare(page, server):
    pg = _new_page(page)
    pg.goto(f"{server}/ui/?tab=explorer&view=words", wait_until="load")
    pg.wait_for_selector("#explorer-words .ltd-wordrow", timeout=60_000)
    heads = pg.locator("#explorer-words .ltd-wordcol h4").all_inner_texts()
    assert heads == ["Words ltd uses and bl ignores", "Words bl uses and ltd ignores"]
    pg.screenshot(path=str(SHOTS / "explorer_words.png"), full_page=True)
    # a word's example queries start at one left edge (Gradio centres every <a> unless told otherwise)
    starts = pg.evaluate("""() => Array.from(document.querySelectorAll('#explorer-words .ltd-exs')).map(d =>
        Array.from(d.querySelectorAll('.ltd-ex')).map(a => { const r = document.createRange();
            r.selectNodeContents(a); return Math.round(r.getClientRects()[0].left); }))""")
    assert sum(len(xs) > 1 for xs in starts) >= 3 and all(len(set(xs)) == 1 for xs in starts), starts
    example = pg.locator("#explorer-words a.ltd-ex").first
    cid = example.get_attribute("data-cid")
    example.click()
    pg.wait_for_function(f"() => location.search.includes('cid={cid}')", timeout=30_000)
    pg.wait_for_selector("#compare-explain .ltd-attr", timeout=30_000)
    assert f"#{cid}" in pg.locator("#compare-results .ltd-query .ltd-tag").first.inner_text()
    pg.get_by_role("tab", name="Explorer", exact=True).click()
    pg.get_by_label("Map", exact=True).check()
    pg.wait_for_selector("#explorer-map svg circle", timeout=60_000)
    assert pg.locator("#explorer-map svg").count() == 2
    pg.wait_for_function("() => location.search.includes('view=map')")
    pg.screenshot(path=str(SHOTS / "explorer_map.png"), full_page=True)
    point = pg.locator("#explorer-map svg rect").first
    iid = point.get_attribute("data-iid")
    point.click(force=True)
    pg.wait_for_function(f"() => location.search.includes('img={iid}')", timeout=30_000)
    pg.wait_for_selector("#compare-results .ltd-col .ltd-cap")
    assert f"#{iid}" in pg.locator("#compare-results .ltd-query .ltd-tag").first.inner_text()
    assert not pg.locator("#compare-explain .ltd-attr").count()  # an image query has no words to shade
    pg.close()
