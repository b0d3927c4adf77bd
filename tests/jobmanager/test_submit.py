"""``python -m jobmanager package`` and ``submit`` without Spark: the zip's contents, the
env packing errors, and the spark-submit lines built for standalone and YARN."""

from __future__ import annotations

import io
import shlex
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from jobmanager import cli, packaging
from jobmanager.submit import SubmitRequest, submit_line
from runtime.errors import PackagingError

SUBMIT = "/opt/spark/bin/spark-submit"
CLUSTER = {  # every cluster master: fixed executors, barrier slots re-checked every second
    "spark.dynamicAllocation.enabled": "false",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "120",
}


def request(master: str, **kw: Any) -> SubmitRequest:
    return SubmitRequest(
        master=master,
        script="job.py",
        py_files="/b/absflow.zip",
        spark_submit=SUBMIT,
        driver_python="/venv/bin/python",
        **kw,
    )


def confs(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_standalone_client_line() -> None:
    argv = submit_line(request("spark://h:7077", script_args=("--words", "10")))
    assert argv == [
        SUBMIT,
        "--master",
        "spark://h:7077",
        "--deploy-mode",
        "client",
        "--conf",
        "spark.dynamicAllocation.enabled=false",
        "--conf",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval=1s",
        "--conf",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures=120",
        "--conf",
        "spark.pyspark.driver.python=/venv/bin/python",
        "--py-files",
        "/b/absflow.zip",
        "job.py",
        "--words",
        "10",
    ]


def test_standalone_with_a_packed_env_ships_it_and_runs_executors_in_it() -> None:
    argv = submit_line(request("spark://h:7077", env_archive="/b/env.tar.gz"))
    assert argv[argv.index("--archives") + 1] == "/b/env.tar.gz#env"
    assert confs(argv) == {
        **CLUSTER,
        "spark.pyspark.driver.python": "/venv/bin/python",
        "spark.executorEnv.PYSPARK_PYTHON": "./env/bin/python",
        "spark.pyspark.python": "./env/bin/python",
    }


def test_yarn_client_mode_driver_here_executors_in_the_archive() -> None:
    argv = submit_line(request("yarn", env_archive="/b/env.tar.gz"))
    assert argv[argv.index("--deploy-mode") + 1] == "client"
    assert argv[argv.index("--archives") + 1] == "/b/env.tar.gz#env"
    assert confs(argv) == {
        **CLUSTER,
        "spark.pyspark.driver.python": "/venv/bin/python",
        "spark.executorEnv.PYSPARK_PYTHON": "./env/bin/python",
        "spark.yarn.appMasterEnv.PYSPARK_PYTHON": "./env/bin/python",
        "spark.pyspark.python": "./env/bin/python",
    }
    assert argv[-2:] == ["/b/absflow.zip", "job.py"]


def test_yarn_cluster_mode_runs_driver_and_executors_in_the_archive() -> None:
    argv = submit_line(request("yarn", deploy_mode="cluster", env_archive="/b/env.tar.gz"))
    assert confs(argv) == {
        **CLUSTER,
        "spark.executorEnv.PYSPARK_PYTHON": "./env/bin/python",
        "spark.yarn.appMasterEnv.PYSPARK_PYTHON": "./env/bin/python",
        "spark.yarn.appMasterEnv.PYSPARK_DRIVER_PYTHON": "./env/bin/python",
    }
    assert "/venv/bin/python" not in " ".join(argv)  # this host's Python is not on the cluster


def test_the_users_conf_comes_last_and_local_masters_keep_spark_defaults() -> None:
    argv = submit_line(request("local[4]", conf=(("spark.ui.enabled", "false"),)))
    assert confs(argv) == {
        "spark.pyspark.driver.python": "/venv/bin/python",
        "spark.ui.enabled": "false",
    }


@pytest.mark.parametrize(
    ("master", "kw", "message"),
    [
        ("spark://h:7077", {"deploy_mode": "cluster"}, "only on YARN and Kubernetes"),
        ("yarn", {"deploy_mode": "server"}, "use one of client, cluster"),
        (
            "yarn",
            {"conf": (("spark.dynamicAllocation.enabled", "true"),)},
            "need a fixed set of executors",
        ),
    ],
)
def test_lines_spark_would_reject_late_are_refused_now(
    master: str, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(PackagingError, match=message):
        submit_line(request(master, **kw))


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_zip_holds_the_four_packages_and_is_reproducible(tmp_path: Path) -> None:
    code, out, _ = run_cli("package", "--out", str(tmp_path / "a"))
    assert code == 0 and out == f"built {tmp_path / 'a' / 'absflow.zip'}\n"
    first = (tmp_path / "a" / "absflow.zip").read_bytes()
    names = zipfile.ZipFile(tmp_path / "a" / "absflow.zip").namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == set(packaging.PACKAGES)
    assert "runtime/__init__.py" in names and "jobmanager/submit.py" in names
    assert all(n.endswith(".py") for n in names)
    packaging.build_zip(tmp_path / "b")
    assert (tmp_path / "b" / "absflow.zip").read_bytes() == first


def test_package_env_without_venv_pack_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "venv_pack", None)  # import venv_pack -> ImportError
    code, out, err = run_cli("package", "--out", str(tmp_path), "--env")
    assert code == 2 and out == ""
    assert "pip install 'absflow[cluster]'" in err
    assert not (tmp_path / "absflow.zip").exists()


def test_submit_dry_run_builds_the_zip_and_only_prints(tmp_path: Path) -> None:
    code, out, err = run_cli(
        "submit",
        "--master",
        "spark://h:7077",
        "--out",
        str(tmp_path),
        "--conf",
        "spark.cores.max=4",
        "--dry-run",
        "examples/wordcount.py",
        "--words",
        "1000",
    )
    assert code == 0 and "no --env" in err
    argv = shlex.split(out)
    assert argv[argv.index("--py-files") + 1] == str(tmp_path / "absflow.zip")
    assert (tmp_path / "absflow.zip").is_file()
    assert confs(argv)["spark.cores.max"] == "4"
    assert argv[-3:] == ["examples/wordcount.py", "--words", "1000"]


def test_submit_with_a_missing_env_archive_says_how_to_build_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "env.tar.gz")
    code, _, err = run_cli("submit", "--master", "yarn", "--env", missing, "job.py")
    assert code == 2 and f"--env {missing}: no such archive" in err
    assert "package --env" in err


def test_submit_passes_the_exit_code_through(tmp_path: Path) -> None:
    fake = tmp_path / "spark-submit"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    home = tmp_path / "home" / "bin"
    home.mkdir(parents=True)
    (home / "spark-submit").symlink_to(fake)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARK_HOME", str(tmp_path / "home"))
        code, out, _ = run_cli("submit", "--master", "local[2]", "--out", str(tmp_path), "j.py")
    assert code == 3 and shlex.split(out)[:3] == [
        str(home / "spark-submit"),
        "--master",
        "local[2]",
    ]
