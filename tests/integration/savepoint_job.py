"""The job of the stop-with-savepoint tests, as a module (the dataflow) and as a script
(a driver the test stops with SIGTERM):

    savepoint_job.py CHK_DIR OUT_JSON    runs the unbounded version until it is stopped;
                                         writes {"output", "savepoint", "stopped"} to OUT_JSON
    savepoint_job.py --bounded N RESTARTS OUT_JSON
                                         runs build(N) with RESTARTS restarts (FixedDelay);
                                         writes {"output", "restarts"} or {"error"}

``build(n, ...)`` is the same job, bounded to the records 0..n-1, optionally changed
(a stateless step inserted, the keyed step at another parallelism).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from runtime import Dataflow
from runtime.sources import GeneratorSource

KEYS = 37


def click(i: int) -> tuple[str, int]:
    return (f"user{i % KEYS}", i)


def user(record: tuple[str, int]) -> str:
    return record[0]


def count(n: int, _record: Any) -> int:
    return n + 1


def normalize(record: tuple[str, int]) -> tuple[str, int]:
    """The stateless step a new version of the job inserts (output unchanged)."""
    return (record[0].strip().lower(), record[1])


def build(
    n: int | None,
    count_parallelism: int = 2,
    inserted: bool = False,
    rate: float | None = None,
    **config: Any,
) -> Dataflow:
    """events (2) [-> normalize] -> key_by user -> "per_user" aggregate -> rebalance ->
    collect "out" (2). Here only the keyed step rescales (sources and sinks can too:
    tests/integration/test_rescale.py)."""
    config.setdefault("checkpoint_interval", 0.2)
    flow = Dataflow("clicks", parallelism=2, **config)
    events = flow.source(GeneratorSource(click, n, rate=rate), name="events")
    if inserted:
        events = events.map(normalize, name="normalize")
    (
        events.key_by(user)
        .aggregate(0, count, name="per_user", parallelism=count_parallelism)
        .rebalance()
        .collect("out", parallelism=2)
    )
    return flow


def bounded(n: int, restarts: int, out: str) -> int:
    from jobmanager.restart import FixedDelay
    from runtime import AbsflowError

    flow = build(n, checkpoint_interval=0.3, restart_strategy=FixedDelay(restarts, 0.1))
    try:
        result = flow.run(progress=False)
    except AbsflowError as err:
        with open(out, "w") as fh:
            json.dump({"error": f"{type(err).__name__}: {err}"}, fh)
        return 1
    with open(out, "w") as fh:
        json.dump(
            {"output": result.output("out"), "restarts": [r.reason for r in result.restarts]}, fh
        )
    print(result.summary(), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "--bounded":
        return bounded(int(argv[1]), int(argv[2]), argv[3])
    checkpoint_dir, out = argv
    result = build(None, rate=4_000, checkpoint_dir=checkpoint_dir).run(progress=False)
    with open(out, "w") as fh:
        json.dump(
            {
                "output": result.output("out"),
                "savepoint": result.savepoint,
                "stopped": result.stopped,
            },
            fh,
        )
    print(result.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
