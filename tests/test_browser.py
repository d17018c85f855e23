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
