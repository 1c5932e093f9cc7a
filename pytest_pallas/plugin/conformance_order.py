"""The conformance tests in the order that lets pytest-xdist's workers finish together.

xdist hands tests out in collection order, a few at a time, and a run ends when its
busiest worker does: a 4-second test handed out last keeps one core busy while the other
waits. So the workers take the longest tests first, each as long as it took in the last
run (kept in pytest's cache directory by the controller, which sees every test's report)
and a test never timed before ahead of those (a new op, or a cold cache: likely slow),
value properties before the written and vmap ones. One process runs the tests in the
order they were collected: it finishes when they all do, whatever the order.

Every worker orders the same collection from the same stored times, so xdist sees one
order, as it requires.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

CACHE_KEY = "pallas/conformance-seconds"
# The most tests whose times are kept (the newest): a few thousand numbers at most.
MOST_KEPT = 4096
# Property tests in their usual order of cost, for tests never timed.
_PROPERTY_RANK = {"test_value": 0, "test_written_and_deterministic": 1, "test_vmap": 2}


def longest_first(items: list[pytest.Item], seconds: dict[str, float],
                  is_conformance: Callable[[pytest.Item], bool]) -> list[pytest.Item]:
    """``items`` with the conformance tests first, longest first (untimed ones ahead, by
    property), then the other tests in their own order."""
    ours = [item for item in items if is_conformance(item)]
    others = [item for item in items if not is_conformance(item)]

    def key(item: pytest.Item) -> tuple[int, float, int]:
        known = seconds.get(item.nodeid)
        if known is None:
            name = getattr(item, "originalname", item.name)
            return (0, 0.0, _PROPERTY_RANK.get(name, len(_PROPERTY_RANK)))
        return (1, -known, 0)

    return sorted(ours, key=key) + others


def stored(config: pytest.Config) -> dict[str, float]:
    """The times of the last run, or none when pytest's cache is off."""
    cache = getattr(config, "cache", None)
    value = cache.get(CACHE_KEY, None) if cache is not None else None
    if not isinstance(value, dict):
        return {}
    return {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}


def store(config: pytest.Config, seconds: dict[str, Any]) -> None:
    """This run's times over the stored ones."""
    cache = getattr(config, "cache", None)
    if cache is None or not seconds:
        return
    kept = {nodeid: value for nodeid, value in stored(config).items() if nodeid not in seconds}
    merged = list(kept.items()) + list(seconds.items())  # the newest last
    cache.set(CACHE_KEY, dict(merged[-MOST_KEPT:]))
