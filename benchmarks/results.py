"""Benchmark results as files: each benchmark run writes one JSON document under
``benchmarks/results/`` naming its command, date, commit and machine, so that the docs'
figures are rendered from measurements and never retyped.

    from benchmarks.results import write_result
    write_result("checkpoint_cost", {"overhead": {...}}, rounds=20)

A result file is ``benchmarks/results/<name>.json`` (the latest run of that benchmark;
older runs live in git history). ``figures`` is the benchmark's own JSON-able record;
``rounds`` how many interleaved rounds its medians and intervals come from.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The load when the benchmark started (it imports this module first), beside the load at
# the end: the machine is shared, and a figure is read against the load it ran under.
_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    return subprocess.run(
        ["git", *args], cwd=here, capture_output=True, text=True, check=True
    ).stdout.strip()


def tree_commit() -> str:
    """The checked-out commit, ``+dirty`` when tracked files differ from it (the result
    files themselves excepted: a benchmark that records after each part rewrites its own)."""
    try:
        out = _git("rev-parse", "--short", "HEAD")
        dirty = _git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ":/",
            ":(exclude,top)benchmarks/results",
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{out}+dirty" if dirty else out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python and the load (1-minute average) the machine had when the
    benchmark started and when the run ended."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "loadavg_1m": round(load[0], 2),
        "loadavg_1m_start": round(_LOAD_AT_START[0], 2),
    }


def write_result(
    name: str,
    figures: dict[str, Any],
    *,
    rounds: int | None = None,
    argv: list[str] | None = None,
    directory: Path | None = None,
) -> Path:
    """Write ``<directory>/<name>.json`` (default ``benchmarks/results/``) and return it."""
    args = sys.argv if argv is None else argv
    command = "python " + " ".join(
        [os.path.relpath(args[0], Path(__file__).resolve().parent.parent), *args[1:]]
        if args
        else []
    )
    doc = {
        "benchmark": name,
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": tree_commit(),
        "machine": machine(),
        "rounds": rounds,
        "figures": figures,
    }
    target = Path(directory) if directory is not None else RESULTS_DIR
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_result(name: str, directory: Path | None = None) -> dict[str, Any]:
    """The latest result of benchmark ``name``; FileNotFoundError names the command to run."""
    path = (Path(directory) if directory is not None else RESULTS_DIR) / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: run the benchmark {name!r} (see benchmarks/{name}.py) "
            "to write it."
        ) from None


def stamp(doc: dict[str, Any]) -> str:
    """One line naming where a result's figures come from: the command, the commit, the
    date and the machine (cores, CPU, Python, load at the end of the run)."""
    m = doc.get("machine", {})
    rounds = doc.get("rounds")
    return (
        f"`{doc['command']}` at commit `{doc['commit']}`, {doc['date']}"
        + (f", {rounds} round{'s' if rounds != 1 else ''}" if rounds else "")
        + f"; {m.get('cores', '?')} cores ({m.get('cpu', '?')}), Python "
        f"{m.get('python', '?')}, load "
        + (
            f"{m['loadavg_1m_start']} at the start and {m.get('loadavg_1m', '?')} at the end"
            if "loadavg_1m_start" in m
            else f"{m.get('loadavg_1m', '?')} at the end"
        )
        + " (1-minute averages)"
    )
