"""Issues 43 (item 3) and 50 (page item 7): calibration on the real page (Chromium, the default model on llama.cpp).
While it runs, the summary's place says what it does, with one count over all its phases that only moves forward (it
jumped from "timing trees 12/19" to "13/13", stuck there while the fixed shapes were timed unsaid, then "choosing the
tree 0/1") and the time left; then the new summary, with no progress text left over it and no speedup figure on its
line (the readout's is the page's one); and the latency plot keeps its legend inside it and marks the point chosen on
the plot itself: the corner of a line across from its latency and down to its size, on the curve."""

import re

import pytest

from app.history import ConversationStore
from app.model_host import ModelHost
from app.ui import build_app
from page_lines import inside, shown_lines
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

pytestmark = pytest.mark.slow

NUMBERED = re.compile(r"^\s*Calibrating: [a-z' ]+ \d+/\d+(, about \d+ (s|min) left)?…\s*$")  # the whole text
COUNT = re.compile(r"Calibrating: ([a-z' ]+) (\d+)/(\d+)")
LINES = """() => { window.lines = []; const summary = document.querySelector('#calibration');
    new MutationObserver(() => window.lines.push(summary.innerText))
        .observe(summary, {subtree: true, childList: true, characterData: true}); }"""  # every text it shows
POINTS = re.compile(r"(-?[\d.]+),(-?[\d.]+)")


@pytest.fixture(scope="module")
def calibrating_app(tmp_path_factory):
    """The app on the default model on llama.cpp with a quick calibration (as tests/test_ui.py's); the profile it saves
    goes to a data folder of this module's (later tests expect none for the default model in the suite's)."""
    folders = pytest.MonkeyPatch()
    folders.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("calibration-data")))
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium", threads=2))
    service = ModelHost(engine, calibration_options=dict(prompts=2, max_new_tokens=24, contexts=(128,), repeats=1))
    app, port = build_app(service, ConversationStore(tmp_path_factory.mktemp("conversations"))), free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/", service
    app.close()
    service.shutdown()
    folders.undo()


def test_calibration_shows_numbered_progress_in_place_of_the_summary_then_a_readable_plot(calibrating_app, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, service = calibrating_app
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(url)
        summary, curve = page.locator("#calibration"), page.locator("#latency-curve")
        page.get_by_text("Calibration", exact=True).click()
        expect(summary).to_contain_text("Not calibrated yet", timeout=60_000)
        page.evaluate(LINES)
        page.locator("#calibrate").click()
        # what it does, counted, where the summary was: the old summary gone, no other text over it
        expect(summary).to_have_text(NUMBERED, timeout=30_000)
        assert shown_lines(summary) <= 2, summary.inner_text()
        expect(summary).to_contain_text("Calibrated for this device", timeout=900_000)  # slow on a busy machine
        text = summary.inner_text().strip()
        assert text.startswith("Calibrated for this device") and "Calibrating" not in text and "processing" not in text
        assert not re.search(r"\d\.\d\dx", text), text  # no speedup figure on the line; Details names the forecasts
        assert shown_lines(summary.locator("p").first) <= 2, text  # the rest behind the Details toggle
        page.screenshot(path=str(tmp_path / "calibrated.png"), full_page=True)
        counted = [COUNT.search(line) for line in page.evaluate("window.lines") if "Calibrating:" in line]
        counts = [(found.group(1), int(found.group(2)), int(found.group(3))) for found in counted if found]
        assert len({total for _, _, total in counts}) == 1, counts  # one count over every phase
        assert [done for _, done, _ in counts] == sorted(done for _, done, _ in counts), counts  # only forward
        assert len({phase for phase, _, _ in counts}) >= 2, counts  # across phases
        assert any("left…" in line for line in page.evaluate("window.lines")), page.evaluate("window.lines")

        profile = service.engine.plan.profile
        legend = curve.locator("svg g.role-legend").first
        expect(legend).to_be_visible(timeout=30_000)
        assert inside(legend, curve)  # the legend wholly inside the plot's element
        labels = [text.strip() for text in curve.locator("svg g.role-legend-label text").all_text_contents()]
        # the tree size calibration chose: a line of its own, named whole in the legend (Vega ends a cut label in "…")
        assert any(re.fullmatch(rf"chosen: {profile.budget} tokens?, \d+ ms", label) for label in labels), labels
        assert all("…" not in label for label in labels), labels
        lines = curve.locator("svg g.mark-line path")  # one per series, each drawn (a one-point line has no length)
        assert lines.count() == len(labels) and all(
            line.evaluate("path => path.getTotalLength()") > 5 for line in lines.all()), lines.count()
        assert chosen_corner_on_the_curve([line.get_attribute("d") for line in lines.all()])
        browser.close()


def chosen_corner_on_the_curve(paths: list[str]) -> bool:
    """The chosen series is three points, across then down (a corner); the corner lies on another series' line (the
    curve), within 2 px."""
    drawn = [[(float(x), float(y)) for x, y in POINTS.findall(path)] for path in paths]
    corners = [points[1] for points in drawn if len(points) == 3 and abs(points[0][1] - points[1][1]) < 0.5
               and abs(points[1][0] - points[2][0]) < 0.5]
    assert len(corners) == 1, drawn
    (x, y), curves = corners[0], [points for points in drawn if len(points) != 3 or points[1] not in corners]
    for points in curves:
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if min(x0, x1) - 0.5 <= x <= max(x0, x1) + 0.5:
                at = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                if abs(at - y) <= 2:
                    return True
    return False
