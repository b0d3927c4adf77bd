"""Run by test_cluster.py in a fresh interpreter: a job (with a kill) on
local-cluster[2,2,1024], i.e. two executor JVMs launching their own Python workers."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    work = tempfile.mkdtemp(prefix="absflow-cluster-work-")
    spark = (
        SparkSession.builder.master("local-cluster[2,2,1024]")
        .config("spark.worker.dir", work)
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    try:
        from jobmanager.faults import Kill
        from runtime import Dataflow
        from runtime.sources import GeneratorSource

        flow = Dataflow("cluster", parallelism=2, checkpoint_interval=0.2, progress=False)
        (
            flow.source(GeneratorSource(lambda i: i % 100, 20_000, rate=10_000), name="numbers")
            .key_by(lambda x: x)
            .aggregate(0, lambda c, _x: c + 1, name="count")
            .collect("out")
        )
        result = flow.run(faults=[Kill("count[1]", after_seconds=0.8)])
        out = result.output("out")
        last: dict[int, int] = {}
        for k, c in out:
            last[k] = max(last.get(k, 0), c)
        print(
            f"RESULT records={len(out)} distinct={len(set(out))} total={sum(last.values())} "
            f"restarts={len(result.restarts)}",
            flush=True,
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
