"""Orders joined with their payments within 10 minutes of event time (an interval join).

    python examples/orders_payments.py                       # 20,000 orders, parallelism 2
    python examples/orders_payments.py --kill-task paid[0] --after chk2
    python examples/orders_payments.py --chaos 2             # random kills, vs a clean run

Orders come one per second of event time; each has one payment 0 to 15 minutes later
(payments arrive out of order by up to 15 minutes: max_delay), except every 10th order,
whose payment names an unknown order. An order and its payment join when the payment
is at most 10 minutes after the order. The join's state is freed as the watermark
passes, so it stays bounded. The result is checked against a direct computation.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime import Dataflow
from runtime.sources import GeneratorSource

SECOND = 1_000
WITHIN = 10 * 60 * SECOND
MAX_DELAY = 15 * 60 * SECOND


def order(i: int) -> tuple[int, int, int]:
    """(order id, timestamp ms, amount in cents)."""
    return (i, i * SECOND, 100 + (i * 7919) % 10_000)


def payment(i: int) -> tuple[int, int, str]:
    """(order id, timestamp ms, method): order i's payment, 0 to 15 min after it."""
    delay = (i * 104_729) % (15 * 60) * SECOND
    oid = -i if i % 10 == 0 else i  # every 10th payment names an unknown order
    return (oid, i * SECOND + delay, ("card", "transfer", "wallet")[i % 3])


def build(orders: int, parallelism: int, rate: float | None, **config: Any) -> Dataflow:
    flow = Dataflow("orders_payments", parallelism=parallelism, **config)
    placed = (
        flow.source(GeneratorSource(order, orders, rate=rate), name="orders", parallelism=1)
        .assign_timestamps(lambda o: o[1], max_delay=0, name="order_time")
        .key_by(lambda o: o[0])
    )
    paid = (
        flow.source(GeneratorSource(payment, orders, rate=rate), name="payments", parallelism=1)
        .assign_timestamps(lambda p: p[1], max_delay=MAX_DELAY, name="payment_time")
        .key_by(lambda p: p[0])
    )
    placed.connect(paid).interval_join(0, WITHIN, name="paid", parallelism=parallelism).collect(
        "joined"
    )
    return flow


def expected(orders: int) -> collections.Counter[Any]:
    by_id = {order(i)[0]: order(i) for i in range(orders)}
    out: collections.Counter[Any] = collections.Counter()
    for i in range(orders):
        p = payment(i)
        o = by_id.get(p[0])
        if o is not None and o[1] <= p[1] <= o[1] + WITHIN:
            out[(o[0], o, p)] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--orders", type=int, default=20_000)
    ap.add_argument("--parallelism", type=int, default=2, help="of the join")
    ap.add_argument("--rate", type=float, default=5_000, help="records/s per source (0: no limit)")
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    job = scaffold.run_job(
        ap, args, lambda **config: build(args.orders, args.parallelism, args.rate or None, **config)
    )
    result = job.result
    joined = collections.Counter(result.output("joined"))
    print(
        f"\n{args.orders:,} orders, {args.orders:,} payments -> {sum(joined.values()):,} "
        f"joined in {result.duration:.2f} s ({job.elapsed:.2f} s with Spark start-up)"
    )
    print(result.summary())
    ok = joined == expected(args.orders)
    print(f"check against a direct computation: {'OK' if ok else 'MISMATCH'}")
    return scaffold.verdict(job, args, ok, lambda r: collections.Counter(r.output("joined")))


if __name__ == "__main__":
    sys.exit(main())
