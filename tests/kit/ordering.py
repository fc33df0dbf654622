"""The order in which pytest-xdist's workers get the tests: the slow ones first on every worker."""

from __future__ import annotations


def slow_first(items: list, parts: int) -> list:
    """``items`` reordered for ``parts`` workers: the slow tests (marked ``slow``) first on every
    worker, the order otherwise kept, so that the workers finish together.

    pytest-xdist's worksteal hands each of its n workers one contiguous n-th of this list, and an
    idle worker then steals from the end of another's queue: so the slow tests are dealt to the
    starts of those parts, each part filled up with fast tests, and the last tests left to share
    out are fast ones. (All slow tests at the head of the list would give them all to the first
    worker, and the other only its last ones, stolen late.) They are dealt a module at a time, in
    turn, so that the slow tests sharing a module's trained run (``trained_once``) are on one
    worker, not waiting on each other's."""
    modules: dict[str, list] = {}
    for item in items:
        if item.get_closest_marker("slow") is not None:
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = [[] for _ in range(parts)]
    for index, module in enumerate(modules.values()):
        slow[index % parts] += module
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    ordered, remaining = [], len(items)
    for part in range(parts):
        size = remaining // (parts - part)  # as worksteal divides the list among its workers
        filler = max(0, size - len(slow[part]))
        ordered += slow[part] + fast[:filler]
        fast, remaining = fast[filler:], remaining - len(slow[part]) - filler
    return ordered + fast
