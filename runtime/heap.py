"""The cyclic garbage collector, set for a long-running process.

``wakeful worker`` and ``wakeful serve`` call :func:`settle_for_long_run` once
started. Python's default collects the youngest generation every 700 net
allocations of container objects. A busy worker allocates a few hundred a wake and
has up to ``max_concurrency`` wakes in flight, so each young collection scans the
objects of every running wake, promotes the ones still in use, and those make the
full collections (which scan the whole heap, the warm cache included) frequent: it
was half of a one-message wake's CPU with 30,000 entities (``bench_wakes.py``,
about 380 us a wake, 190 with this setting, the same as with the collector off).
A youngest generation of 50,000 lets most of a wake's objects die before a
collection looks at them; the garbage it can hold (cycles only: the rest is freed
at once) is a few MB at most.

An embedding application (``Runtime(run_worker=True)`` in its own process) keeps
its own collector settings: the process is its to tune.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION = 50_000
"""Net container allocations between two collections of the youngest generation."""


def settle_for_long_run() -> None:
    """Move the start-up objects out of the collector's way and collect rarely.

    Call once, after start-up: the objects alive then (modules, the registry, the
    connections) are frozen, so no collection scans them again."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION, middle, oldest)
