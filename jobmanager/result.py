"""What ``Dataflow.run()`` returns: outputs of collect sinks, restarts, checkpoints, figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Restart:
    attempt: int  # the attempt that failed
    reason: str
    restored_checkpoint: int | None  # what the next attempt restored (None: from scratch)
    failed_at: float  # wall clock
    resumed_at: float | None = None  # first record processed by the next attempt (wall clock)

    @property
    def recovery_seconds(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.failed_at


@dataclass
class JobResult:
    name: str
    outputs: dict[str, list[Any]]
    duration: float
    records_in: int  # read by the sources, over all attempts (replays count again)
    records_out: int  # received by the sinks, over all attempts
    startup_seconds: float | None  # submit -> first record processed
    restarts: list[Restart] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    failed_checkpoints: list[dict[str, Any]] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    task_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    unfired_faults: list[str] = field(default_factory=list)  # injected kills the job outran

    def output(self, name: str | None = None) -> list[Any]:
        """Records of the collect sink ``name`` (may be omitted when there is one)."""
        if name is None:
            if len(self.outputs) != 1:
                raise KeyError(f"the job has collect sinks {sorted(self.outputs)}; name one")
            return next(iter(self.outputs.values()))
        if name not in self.outputs:
            raise KeyError(f"no collect sink named {name!r}; collect sinks: {sorted(self.outputs)}")
        return self.outputs[name]

    @property
    def records_per_second(self) -> float:
        return self.records_in / self.duration if self.duration > 0 else 0.0

    def summary(self) -> str:
        lines = [
            f"job '{self.name}': {self.records_in:,} records in, {self.records_out:,} out "
            f"in {self.duration:.2f} s ({self.records_per_second:,.0f} records/s)"
        ]
        if self.startup_seconds is not None:
            lines.append(f"  start-up (submit -> first record): {self.startup_seconds:.2f} s")
        done = [c for c in self.checkpoints if not c.get("final")]
        if self.checkpoints:
            durations = sorted(c["duration_ms"] for c in self.checkpoints)
            lines.append(
                f"  checkpoints: {len(done)} completed + final, "
                f"{len(self.failed_checkpoints)} failed, median duration "
                f"{durations[len(durations) // 2]:.1f} ms"
            )
        for r in self.restarts:
            restored = (
                f"checkpoint {r.restored_checkpoint}" if r.restored_checkpoint else "the start"
            )
            rec = (
                f", processing again after {r.recovery_seconds:.2f} s" if r.recovery_seconds else ""
            )
            lines.append(
                f"  restart after attempt {r.attempt} failed ({r.reason}): restored {restored}{rec}"
            )
        if not self.restarts:
            lines.append("  restarts: 0")
        for fault in self.unfired_faults:
            lines.append(f"  fault not fired: {fault}")
        if self.peak_rss:
            lines.append(f"  peak task RSS: {max(self.peak_rss.values()) / 2**20:.0f} MiB")
        return "\n".join(lines)
