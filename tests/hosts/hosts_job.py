"""The driver of the host tests, run on the driver's host (``ip netns exec``):

    python hosts_job.py APP_JSON < one JSON job spec per line

APP: ``master`` (spark://...), ``host`` (the driver's address), ``pythonpath`` (for the
executors). A job spec: ``checkpoint_dir``, ``files`` (the FileSink's directory, which
every host shares), ``result`` (where the JSON result goes), ``log`` (the job manager's
log lines), ``records``, ``rate``, ``heartbeat_timeout``.

The SparkSession binds and advertises the driver's address (spark.driver.host and
bindAddress, SPARK_LOCAL_IP from the environment); absflow's job manager binds its
control socket and rendezvous on spark.driver.host, and every task its gates on its
executor's address, as Spark reports it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
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


def run_one(spec: dict[str, Any]) -> None:
    """Run the job ``spec`` asks for; its result, or its error, as JSON to spec["result"]
    (written last, by rename: the test waits for it); the job's log lines to spec["log"]."""
    handler = logging.FileHandler(spec["log"])
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("absflow").addHandler(handler)
    try:
        result = count_flow(spec).run()
        report: dict[str, Any] = {
            "records_out": result.records_out,
            "restarts": [
                {
                    "attempt": r.attempt,
                    "cause": r.cause.name,
                    "reason": r.reason,
                    "restored": r.restored_checkpoint,
                }
                for r in result.restarts
            ],
            "checkpoints": len(result.checkpoints),
            "failed_checkpoints": len(result.failed_checkpoints),
        }
    except Exception:
        report = {"error": traceback.format_exc()}
    finally:
        logging.getLogger("absflow").removeHandler(handler)
        handler.close()
    with open(spec["result"] + ".tmp", "w") as fh:
        json.dump(report, fh)
    os.replace(spec["result"] + ".tmp", spec["result"])


def main(app: dict[str, Any]) -> None:
    """One SparkSession (application) for every job of a test module: its executors
    start once, on every worker, and are reused (after a lost host, the master starts
    the application a new executor on that host's new worker). Jobs come as JSON
    lines on stdin, one at a time."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    session(app)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip():
            run_one(json.loads(line))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
