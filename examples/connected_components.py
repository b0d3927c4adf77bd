"""Connected components by streaming label propagation over a feedback loop.

    python examples/connected_components.py               # 20,000 vertices, 16,000 edges
    python examples/connected_components.py --kill-task propagate[0] --after chk2
    python examples/connected_components.py --chaos 3

Each edge (u, v) enters the loop in both directions. The keyed ``propagate`` step
keeps, per vertex, its label (the smallest vertex id it has heard of) and its
neighbours. A new neighbour is told the vertex's label; a smaller label that
arrives is adopted and sent on to every neighbour over the feedback edge, so labels
circulate while they improve. Every improvement leaves the loop as (vertex, label);
a vertex's component is its last (smallest) label. The result is checked against
a union-find over the same edges.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime import Dataflow
from runtime.sources import CollectionSource

EDGE, LABEL, OUT = "e", "l", "o"


def make_edges(vertices: int, edges: int, seed: int = 7) -> list[tuple[int, int]]:
    """A sparse random graph (many components of many sizes), deterministic."""
    rng = random.Random(seed)
    return [(rng.randrange(vertices), rng.randrange(vertices)) for _ in range(edges)]


def both_directions(edge: tuple[int, int]) -> list[tuple[str, int, int]]:
    u, v = edge
    return [(EDGE, u, v), (EDGE, v, u)]


def propagate(
    vertex: int, record: tuple[str, int, int], state: Any
) -> Iterable[tuple[str, int, int]]:
    """Per vertex: ``state.value`` is its label, ``state.list("adj")`` its neighbours."""
    kind, _, value = record
    label = state.value
    out: list[tuple[str, int, int]] = []
    if label is None:
        label = state.value = vertex
        out.append((OUT, vertex, label))
    if kind == EDGE:
        state.list("adj").append(value)
        out.append((LABEL, value, label))  # tell the new neighbour our label
    elif value < label:
        state.value = value
        out.append((OUT, vertex, value))
        out.extend((LABEL, neighbour, value) for neighbour in state.list("adj"))
    return out


def build(edges: list[tuple[int, int]], parallelism: int, **config: object) -> Dataflow:
    flow = Dataflow("connected_components", parallelism=parallelism, **config)
    entry = flow.source(CollectionSource(edges), name="edges").flat_map(
        both_directions, name="both"
    )
    loop = entry.iterate(name="loop")
    labels = loop.stream.key_by(lambda r: r[1]).process(propagate, name="propagate")
    loop.feedback(labels.filter(lambda r: r[0] == LABEL, name="again"))
    labels.filter(lambda r: r[0] == OUT, name="improved").map(
        lambda r: (r[1], r[2]), name="label"
    ).collect("labels")
    return flow


def union_find(edges: list[tuple[int, int]]) -> dict[int, int]:
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    return {x: find(x) for x in list(parent)}  # the root is the component's smallest id


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--vertices", type=int, default=20_000)
    ap.add_argument("--edges", type=int, default=16_000)
    ap.add_argument("--parallelism", type=int, default=2)
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    edges = make_edges(args.vertices, args.edges)
    # union-find gives the failure-free components (the updates' order may differ)
    job = scaffold.run_job(
        ap, args, lambda **config: build(edges, args.parallelism, **config), reference_run=False
    )
    result = job.result
    updates = result.output("labels")
    component: dict[int, int] = {}
    for vertex, label in updates:
        component[vertex] = min(label, component.get(vertex, label))
    expected = union_find(edges)
    print(
        f"\n{len(expected):,} vertices in {len(set(expected.values())):,} components; "
        f"{len(updates):,} label updates in {result.duration:.2f} s "
        f"({job.elapsed:.2f} s with Spark start-up)"
    )
    print(result.summary())
    ok = component == expected
    # Exactly once: every update is an improvement, so a vertex never repeats a label.
    unique = len(set(updates)) == len(updates)
    print(
        f"check against union-find: {'OK' if ok else 'MISMATCH'}; "
        f"no duplicate updates: {'OK' if unique else 'DUPLICATES'}"
    )
    return scaffold.verdict(job, args, ok and unique)


if __name__ == "__main__":
    sys.exit(main())
