"""Keyed state at scale: what checkpoints cost when state is large and little of it
changes, incremental checkpoints against whole ones (issue 38's table).

    python benchmarks/state_scale.py                       # 10 M keys, 3 rounds
    python benchmarks/state_scale.py --keys 1000000 --rounds 2     # a quicker look
    python benchmarks/state_scale.py --restore-only        # restore time only
    python benchmarks/state_scale.py --disk                # the rocksdb backend only
    python benchmarks/state_scale.py --disk --disk-keys 2000000 --budget-mb 16  # quicker

Workload (p = 2, checkpoints every ``--interval`` s, tasks on the local launcher): a
keyed running sum ``aggregate(0, lambda c, x: c + (x & 7))`` over int keys (not the
running count, which has a fast path of its own). Two shapes:

* **once**: ``--keys`` records, each key once (the state grows to ``--keys`` keys);
* **hot**: ``--keys`` records, each key once, then as many again over 1 % of the keys.

Each round runs, per shape, in an order rotated from round to round: no checkpoints;
whole checkpoints (``incremental_checkpoints=False``, as before); incremental (the
default). Per setting it prints, over the rounds: processing time (submit to the end,
less start-up) as a ratio to the round's run without checkpoints (median and range),
checkpoint duration p50 / p99 (pooled), bytes written per checkpoint (median) and the
whole state per checkpoint, and the tasks' peak RSS. The sink keeps a checksum of the
output (exactly once): every run must agree with the others.

Disk (``--disk``): the rocksdb backend (``state_backend="rocksdb"``) under a task memory
budget (``--budget-mb``, 256 MiB by default) on ``--disk-keys`` keys (30 M by default),
each once, with checkpoints: keyed state many times the budget (the in-memory estimate
of it is printed). The output digest is checked against the one computed directly (each
key's running sum is ``key & 7``); the tasks' peak RSS is printed against the budget.
Then the throughput of both backends on a state that fits in memory (``--fit-keys``).

Restore: a state of ``--keys`` keys with a chain of 20 deltas (1 % of the keys each),
restored in this process through the chain (``runtime.changelog.restore_chains``)
against the same state restored from one whole snapshot file; median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.results import RESULTS_DIR, read_result, write_result
from channels.partitioners import key_group_for
from runtime import Dataflow
from runtime.changelog import ChainWrite, KeyedChangelog, restore_chains
from runtime.sinks import Sink
from runtime.sources import GeneratorSource
from statebackend.keyed import KeyedStateBackend
from statebackend.metadata import OperatorLayout, TaskStateHandle
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage

MAX_PARALLELISM = 128
SETTINGS = ("none", "whole", "incremental")


class ChecksumSink(Sink):
    """Counts records and sums their values (mod 2**61): a small, checkpointed digest of
    the output, sent to the driver with the final checkpoint."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.n, self.digest = 0, 0
        self.done = False
        self.final: int | None = None  # the checkpoint taken after finish()
        self.sent = False

    def write_batch(self, records: list[Any]) -> None:
        self.n += len(records)
        self.digest = (self.digest + sum(acc for _, acc in records)) % (1 << 61)

    def snapshot_state(self, checkpoint_id: int) -> Any:
        if self.done and self.final is None:
            self.final = checkpoint_id
        return [self.n, self.digest]

    def restore_state(self, state: Any) -> None:
        if state:
            self.n, self.digest = state

    def finish(self) -> None:
        self.done = True

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # only the final checkpoint's: an earlier one completing after finish() (a slow
        # checkpoint on a loaded machine) would send the digest twice
        if self.final is not None and checkpoint_id >= self.final and not self.sent:
            self.sent = True
            self.ctx.send_to_driver(checkpoint_id, [[self.n, self.digest]])
            self.done = False


def add_low_bits(acc: int, x: int) -> int:
    return acc + (x & 7)


def build(shape: str, keys: int, setting: str, interval: float, **extra: Any) -> Dataflow:
    """The keyed running sum; ``extra``: JobConfig settings (e.g. ``state_backend``)."""
    hot = max(1, keys // 100)

    def once(i: int) -> int:
        return i

    def then_hot(i: int) -> int:
        return i if i < keys else (i * 7919) % hot

    records = keys if shape == "once" else 2 * keys
    config: dict[str, Any] = {"launcher": "local", "ui": False, "progress": False, **extra}
    if setting != "none":
        config["checkpoint_interval"] = interval
        config["incremental_checkpoints"] = setting == "incremental"
    flow = Dataflow(f"state-scale-{shape}", parallelism=2, **config)
    (
        flow.source(GeneratorSource(once if shape == "once" else then_hot, records), name="keys")
        .key_by(lambda k: k)
        .aggregate(0, add_low_bits, name="sum")
        .sink(ChecksumSink(), name="digest")
    )
    return flow


def run_once(shape: str, keys: int, setting: str, interval: float, **extra: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="absflow-state-scale-") as chk:
        flow = build(shape, keys, setting, interval, **extra)
        result = flow.run(checkpoint_dir=chk) if setting != "none" else flow.run()
    steady = [c.encode() for c in result.checkpoints if not c.final]
    digest = sorted(tuple(x) for x in result.outputs.get("digest", []))
    return {
        "seconds": result.duration - (result.startup_seconds or 0.0),
        "durations": [c["duration_ms"] for c in steady],
        "written": [c["state_bytes"] for c in steady],
        "full": [c.get("full_state_bytes", c["state_bytes"]) for c in steady],
        "rss": max(result.peak_rss.values(), default=0),
        "digest": [sum(n for n, _ in digest), sum(d for _, d in digest) % (1 << 61)],
        "restarts": len(result.restarts),
    }


def expected_once_digest(keys: int) -> list[int]:
    """The digest of shape "once" computed directly: key k's only sum is ``k & 7``."""
    return [keys, ((keys // 8) * 28 + sum(range(keys % 8))) % (1 << 61)]


def disk_figures(
    disk_keys: int, fit_keys: int, budget_mb: float, interval: float
) -> dict[str, Any]:
    """The rocksdb backend on state many times its budget, and both backends' throughput
    on a state that fits (see the module docstring)."""
    # the in-memory backend's estimate of the same state (statebackend.keyed.sizeof)
    probe = KeyedStateBackend("sum", MAX_PARALLELISM, range(MAX_PARALLELISM), lambda k: 0)
    values = probe.value_state()
    for k in range(100_000):
        values[k * 300] = k & 7
    per_key = probe.estimated_bytes() / 100_000
    in_memory_mib = disk_keys * per_key / 2**20 / 2  # per task, p = 2
    # heartbeat_timeout 60 s: the machine is shared (load 30-50 while this was written), and
    # a checkpoint's synchronous part (the dirty cache written back, RocksDB's flush) can
    # hold the task loop past the default 15 s there
    rocks = {
        "state_backend": "rocksdb",
        "state_memory_budget_mb": budget_mb,
        "heartbeat_timeout": 60.0,
    }
    big = run_once("once", disk_keys, "incremental", interval, **rocks)
    exact = big["digest"] == expected_once_digest(disk_keys)
    out: dict[str, Any] = {
        "keys": disk_keys,
        "budget_mib": budget_mb,
        "state_in_memory_mib_per_task": in_memory_mib,
        "state_over_budget": in_memory_mib / budget_mb,
        "exact": exact,
        "restarts": big["restarts"],
        "seconds": big["seconds"],
        "records_per_s": disk_keys / big["seconds"],
        "checkpoints": len(big["durations"]),
        "duration_p50_ms": pct(big["durations"], 0.5),
        "duration_p99_ms": pct(big["durations"], 0.99),
        "written_median_bytes": statistics.median(big["written"]) if big["written"] else 0,
        "full_median_bytes": statistics.median(big["full"]) if big["full"] else 0,
        "peak_rss_mib": big["rss"] / 2**20,
    }
    print(
        f"\nrocksdb, {disk_keys:,} keys once, budget {budget_mb:g} MiB per task (in memory "
        f"that state would take ~{in_memory_mib:,.0f} MiB per task, {out['state_over_budget']:.1f}x "
        f"the budget): {'exact' if exact else 'OUTPUT DIFFERS'} (digest {big['digest']}, "
        f"{big['restarts']} restarts), {big['seconds']:.1f} s, "
        f"{out['records_per_s']:,.0f} records/s, {out['checkpoints']} checkpoints "
        f"p50/p99 {out['duration_p50_ms']:.0f}/{out['duration_p99_ms']:.0f} ms, written "
        f"{out['written_median_bytes'] / 1e6:.1f} MB of {out['full_median_bytes'] / 1e6:.1f} MB "
        f"per checkpoint; peak task RSS {out['peak_rss_mib']:.0f} MiB against the budget of "
        f"{budget_mb:g} MiB",
        flush=True,
    )
    fits: dict[str, Any] = {}
    for backend in ("memory", "rocksdb"):
        extra: dict[str, Any] = {"state_backend": backend, "heartbeat_timeout": 60.0}
        if backend == "rocksdb":
            extra["state_memory_budget_mb"] = budget_mb
        r = run_once("once", fit_keys, "incremental", interval, **extra)
        if r["digest"] != expected_once_digest(fit_keys):
            raise SystemExit(f"ERROR: the {backend} run's output differs")
        fits[backend] = {
            "seconds": r["seconds"],
            "records_per_s": fit_keys / r["seconds"],
            "peak_rss_mib": r["rss"] / 2**20,
        }
    out["fits"] = {"keys": fit_keys, **fits}
    print(
        f"a state that fits ({fit_keys:,} keys once, checkpoints every {interval:g} s): memory "
        f"{fits['memory']['records_per_s']:,.0f} records/s, rocksdb "
        f"{fits['rocksdb']['records_per_s']:,.0f} records/s "
        f"({fits['rocksdb']['records_per_s'] / fits['memory']['records_per_s']:.2f}x)"
    )
    if not exact:
        raise SystemExit("ERROR: the rocksdb run's output differs from the direct computation")
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def restore_times(keys: int, rounds: int) -> dict[str, float]:
    """Seconds to restore ``keys`` keys: a base and 20 deltas against one whole file."""
    groups = range(0, MAX_PARALLELISM)

    def kg(k: Any) -> int:
        return key_group_for(k, MAX_PARALLELISM)

    live = KeyedStateBackend("sum", MAX_PARALLELISM, groups, kg)
    state = live.value_state()
    state.update((k, k & 7) for k in range(keys))  # not tracked: the base is whole
    live.track_changes()
    with tempfile.TemporaryDirectory(prefix="absflow-restore-") as root:
        storage = CheckpointStorage(root)
        changelog = KeyedChangelog("sum[0]", 0, True, 0, 10_000)
        chains: dict[str, Any] = {}
        hot = max(1, keys // 100)
        for n in range(1, 22):  # a base and 20 deltas of 1 % each
            if n > 1:
                assert live.changed is not None
                for k in range(n * hot, (n + 1) * hot):
                    state[k % keys] = state[k % keys] + 1
                    live.changed.add(k % keys)
            assert changelog.capture(n, "sum", live, storage)
            staged = changelog.take()
            assert isinstance(staged, ChainWrite)
            chains, _ = staged.write(storage)
        layout = {"sum": OperatorLayout(0, 1, (0, MAX_PARALLELISM))}
        whole = storage.write_task_state(
            999, "sum[0]", {"sum": OperatorSnapshot(None, live.snapshot(), groups)}, layout
        )
        chained = TaskStateHandle("", 0, 0, layout, None, chains)
        out: dict[str, list[float]] = {"chain": [], "whole": []}
        for _ in range(rounds):
            fresh = KeyedStateBackend("sum", MAX_PARALLELISM, groups, kg)
            started = time.perf_counter()
            restore_chains(fresh, "sum", [chained], storage)
            out["chain"].append(time.perf_counter() - started)
            assert fresh.value_state() == state
            fresh = KeyedStateBackend("sum", MAX_PARALLELISM, groups, kg)
            started = time.perf_counter()
            fresh.restore(storage.read_keyed_state(999, whole, "sum", groups), written_for=groups)
            out["whole"].append(time.perf_counter() - started)
            assert fresh.value_state() == state
    return {
        "chain_s": statistics.median(out["chain"]),
        "whole_s": statistics.median(out["whole"]),
        "chain_files": len(chains["sum"]),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = runs["none"]
    out: dict[str, Any] = {}
    for setting in SETTINGS:
        rs = runs[setting]
        ratios = [r["seconds"] / b["seconds"] for r, b in zip(rs, base, strict=True)]
        durations = [d for r in rs for d in r["durations"]]
        written = [w for r in rs for w in r["written"]]
        full = [f for r in rs for f in r["full"]]
        out[setting] = {
            "seconds_median": statistics.median(r["seconds"] for r in rs),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "checkpoints": len(durations) // max(1, len(rs)),
            "duration_p50_ms": pct(durations, 0.5),
            "duration_p99_ms": pct(durations, 0.99),
            "written_median_bytes": statistics.median(written) if written else 0,
            "full_median_bytes": statistics.median(full) if full else 0,
            "peak_rss_mib": max(r["rss"] for r in rs) / 2**20,
        }
    return out


def show(shape: str, figures: dict[str, Any]) -> None:
    print(f"\n{shape}: p = 2; ratio = processing time / no checkpoints (median [min-max])")
    print(
        f"  {'setting':<12} {'ratio':>22} {'ckpts':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'written/ckpt':>13} {'state/ckpt':>11} {'RSS MiB':>8}"
    )
    for setting, f in figures.items():
        ratio = f"{f['ratio_median']:.2f}x [{f['ratio_min']:.2f}-{f['ratio_max']:.2f}]"
        print(
            f"  {setting:<12} {ratio:>22} {f['checkpoints']:>6} {f['duration_p50_ms']:>8.0f} "
            f"{f['duration_p99_ms']:>8.0f} {f['written_median_bytes'] / 1e6:>11.1f}MB "
            f"{f['full_median_bytes'] / 1e6:>9.1f}MB {f['peak_rss_mib']:>8.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--shapes", nargs="+", default=["hot", "once"], choices=["hot", "once"])
    ap.add_argument("--restore-only", action="store_true")
    ap.add_argument("--disk", action="store_true", help="the rocksdb rows only")
    ap.add_argument("--disk-keys", type=int, default=30_000_000)
    ap.add_argument("--fit-keys", type=int, default=1_000_000)
    ap.add_argument("--budget-mb", type=float, default=256)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.disk:  # its own rows of the result file, stamped apart: the others are kept
        disk = disk_figures(args.disk_keys, args.fit_keys, args.budget_mb, args.interval)
        with tempfile.TemporaryDirectory() as scratch:  # this run's stamp
            stamp = read_result(
                "state_scale", write_result("state_scale", {}, directory=Path(scratch)).parent
            )
        disk["stamp"] = {k: stamp[k] for k in ("command", "commit", "date", "machine")}
        try:
            doc = read_result("state_scale")
        except FileNotFoundError:
            doc = {**stamp, "figures": {}}
        doc["figures"]["disk"] = disk
        path = RESULTS_DIR / "state_scale.json"
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {path}")
        return 0
    results: dict[str, Any] = {"keys": args.keys, "interval_s": args.interval}
    if not args.restore_only:
        for shape in args.shapes:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
            for round_no in range(args.rounds):
                order = SETTINGS[round_no % 3 :] + SETTINGS[: round_no % 3]
                for setting in order:
                    r = run_once(shape, args.keys, setting, args.interval)
                    runs[setting].append(r)
                    print(
                        f"  round {round_no + 1} {shape} {setting}: {r['seconds']:.1f} s, "
                        f"{len(r['durations'])} checkpoints",
                        flush=True,
                    )
            digests = {tuple(r["digest"]) for rs in runs.values() for r in rs}
            if len(digests) != 1:
                print(f"ERROR: the runs disagree on the output: {digests}")
                return 1
            results[shape] = summarize(runs)
            show(shape, results[shape])
    restore = restore_times(args.keys, max(1, args.rounds))
    results["restore"] = restore
    print(
        f"\nrestore of {args.keys:,} keys: a base and {restore['chain_files'] - 1} deltas "
        f"{restore['chain_s']:.2f} s, one whole file {restore['whole_s']:.2f} s "
        f"({restore['chain_s'] / restore['whole_s']:.2f}x)"
    )
    path = write_result("state_scale", results, rounds=args.rounds)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
