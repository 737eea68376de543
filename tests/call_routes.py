"""Which modules a call route passes through more than once: the project's frames on each call stack, collapsed to
modules (consecutive frames of one module are one visit), and every visit to a module already on that stack below
another module (A -> B -> A: a bounce back)."""

from __future__ import annotations

import sys
from collections.abc import Callable

PACKAGES = ("ppd_core", "app")


def project_module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.split(".")[0] in PACKAGES else None


def modules_on(frame) -> list[str]:
    """The project's modules on the stack, outermost first, consecutive repeats merged."""
    found: list[str] = []
    while frame is not None:
        module = project_module(frame)
        if module and (not found or found[-1] != module):
            found.append(module)
        frame = frame.f_back
    return found[::-1]


def bounces(route: list[str]) -> list[tuple[str, ...]]:
    """Each revisit on one stack: the part of the route from the module's first visit to its return."""
    found = []
    for i, module in enumerate(route):
        if module in route[:i]:
            first = route.index(module)
            found.append(tuple(route[first : i + 1]))
    return found


def traced_routes(call: Callable[[], object], within: Callable[[list[str]], bool] = lambda route: True) -> set[tuple]:
    """Every distinct bounce seen while ``call`` runs, on stacks ``within`` accepts."""
    seen: set[tuple] = set()

    def profile(frame, event, arg):
        if event == "call" and project_module(frame):
            route = modules_on(frame)
            if within(route):
                seen.update(bounces(route))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen
