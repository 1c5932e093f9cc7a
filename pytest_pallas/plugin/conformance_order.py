"""The conformance tests in the order that lets pytest-xdist's workers finish together.

xdist hands tests out in collection order, a few at a time, and a run ends when its
busiest worker does: a 4-second test handed out last keeps one core busy while the other
waits. So the workers take the longest tests first, each as long as it took in the last
run (kept in pytest's cache directory by the controller, which sees every test's report),
or, never timed here, as long as it typically takes (``typical_seconds.json``, measured
for the packaged suite: a fresh clone's first run is ordered too); a test known to neither
(a new op) goes ahead of them all, value properties before the written and vmap ones. One
process runs the tests in the order they were collected: it finishes when they all do,
whatever the order.

xdist's ``--dist load`` starts each worker on a chunk of consecutive tests (two on a
many-core host). Longest first, the first worker would get the two longest tests, and
the run would wait on it; so the tests of those first chunks are dealt out so that each
chunk holds about as many seconds as the others.

Every worker orders the same collection from the same stored times, so xdist sees one
order, as it requires. xdist sets a worker's own ``--dist`` to ``no``: the controller's
mode reaches the workers through ``workerinput`` (:data:`WORKER_DIST_KEY`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CACHE_KEY = "pallas/conformance-seconds"
# The most tests whose times are kept (the newest): a few thousand numbers at most.
MOST_KEPT = 4096
# Property tests in their usual order of cost, for tests never timed.
_PROPERTY_RANK = {"test_value": 0, "test_written_and_deterministic": 1, "test_vmap": 2}
TYPICAL_SECONDS_FILE = Path(__file__).with_name("typical_seconds.json")
# Where a pytest-xdist worker finds its controller's --dist (config.workerinput).
WORKER_DIST_KEY = "pallas_dist"


def typical_seconds() -> dict[str, float]:
    """The packaged suite's tests (``test_value[matmul]``) and the seconds each took in one
    process of the main job: the order of a run that has timed nothing yet."""
    try:
        table = json.loads(TYPICAL_SECONDS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {name: float(value) for name, value in table.get("seconds", {}).items()}


def longest_first(items: list[pytest.Item], seconds: dict[str, float],
                  is_conformance: Callable[[pytest.Item], bool],
                  typical: dict[str, float] | None = None) -> list[pytest.Item]:
    """``items`` with the conformance tests first, longest first (those neither timed nor
    typical ahead, by property), then the other tests in their own order.

    ``seconds`` is keyed by node id (this project's last run), ``typical`` by test name.
    """
    ours = [item for item in items if is_conformance(item)]
    others = [item for item in items if not is_conformance(item)]
    typical = typical or {}

    def key(item: pytest.Item) -> tuple[int, float, int]:
        known = expected_seconds(item, seconds, typical)
        if known is None:
            name = getattr(item, "originalname", item.name)
            return (0, 0.0, _PROPERTY_RANK.get(name, len(_PROPERTY_RANK)))
        return (1, -known, 0)

    return sorted(ours, key=key) + others


def expected_seconds(item: pytest.Item, seconds: dict[str, float],
                     typical: dict[str, float]) -> float | None:
    """How long ``item`` should take: its last time here, else its typical time, else None."""
    known = seconds.get(item.nodeid)
    return known if known is not None else typical.get(item.name)


def first_chunk_size(tests: int, workers: int, most_per_send: int | None) -> int:
    """How many consecutive tests pytest-xdist's ``--dist load`` first sends each worker.

    The rule of xdist's ``LoadScheduling.schedule`` (a quarter of each worker's share, at
    least 2, at most ``--maxschedchunk``); 1 when there are fewer than two tests per worker
    (then it deals them out one by one). tests/test_default_workers.py checks it against
    the installed xdist's scheduler.
    """
    if tests < 2 * workers:
        return 1
    return max(min(tests // workers // 4, most_per_send or tests), 2)


def balanced_first_chunks(items: list[pytest.Item], seconds_of: Callable[[pytest.Item], float],
                          workers: int, chunk: int) -> list[pytest.Item]:
    """``items`` (longest first) with the first ``workers * chunk`` laid out so that the
    chunk xdist sends each worker first holds about as many seconds as every other: each
    test, longest first, joins the chunk with the fewest seconds that still has room."""
    if workers < 2 or chunk < 2 or len(items) < workers * chunk:
        return items
    head, tail = items[:workers * chunk], items[workers * chunk:]
    chunks: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in head:
        open_chunks = [k for k in range(workers) if len(chunks[k]) < chunk]
        k = min(open_chunks, key=lambda index: loads[index])
        chunks[k].append(item)
        loads[k] += seconds_of(item)
    return [item for each in chunks for item in each] + tail


def order_for_workers(config: pytest.Config, items: list[pytest.Item],
                      is_conformance: Callable[[pytest.Item], bool]) -> list[pytest.Item]:
    """The collection in the order this run's pytest-xdist workers should take it."""
    seconds, typical = stored(config), typical_seconds()
    ordered = longest_first(items, seconds, is_conformance, typical)
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or workerinput.get(WORKER_DIST_KEY) != "load":
        return ordered
    workers = int(workerinput.get("workercount", 1))
    chunk = first_chunk_size(len(ordered), workers, config.getoption("maxschedchunk",
                                                                      default=None))
    untimed = max([*seconds.values(), *typical.values(), 1.0])  # a new op: likely slow

    def seconds_of(item: pytest.Item) -> float:
        if not is_conformance(item):
            return 0.0
        known = expected_seconds(item, seconds, typical)
        return untimed if known is None else known

    return balanced_first_chunks(ordered, seconds_of, workers, chunk)


def worker_input(config: pytest.Config) -> dict[str, Any]:
    """What a pytest-xdist worker must know of its controller's distribution: ``--dist``,
    which xdist resets to ``no`` in the worker itself."""
    return {WORKER_DIST_KEY: config.getoption("dist", default="no")}


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
