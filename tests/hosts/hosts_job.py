"""The driver of the host tests, run on the driver's host (``ip netns exec``):

    python hosts_job.py SPEC_JSON

The job writes its output with a FileSink (exactly once) to ``files``.

SPEC: ``master`` (spark://...), ``host`` (the driver's address), ``pythonpath`` (for the
executors), ``checkpoint_dir``, ``files`` (a FileSink directory every host shares),
``result`` (where the JSON result goes), ``records``, ``rate``, ``heartbeat_timeout``,
``pipeline`` ("count" or "loop").

The SparkSession binds and advertises the driver's address (spark.driver.host and
bindAddress, SPARK_LOCAL_IP from the environment); absflow's job manager binds its
control socket and rendezvous on spark.driver.host, and every task its gates on its
executor's address, as Spark reports it.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


def session(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(spec["master"])
        .appName("absflow-hosts")
        .config("spark.driver.host", spec["host"])
        .config("spark.driver.bindAddress", spec["host"])
        .config("spark.ui.enabled", "false")
        .config("spark.dynamicAllocation.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executorEnv.PYTHONPATH", spec["pythonpath"])
        .config("spark.pyspark.python", sys.executable)
        # barrier stages: re-check slots every second (as `python -m jobmanager submit` does)
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .getOrCreate()
    )


def user_of(i: int) -> int:
    return i % 53


def count_flow(spec: dict[str, Any]) -> Any:
    from runtime import Dataflow
    from runtime.sinks import FileSink
    from runtime.sources import GeneratorSource

    flow = Dataflow(
        "hosts",
        parallelism=2,
        checkpoint_interval=0.3,
        checkpoint_dir=spec["checkpoint_dir"],
        heartbeat_timeout=spec["heartbeat_timeout"],
        executor_wait=120.0,
        progress=False,
    )
    (
        flow.source(GeneratorSource(user_of, spec["records"], rate=spec["rate"]), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name="count")
        .sink(FileSink(spec["files"]), name="files")
    )
    return flow


def main(spec: dict[str, Any]) -> None:
    # the job manager's warnings ("attempt 1 failed (...); restarting ...") to stderr
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    session(spec)
    result = count_flow(spec).run()
    report = {
        "records_out": result.records_out,
        "restarts": [
            {"attempt": r.attempt, "cause": r.cause.name, "reason": r.reason,
             "restored": r.restored_checkpoint}  # fmt: skip
            for r in result.restarts
        ],
        "checkpoints": len(result.checkpoints),
        "failed_checkpoints": len(result.failed_checkpoints),
    }
    with open(spec["result"], "w") as fh:
        json.dump(report, fh)
    print(result.summary(), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
