"""Issue 55's acceptance test of the UI, in a real browser: `ltd serve --writable` in a subprocess over
copies of the tiny pair, headless Chromium driven by Playwright. It adds a photo by dropping it on the
page, filters by the metadata it was given, clicks "more like this" on its card and removes it from
its result card — then checks over REST that it is gone. Screenshots go to the test's temporary folder
(the path is printed) for a person to look at.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import urllib.parse
import urllib.request

import numpy as np
import pytest
from PIL import Image
from test_browser import CHROMIUM, FLAGS, _loaded_images

from bench import _server as live
from indexer import image_roots
from indexer.index import read_manifest

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ALBUM = "browser-album"


def _png(path, seed: int = 7, size: int = 96) -> None:
    rng = np.random.default_rng(seed)
    img = np.zeros((size, size, 3), np.uint8)
    img[:, :] = (220, 40, 40)
    img[size // 4: 3 * size // 4, size // 4: 3 * size // 4] = rng.integers(0, 255, 3)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    path.write_bytes(buf.getvalue())


@pytest.fixture(scope="module")
def server(tiny_index_pair, tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("needs Chromium at /usr/bin/chromium or on PATH (`make browser-deps` installs it)")
    pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("living_ui")
    args = []
    for name in ("bl", "ltd"):
        index = shutil.copytree(tiny_index_pair[name], root / name)
        image_roots.record(index, read_manifest(index)["image_roots"])  # as `ltd index` would have
        args += ["--model", f"{name}={index}"]
    with live.serving([*args, "--writable"], root / "serve.log") as (_, base):
        if live.status(base + "/ui/") != 200:
            pytest.fail("`ltd serve` answers /api/health but does not serve the UI at /ui/")
        yield base


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    d = tmp_path_factory.mktemp("screenshots")
    print(f"\nscreenshots: {d}")
    return d


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1100})
        pg.set_default_timeout(30_000)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("dialog", lambda d: d.accept())  # "remove" asks first
        pg.goto(server + "/ui/", wait_until="load")
        pg.wait_for_selector(".ltd-chip b", timeout=60_000)  # the header once models are ready
        pg.errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_compare_within_a_filter_and_a_link_that_pins_the_index(page, server, shots):
    """Before any write: the other tests' writes would change what the Explorer's slice holds."""
    pg = page.context.browser.new_page(viewport={"width": 1400, "height": 1100})
    pg.set_default_timeout(30_000)
    first = json.loads(urllib.request.urlopen(f"{server}/api/models/bl/items?limit=1", timeout=10).read())["items"][0]
    cap = first["captions"][0]
    word = max(cap["text"].split(), key=len).strip(".,").lower()
    flt = {"text": word}
    query = urllib.parse.urlencode({"filter": json.dumps(flt), "limit": 1000})
    keep = {str(it["id"]) for it in json.loads(urllib.request.urlopen(f"{server}/api/models/bl/items?{query}").read())["items"]}
    link = urllib.parse.urlencode({"tab": "compare", "a": "bl", "b": "ltd", "k": 5, "cid": cap["id"],
                                   "f": json.dumps(flt), "ga": "99.0", "gb": "99.0"})
    pg.goto(f"{server}/ui/?{link}", wait_until="load")
    pg.wait_for_selector("#compare-results .ltd-col .ltd-card", timeout=60_000)
    shown = {c.get_attribute("data-image-id") for c in pg.locator("#compare-results .ltd-card").all()}
    assert shown and shown <= keep  # both columns within the slice
    assert f'words "{word}"' in pg.locator("#filter-status").inner_text()
    note = pg.locator("#ltd-pin .ltd-warn").inner_text()
    assert "another state of the index" in note and "generation 99" in note  # the link pinned another generation
    pg.wait_for_function("() => location.search.includes('f=') && !location.search.includes('ga=99.0')")
    pg.screenshot(path=str(shots / "0_compare_slice_pinned.png"), full_page=True)
    pg.get_by_role("tab", name="Explorer", exact=True).click()
    pg.wait_for_selector("#explorer-summary .ltd-explorer-sum", timeout=60_000)
    assert "in the slice" in pg.locator("#explorer-summary").inner_text()
    pg.screenshot(path=str(shots / "0_explorer_slice.png"), full_page=True)
    pg.close()


def test_add_filter_more_like_this_and_remove(page, server, shots, tmp_path):
    photo = tmp_path / "red-square.png"
    _png(photo)
    # 1. add a photo by dropping it on the page, with metadata
    page.get_by_role("tab", name="Search", exact=True).click()
    page.fill("#add-metadata textarea", json.dumps({"album": ALBUM}))
    page.set_input_files("#add-files input[type=file]", str(photo))
    page.wait_for_selector("#add-results .ltd-card", timeout=60_000)
    assert "Added 1 photo to model bl" in page.locator("#add-results").inner_text()
    iid = page.locator("#add-results .ltd-card").first.get_attribute("data-image-id")
    assert _loaded_images(page, "#add-results .ltd-card img", 1) == 1  # its thumbnail is served
    item = json.loads(urllib.request.urlopen(f"{server}/api/models/bl/items/{iid}", timeout=10).read())
    assert item["metadata"]["album"] == ALBUM and item["filename"] == "red-square.png"
    page.screenshot(path=str(shots / "1_added.png"), full_page=True)

    # 2. filter by its album: the chip is there at once; a text search then finds only it
    page.click("#filter-chips input")
    page.keyboard.type(ALBUM)
    page.get_by_role("option", name=f"album: {ALBUM} · 1").click()
    page.wait_for_function("() => document.querySelector('#filter-status').textContent.includes('album = " + ALBUM + "')")
    assert "1 of" in page.locator("#filter-status").inner_text()
    page.fill("#search-text textarea", "a red square")
    page.press("#search-text textarea", "Enter")
    page.wait_for_selector(f"#search-text-results .ltd-card[data-image-id='{iid}']")
    assert page.locator("#search-text-results .ltd-card").count() == 1  # k = 10, one item matches
    page.screenshot(path=str(shots / "2_filtered.png"), full_page=True)

    # 3. "more like this" on its card: image → images, itself first, still within the filter
    page.click(f"#search-text-results .ltd-card[data-image-id='{iid}'] .ltd-act-similar")
    page.wait_for_selector(f"#search-image-results .ltd-card[data-image-id='{iid}']")
    assert page.locator("#search-image-results .ltd-card").first.get_attribute("data-image-id") == iid
    assert page.locator("#search-image-results .ltd-card").count() == 1
    page.click("#filter-clear")  # without the filter: the whole index, itself still first
    page.wait_for_function("() => document.querySelectorAll('#search-image-results .ltd-card').length > 1")
    assert page.locator("#search-image-results .ltd-card").first.get_attribute("data-image-id") == iid
    assert _loaded_images(page, "#search-image-results .ltd-card img", 2) >= 2
    page.screenshot(path=str(shots / "3_more_like_this.png"), full_page=True)

    # 4. remove it from its result card (text → images, no filter): gone from the page and every route
    page.get_by_label("Text → images", exact=True).check()
    page.press("#search-text textarea", "Enter")
    page.wait_for_selector(f"#search-text-results .ltd-card[data-image-id='{iid}']")
    n = page.locator("#search-text-results .ltd-card").count()
    page.click(f"#search-text-results .ltd-card[data-image-id='{iid}'] .ltd-act-remove")
    page.wait_for_function("() => document.querySelector('#search-text-results').textContent.includes('Removed image')")
    assert page.locator(f"#search-text-results .ltd-card[data-image-id='{iid}']").count() == 0
    assert page.locator("#search-text-results .ltd-card").count() == n - 1
    page.screenshot(path=str(shots / "4_removed.png"), full_page=True)
    assert _status(f"{server}/api/models/bl/items/{iid}") == 404
    assert _status(f"{server}/api/images/{iid}/thumbnail?model=bl") == 404
    page.click("#filter-chips input")  # the album's chip went with its only photo
    assert page.get_by_role("option", name=f"album: {ALBUM} · 1").count() == 0
    page.keyboard.press("Escape")
    assert not page.errors, page.errors  # type: ignore[attr-defined]


def test_several_photos_at_once_and_a_date_range(page, server, shots, tmp_path):
    """Two photos dropped at once, one re-dated over REST; a date range from the filter bar keeps only
    the one inside it, in the search that follows."""
    photos = []
    for seed in (11, 12):
        photos.append(tmp_path / f"dated-{seed}.png")
        _png(photos[-1], seed=seed)
    page.get_by_role("tab", name="Search", exact=True).click()
    page.fill("#add-metadata textarea", json.dumps({"album": "dated", "taken": "2020-05-01"}))
    page.set_input_files("#add-files input[type=file]", [str(p) for p in photos])
    page.wait_for_function("() => document.querySelectorAll('#add-results .ltd-card').length == 2", timeout=60_000)
    assert "Added 2 photos to model bl" in page.locator("#add-results").inner_text()
    live = json.loads(urllib.request.urlopen(f"{server}/api/models/bl/items?limit=1", timeout=10).read())["total"]
    page.wait_for_function(f"() => document.querySelector('#ltd-header').textContent.includes('{live} images')")
    ids = [c.get_attribute("data-image-id") for c in page.locator("#add-results .ltd-card").all()]
    req = urllib.request.Request(f"{server}/api/models/bl/items/{ids[1]}", method="PATCH",
                                 data=json.dumps({"metadata": {"album": "dated", "taken": "2023-03-01"}}).encode(),
                                 headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(req, timeout=10).status == 200
    page.click("#filter-range-field input")
    page.get_by_role("option", name=re.compile(r"^taken \(dates")).click()
    page.locator("#filter-from").locator("textarea, input").first.fill("2022-01-01")
    to = page.locator("#filter-to").locator("textarea, input").first
    to.fill("2023-12-31")
    to.press("Enter")
    page.wait_for_function("() => document.querySelector('#filter-status').textContent.includes('taken')")
    page.fill("#search-text textarea", "a red square")
    page.press("#search-text textarea", "Enter")
    page.wait_for_selector(f"#search-text-results .ltd-card[data-image-id='{ids[1]}']")
    shown = [c.get_attribute("data-image-id") for c in page.locator("#search-text-results .ltd-card").all()]
    assert shown == [ids[1]]  # the 2020 photo and every undated item are outside the range
    page.screenshot(path=str(shots / "5_date_range.png"), full_page=True)
    page.click("#filter-clear")
    assert not page.errors, page.errors  # type: ignore[attr-defined]
