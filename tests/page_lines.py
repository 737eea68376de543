"""How the real page lays text out, measured in the browser (Playwright): the lines an element's text wraps to, and
whether one element lies inside another (a plot's legend inside its plot)."""

from __future__ import annotations

# the distinct tops of the element's text fragments: one per line on the screen (a fragment's top can differ from
# another's on the same line by a pixel or two: inline marks, bold)
LINES_JS = """element => {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    const tops = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (!node.textContent.trim()) continue;
        const range = document.createRange();
        range.selectNodeContents(node);
        for (const rect of range.getClientRects()) if (rect.width > 0) tops.push(rect.top);
    }
    tops.sort((a, b) => a - b);
    return tops.filter((top, i) => i === 0 || top - tops[i - 1] > 4).length;
}"""

INSIDE_JS = """([inner, outer]) => {
    const a = inner.getBoundingClientRect(), b = outer.getBoundingClientRect();
    return a.width > 0 && a.left >= b.left - 1 && a.right <= b.right + 1 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1;
}"""


def shown_lines(locator) -> int:
    """The number of lines ``locator``'s text takes on the page."""
    return locator.evaluate(LINES_JS)


def inside(inner, outer) -> bool:
    """Whether ``inner``'s box lies wholly inside ``outer``'s (two element handles)."""
    return inner.page.evaluate(INSIDE_JS, [inner.element_handle(), outer.element_handle()])
