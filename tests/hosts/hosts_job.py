"""The driver of the host tests, run on the driver's host (``ip netns exec``):

    python hosts_job.py APP_JSON < one JSON job spec per line

APP: ``master`` (spark://...), ``host`` (the driver's address), ``pythonpath`` (for the
executors). A job spec: ``checkpoint_dir``, ``files`` (the FileSink's directory, which
every host shares), ``result`` (where the JSON result goes), ``log`` (the job manager's
log lines), ``records``, ``rate``, ``heartbeat_timeout``; optional: ``pipeline`` (``count``,
the default: a keyed running count; ``loop``: Collatz numbers circulating in a loop until
they reach 1; ``postgres``: the count into a PostgreSQL table), ``parallelism`` (2), ``dsn``
and ``table`` (``postgres``), ``executor_wait`` (120 s), ``ui_port`` (the dashboard's, on 127.0.0.1 of the driver's
host).

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


def start(i: int) -> list[int]:
    return [i + 1, i + 1, 0]  # (number, where it is now, steps so far)


def collatz(r: list[int]) -> list[int]:
    n, v, k = r
    return r if v == 1 else [n, v // 2 if v % 2 == 0 else 3 * v + 1, k + 1]


def new_flow(spec: dict[str, Any], parallelism: int) -> Any:
    from runtime import Dataflow

    return Dataflow(
        "hosts" if spec.get("pipeline", "count") == "count" else f"hosts-{spec['pipeline']}",
        parallelism=parallelism,
        checkpoint_interval=0.3,
        checkpoint_dir=spec["checkpoint_dir"],
        heartbeat_timeout=spec["heartbeat_timeout"],
        executor_wait=spec.get("executor_wait", 120.0),
        progress=False,
        ui_port=spec.get("ui_port", 8081),
    )


def count_flow(spec: dict[str, Any]) -> Any:
    from runtime.connectors.postgres import PostgresSink
    from runtime.sinks import FileSink
    from runtime.sources import GeneratorSource

    flow = new_flow(spec, spec.get("parallelism", 2))
    counts = (
        flow.source(GeneratorSource(user_of, spec["records"], rate=spec["rate"]), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name="count")
    )
    if spec.get("pipeline") == "postgres":
        counts.sink(PostgresSink(spec["dsn"], spec["table"], ["k", "c"]), name="pg")
    else:
        counts.sink(FileSink(spec["files"]), name="files")
    return flow


def loop_flow(spec: dict[str, Any]) -> Any:
    """Collatz: each number circulates through the loop until it reaches 1 (its steps
    then go to the FileSink as [number, steps]). At parallelism 1: four tasks (source,
    loop head, feedback, exit), which the hosts' six slots hold."""
    from runtime.sinks import FileSink
    from runtime.sources import GeneratorSource

    flow = new_flow(spec, spec.get("parallelism", 1))
    loop = flow.source(
        GeneratorSource(start, spec["records"], rate=spec["rate"]), name="numbers"
    ).iterate(name="loop")
    step = loop.stream.map(collatz, name="step")
    loop.feedback(step.filter(lambda r: r[1] != 1, name="again").key_by(lambda r: r[0]))
    (
        step.filter(lambda r: r[1] == 1, name="done")
        .map(lambda r: [r[0], r[2]], name="steps")
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
        flow = loop_flow(spec) if spec.get("pipeline") == "loop" else count_flow(spec)
        result = flow.run()
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
