"""Collatz sequences in a loop: numbers 1..N circulate until they reach 1.

    python examples/collatz.py                          # N = 20,000, parallelism 2
    python examples/collatz.py --n 100000
    python examples/collatz.py --kill-task loop[1] --after backedge_log
    python examples/collatz.py --chaos 3                # 3 random kills

Every number enters the loop as (n, n, 0); each pass through the body applies
one Collatz step (n/2 or 3n+1) and counts it; records not yet at 1 go round again
over the feedback edge (hash partitioned by n), the others leave the loop. The
output, one (n, steps) per number, is checked against a direct computation:
exactly once, also under kills (checkpoints log the records in flight on the
feedback edge).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime import Dataflow
from runtime.sources import GeneratorSource


def start(n: int) -> tuple[int, int, int]:
    return (n + 1, n + 1, 0)  # (number, current value, steps so far)


def collatz_step(record: tuple[int, int, int]) -> tuple[int, int, int]:
    number, value, steps = record
    if value == 1:
        return record
    return (number, value // 2 if value % 2 == 0 else 3 * value + 1, steps + 1)


def steps_directly(number: int) -> int:
    steps = 0
    while number != 1:
        number = number // 2 if number % 2 == 0 else 3 * number + 1
        steps += 1
    return steps


def build(n: int, parallelism: int, **config: object) -> Dataflow:
    flow = Dataflow("collatz", parallelism=parallelism, **config)
    numbers = flow.source(GeneratorSource(start, n), name="numbers")
    loop = numbers.iterate(name="loop")
    step = loop.stream.map(collatz_step, name="step")
    loop.feedback(step.filter(lambda r: r[1] != 1, name="again").key_by(lambda r: r[0]))
    step.filter(lambda r: r[1] == 1, name="done").map(lambda r: (r[0], r[2]), name="count").collect(
        "steps"
    )
    return flow


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--n", type=int, default=20_000, help="numbers 1..N")
    ap.add_argument("--parallelism", type=int, default=2)
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # the direct computation is the failure-free output, record for record
    job = scaffold.run_job(
        ap, args, lambda **config: build(args.n, args.parallelism, **config), reference_run=False
    )
    result = job.result
    out = result.output("steps")
    expected = sorted((k, steps_directly(k)) for k in range(1, args.n + 1))
    hops = sum(steps for _n, steps in out) + len(out)
    longest = max(out, key=lambda r: (r[1], -r[0]))
    print(
        f"\n{len(out):,} numbers, {hops:,} passes through the loop in {result.duration:.2f} s "
        f"({hops / result.duration:,.0f} passes/s; {job.elapsed:.2f} s with Spark start-up)"
    )
    print(f"longest: {longest[0]:,} takes {longest[1]} steps")
    print(result.summary())
    ok = sorted(out) == expected
    print(f"check against a direct computation, record for record: {'OK' if ok else 'MISMATCH'}")
    if not ok:
        missing = len(set(expected) - set(out))
        print(f"  {missing} expected records missing, {len(out) - len(set(out))} duplicates")
    return scaffold.verdict(job, args, ok)


if __name__ == "__main__":
    sys.exit(main())
