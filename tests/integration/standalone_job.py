"""Submitted to the test's standalone cluster (``python -m jobmanager submit --master
spark://...``) by test_standalone.py; prints one ``RESULT`` line.

    standalone_job.py count CHK_DIR RECORDS RATE   a checkpointed keyed count; the test
                                                   may kill a worker while it runs
    standalone_job.py slots                        a job with more tasks than the cluster
                                                   has slots, and a small executor_wait
"""

from __future__ import annotations

import logging
import sys
import time


def imported_from(_record: object) -> str:
    """Where this process imported absflow from (the zip shipped with --py-files?)."""
    import runtime

    return runtime.__file__ or "?"


def wait_for_executors(slots: int) -> None:
    """The cluster's executors register after the context starts: wait for them, so the
    runs below see every slot there is."""
    from pyspark.sql import SparkSession

    from jobmanager import launcher

    sc = SparkSession.builder.getOrCreate().sparkContext
    launcher.check_slots(sc, slots, wait=120.0)


def count(checkpoint_dir: str, records: int, rate: float) -> None:
    from runtime import Dataflow
    from runtime.sources import GeneratorSource

    flow = Dataflow(
        "standalone",
        parallelism=2,
        checkpoint_interval=0.3,
        checkpoint_dir=checkpoint_dir,
        executor_wait=120.0,  # a lost worker's replacement takes a while to start
        progress=False,
    )
    (
        flow.source(GeneratorSource(lambda i: i % 100, records, rate=rate), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name="count")
        .map(lambda kv: (kv[0], kv[1], imported_from(kv)), name="where")
        .collect("out")
    )
    result = flow.run()
    out = result.output("out")
    last: dict[int, int] = {}
    for k, c, _where in out:
        last[k] = max(last.get(k, 0), c)
    tasks_from = {where for _k, _c, where in out}
    restored = [r.restored_checkpoint for r in result.restarts]
    print(
        f"RESULT records={len(out)} distinct={len({(k, c) for k, c, _ in out})} "
        f"total={sum(last.values())} restarts={len(result.restarts)} "
        f"restored={','.join(map(str, restored)) or '-'} driver_from={imported_from(None)} "
        f"tasks_from={','.join(sorted(tasks_from))}",
        flush=True,
    )
    print(result.summary(), flush=True)


def slots() -> None:
    from runtime import Dataflow, InsufficientSlotsError
    from runtime.sources import GeneratorSource

    flow = Dataflow("too-big", parallelism=3, executor_wait=2.0, progress=False)
    (
        flow.source(GeneratorSource(lambda i: i, 1000), name="numbers")
        .key_by(lambda x: x % 10)
        .aggregate(0, lambda c, _x: c + 1, name="count")
        .collect("out")
    )
    started = time.monotonic()
    try:
        flow.run()
    except InsufficientSlotsError as err:
        print(f"RESULT seconds={time.monotonic() - started:.1f} error=InsufficientSlotsError")
        print(f"ERROR {err}", flush=True)
    else:
        print("RESULT error=none", flush=True)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    wait_for_executors(4)
    if argv[0] == "count":
        count(argv[1], int(argv[2]), float(argv[3]))
    else:
        slots()


if __name__ == "__main__":
    main(sys.argv[1:])
