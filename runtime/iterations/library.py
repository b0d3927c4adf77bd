"""Ready-made steps and compensation functions (seed 004's two algorithms).

PageRank is a bulk iteration with networkx's semantics (damping ``alpha``, dangling
vertices spread their rank uniformly, stop when the L1 change is below ``n * tol``).
Connected components is a delta iteration: every vertex's label is the smallest vertex
id it has heard of; only vertices whose label changed send again.

Compensation (optimistic recovery, seed 004 §4, algorithms 1 and 2):
``pagerank_compensation`` gives each lost vertex (1 - sum of surviving ranks) / #lost,
so the ranks sum to 1 again; ``cc_compensation`` gives each lost vertex its own id and
puts it and its neighbours in the workset, so it hears their labels again. The
``*_without_compensation`` variants exist to show why (companion tests, benchmark).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runtime.api.iterations import Step

__all__ = [
    "ConnectedComponentsStep",
    "PageRankStep",
    "cc_compensation",
    "cc_without_compensation",
    "pagerank_compensation",
    "pagerank_without_compensation",
]


def _add(a: float, b: float) -> float:
    return a + b


def _min(a: int, b: int) -> int:
    return a if a <= b else b


class PageRankStep(Step):
    """Bulk step over ``{vertex: rank}`` with side input ``{vertex: out-neighbours}``."""

    name = "pagerank"
    combine = staticmethod(_add)

    def __init__(self, n_vertices: int, alpha: float = 0.85) -> None:
        self.n, self.alpha = n_vertices, alpha
        self.base = (1.0 - alpha) / n_vertices

    def messages(self, key: Any, value: float, side: Any) -> Iterable[tuple[Any, float]]:
        if not side:
            return ()
        share = value / len(side)
        return [(t, share) for t in side]

    def contribution(self, key: Any, value: float, side: Any) -> float:
        return 0.0 if side else value  # dangling rank, spread uniformly

    def update(self, key: Any, value: float, inbox: Any, side: Any, total: float) -> float:
        return self.alpha * ((inbox or 0.0) + total / self.n) + self.base

    def aggregate(self, key: Any, old: float, new: float) -> float:
        return abs(new - old)


class ConnectedComponentsStep(Step):
    """Delta step over ``{vertex: label}`` with side input ``{vertex: neighbours}``
    (both directions)."""

    name = "connected_components"
    combine = staticmethod(_min)

    def messages(self, key: Any, value: int, side: Any) -> Iterable[tuple[Any, int]]:
        return [(t, value) for t in side or ()]

    def update(self, key: Any, value: int, inbox: Any, side: Any, total: float) -> int | None:
        return inbox if inbox is not None and inbox < value else None


def pagerank_compensation(
    surviving: dict[Any, float], lost: frozenset[Any], side: Mapping[Any, Any]
) -> dict[Any, float]:
    """Seed 004 algorithm 1: the lost vertices share the rank mass that is missing."""
    share = (1.0 - sum(surviving.values())) / len(lost)
    return dict.fromkeys(lost, share)


def pagerank_without_compensation(
    surviving: dict[Any, float], lost: frozenset[Any], side: Mapping[Any, Any]
) -> dict[Any, float]:
    """The lost vertices restart at 0: the ranks no longer sum to 1 (companion)."""
    return dict.fromkeys(lost, 0.0)


def cc_compensation(
    surviving: dict[Any, int], lost: frozenset[Any], side: Mapping[Any, Any]
) -> tuple[dict[Any, int], set[Any]]:
    """Seed 004 algorithm 2: a lost vertex takes its own id; it and its neighbours join
    the workset, so labels flow into it again (and from it, if its id is smallest)."""
    workset = set(lost)
    for v in lost:
        workset.update(side.get(v) or ())
    return {v: v for v in lost}, workset


def cc_without_compensation(
    surviving: dict[Any, int], lost: frozenset[Any], side: Mapping[Any, Any]
) -> tuple[dict[Any, int], set[Any]]:
    """Own id for the lost vertices, but nobody tells them their neighbours' labels
    again: they keep wrong labels (companion)."""
    return {v: v for v in lost}, set(lost)
