"""The page edges a new user met (issue 66), each in Chromium with a screenshot in docs/img:
heatmap ticks on the cells they name, row labels whole, a colour scale; chart legends with
figures before any hover; times to the second; no page wider than the window."""

from __future__ import annotations

import json
import re

from tests.dashboards.test_pages import api, fleet_db  # noqa: F401  (the same served fleet)


def _no_page_overflow(p) -> None:
    assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "the page runs off the window"


def test_heatmap_ticks_sit_on_the_cells_they_name_labels_are_whole_and_a_scale_reads_the_colours(page, api) -> None:  # noqa: F811
    p = page.open(api + "/ui?range=all")
    cv = p.locator(".heat canvas")
    assert cv.get_attribute("data-cut") == "0"  # every row label whole (they were cut at 38 characters)
    ticks = json.loads(cv.get_attribute("data-ticks"))
    assert len(ticks) >= 4  # more than the two ends
    box, left = cv.bounding_box(), int(cv.get_attribute("data-left"))
    for t in ticks:  # the cell just right of a tick is the time the tick says
        p.mouse.move(box["x"] + left + t["x"] + 2, box["y"] + 10)
        assert t["time"] in p.inner_text(".tip"), (t, p.inner_text(".tip"))
    scale = p.locator('[data-scale="utilisation"]')
    assert "0 %" in scale.inner_text() and "100 %" in scale.inner_text()
    grad = p.eval_on_selector(".scalebar", "e => getComputedStyle(e).backgroundImage")
    assert grad.startswith("linear-gradient") and grad.count("rgb(") == 11
    _no_page_overflow(p)
    page.shot("heatmap-edges", docs=True)
    assert page.problems == []


def test_chart_legends_show_figures_before_a_hover_and_times_read_to_the_second(page, api) -> None:  # noqa: F811
    p = page.open(api + "/ui/jobs/sim-ps-5?range=all")
    p.wait_for_selector(".uplot")
    values = p.eval_on_selector_all(".u-legend .u-series:not(:first-child) .u-value", "els => els.map(e => e.textContent)")
    assert values and "--" not in values, values  # they read "--" until hovered
    _no_page_overflow(p)
    page.shot("job-legends", docs=True)
    p = page.open(api + "/ui/findings?range=all")
    text = p.inner_text("main")
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d → \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
    assert not re.search(r"\d\dT\d\d:|\d\d:\d\d:\d\d\.\d", text)  # no ISO 'T', no microseconds
    _no_page_overflow(p)
    assert page.problems == []
