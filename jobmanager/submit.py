"""``python -m jobmanager package`` and ``python -m jobmanager submit``: the spark-submit
line a cluster needs for an absflow script, built from the master and deploy mode.

* every cluster master: ``--py-files absflow.zip``,
  ``spark.dynamicAllocation.enabled=false`` (barrier stages need fixed executors) and a
  barrier-stage slot re-check every second (Spark's default is every 15 s);
* ``--env env.tar.gz`` (a packed virtualenv): ``--archives env.tar.gz#env`` and the
  Python inside it, ``./env/bin/python``, for the executors, and for the driver where it
  runs on the cluster (YARN cluster mode: ``spark.yarn.appMasterEnv.*``). In client mode
  the driver runs here, with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from jobmanager.packaging import build_env, build_zip
from runtime.errors import PackagingError

ENV_ALIAS = "env"
ENV_PYTHON = f"./{ENV_ALIAS}/bin/python"
DEPLOY_MODES = ("client", "cluster")


def spark_submit_path() -> str:
    """``$SPARK_HOME/bin/spark-submit``, else the one pip's pyspark ships."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        import pyspark

        home = os.path.dirname(pyspark.__file__)
    return os.path.join(home, "bin", "spark-submit")


def _local(master: str) -> bool:
    return master.startswith("local")


@dataclass(frozen=True)
class SubmitRequest:
    """What to submit: the script, where, and with what."""

    master: str
    script: str
    py_files: str  # absflow.zip
    deploy_mode: str = "client"
    env_archive: str | None = None  # a venv-pack archive shipped as ./env
    conf: tuple[tuple[str, str], ...] = ()  # the user's --conf, after ours (they may add)
    script_args: tuple[str, ...] = ()
    spark_submit: str = field(default_factory=spark_submit_path)
    driver_python: str = sys.executable  # client mode: the driver runs here

    def check(self) -> None:
        """PackagingError for a combination Spark would reject late or run wrongly."""
        if self.deploy_mode not in DEPLOY_MODES:
            raise PackagingError(
                f"--deploy-mode {self.deploy_mode!r}: use one of {', '.join(DEPLOY_MODES)}"
            )
        if self.deploy_mode == "cluster" and not self.master.startswith(("yarn", "k8s://")):
            raise PackagingError(
                f"--deploy-mode cluster is not supported for Python applications on master "
                f"{self.master}: Spark runs a Python driver on the cluster only on YARN and "
                "Kubernetes. Use --deploy-mode client."
            )
        for key, value in self.conf:
            if key == "spark.dynamicAllocation.enabled" and value.strip().lower() == "true":
                raise PackagingError(
                    "--conf spark.dynamicAllocation.enabled=true: absflow runs barrier "
                    "stages, which need a fixed set of executors; leave it off and size the "
                    "executors (spark.executor.instances, spark.executor.cores)"
                )


def _env_confs(req: SubmitRequest) -> list[tuple[str, str]]:
    """Where the packed env's Python is used: by the executors always, and by the driver
    when it runs on the cluster."""
    confs = [("spark.executorEnv.PYSPARK_PYTHON", ENV_PYTHON)]
    if req.master.startswith("yarn"):
        # The application master's env decides the Python of a YARN cluster-mode driver
        # and of the executors it asks for.
        confs.append(("spark.yarn.appMasterEnv.PYSPARK_PYTHON", ENV_PYTHON))
        if req.deploy_mode == "cluster":
            confs.append(("spark.yarn.appMasterEnv.PYSPARK_DRIVER_PYTHON", ENV_PYTHON))
    if req.deploy_mode == "client":
        # A client-mode driver tells the executors which Python to start.
        confs.append(("spark.pyspark.python", ENV_PYTHON))
    return confs


def submit_line(req: SubmitRequest) -> list[str]:
    """The spark-submit argv for ``req`` (checked first)."""
    req.check()
    argv = [req.spark_submit, "--master", req.master, "--deploy-mode", req.deploy_mode]
    confs: list[tuple[str, str]] = []
    if not _local(req.master):
        confs.append(("spark.dynamicAllocation.enabled", "false"))
        # After a lost executor Spark may see the slots before it sees the loss; its own
        # re-check of a barrier stage's slots then runs every second, not every 15 s.
        confs.append(("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s"))
        confs.append(("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "120"))
    if req.deploy_mode == "client":
        # The driver runs here: under the interpreter that has absflow's dependencies.
        confs.append(("spark.pyspark.driver.python", req.driver_python))
    if req.env_archive is not None:
        argv += ["--archives", f"{req.env_archive}#{ENV_ALIAS}"]
        confs += _env_confs(req)
    confs += list(req.conf)
    for key, value in confs:
        argv += ["--conf", f"{key}={value}"]
    argv += ["--py-files", req.py_files, req.script, *req.script_args]
    return argv


# -- the command line ----------------------------------------------------------------------
def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key.strip(), value


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pkg = commands.add_parser(
        "package",
        help="build absflow.zip (and with --env a packed virtualenv) for a cluster",
        description="Build absflow.zip (the four packages, for spark-submit --py-files); "
        "with --env also env.tar.gz, this interpreter's virtualenv packed with venv-pack, "
        "for --archives env.tar.gz#env.",
    )
    pkg.add_argument("--out", default="dist", metavar="DIR", help="where to write (./dist)")
    pkg.add_argument("--env", action="store_true", help="also pack the virtualenv (venv-pack)")

    sub = commands.add_parser(
        "submit",
        help="package and spark-submit an absflow script",
        description="Build absflow.zip, print the spark-submit line for the master and "
        "deploy mode, and run it (exit code passed through).",
    )
    sub.add_argument("--master", required=True, help="spark://HOST:PORT, yarn, k8s://..., local")
    sub.add_argument("--deploy-mode", default="client", choices=DEPLOY_MODES)
    sub.add_argument(
        "--env", metavar="ENV.tar.gz", help="a packed virtualenv (package --env) to ship"
    )
    sub.add_argument(
        "--conf", action="append", type=_conf_pair, default=[], metavar="K=V", help="Spark conf"
    )
    sub.add_argument("--out", default="dist", metavar="DIR", help="where absflow.zip is built")
    sub.add_argument("--dry-run", action="store_true", help="only print the line")
    sub.add_argument("script", help="the absflow script (e.g. examples/wordcount.py)")
    sub.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")


def run_package(args: argparse.Namespace, out: TextIO) -> int:
    target = Path(args.out)
    env = build_env(target) if args.env else None  # first: a missing venv-pack fails fast
    out.write(f"built {build_zip(target)}\n")
    if env is not None:
        out.write(f"built {env}  (ship with --archives {env.name}#{ENV_ALIAS})\n")
    return 0


def run_submit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.env is not None and not os.path.isfile(args.env):
        raise PackagingError(
            f"--env {args.env}: no such archive; build it with python -m jobmanager package --env"
        )
    if args.env is None and not _local(args.master):
        err.write(
            "note: no --env: the executors' Python must have absflow's dependencies "
            "(pyspark, pyzmq, msgpack, lz4, cloudpickle) installed\n"
        )
    req = SubmitRequest(
        master=args.master,
        script=args.script,
        py_files=str(build_zip(Path(args.out)).resolve()),
        deploy_mode=args.deploy_mode,
        env_archive=os.path.abspath(args.env) if args.env else None,
        conf=tuple(args.conf),
        script_args=tuple(args.script_args),
    )
    argv = submit_line(req)
    out.write(shlex.join(argv) + "\n")
    out.flush()
    if args.dry_run:
        return 0
    return subprocess.run(argv, check=False).returncode


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``package`` or ``submit`` command; PackagingError ends it with exit code 2."""
    try:
        if args.command == "package":
            return run_package(args, out)
        return run_submit(args, out, err)
    except PackagingError as error:
        err.write(f"error: {error}\n")
        return 2
