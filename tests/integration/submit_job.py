"""Submitted by test_cluster.py with ``spark-submit --master 'local-cluster[2,2,1024]'
--py-files absflow.zip``: the job must run on the submitted master, its tasks on two
executor JVMs. Prints what it saw from inside the tasks."""

from __future__ import annotations

import os


def executor_jvm(_record: object) -> int:
    """The pid of the JVM this task's Python worker descends from (its executor)."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        name, fields = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            stat[stat.rindex(")") + 2 :].split(),
        )
        if name == "java":
            return pid
        pid = int(fields[1])
    return 0


def main() -> None:
    from pyspark.sql import SparkSession

    from runtime import Dataflow
    from runtime.sources import GeneratorSource

    flow = Dataflow("submitted", parallelism=2, checkpoint_interval=0.5, progress=False)
    (
        flow.source(GeneratorSource(lambda i: i % 50, 4_000), name="numbers")
        .map(lambda x: (x, executor_jvm(x)), name="tag")
        .key_by(lambda rec: rec[0])
        # per key: (count, the JVMs of the source tasks its records came through)
        .aggregate(
            (0, ()), lambda acc, rec: (acc[0] + 1, tuple(set(acc[1]) | {rec[1]})), name="count"
        )
        .map(lambda kv: (kv[0], kv[1][0], (*kv[1][1], executor_jvm(kv))), name="tag_count")
        .collect("out")
    )
    result = flow.run()
    out = result.output("out")
    master = SparkSession.getActiveSession().sparkContext.master  # type: ignore[union-attr]
    jvms = {jvm for _k, _c, seen in out for jvm in seen}
    totals: dict[int, int] = {}
    for k, c, _seen in out:
        totals[k] = max(totals.get(k, 0), c)
    driver = executor_jvm(None)
    print(
        f"RESULT master={master} task_jvms={len(jvms)} driver_jvm_ran_tasks={driver in jvms} "
        f"records={len(out)} total={sum(totals.values())}",
        flush=True,
    )


if __name__ == "__main__":
    main()
