"""What an iteration run returns: the final state and an account of the run, failures
and recoveries included (``summary()`` prints it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["IterationResult", "RecoveryRecord"]


@dataclass(frozen=True)
class RecoveryRecord:
    """One failure and how the next attempt started. ``kind``: ``optimistic`` (rescued
    survivors + compensation), ``checkpoint`` (the last complete superstep checkpoint)
    or ``start`` (the initial state). ``note`` says why when it fell back."""

    failed_during: int
    kind: str
    resumed_from: int
    lost_partitions: tuple[int, ...]
    reason: str
    note: str = ""
    mass_after: float | None = None  # sum of the values after recovery (PageRank: 1.0)
    seconds: float = 0.0  # failure seen -> next attempt's first superstep started

    @property
    def rerun(self) -> int:
        """Supersteps that run again because of this failure."""
        return self.failed_during - self.resumed_from


@dataclass
class IterationResult:
    name: str
    solution: dict[Any, Any]
    supersteps: int
    converged: bool
    attempts: int
    seconds: float
    supersteps_started: int
    recovery_mode: str
    aggregates: list[tuple[int, float]] = field(default_factory=list)
    superstep_seconds: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    checkpoint_seconds: float = 0.0
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    checkpoint_root: str | None = None  # kept after the run (Recovery(checkpoint_dir=...))

    @property
    def rerun(self) -> int:
        return sum(r.rerun for r in self.recoveries)

    def summary(self) -> str:
        lines = [
            f"iteration '{self.name}': {self.supersteps} supersteps "
            f"({'converged' if self.converged else 'stopped at max_supersteps'}), "
            f"{self.seconds:.2f} s, {self.attempts} attempt(s), recovery={self.recovery_mode}, "
            f"{self.supersteps_started} supersteps started in all"
        ]
        if self.checkpoints:
            where = f" under {self.checkpoint_root}" if self.checkpoint_root else ""
            lines.append(f"  superstep checkpoints completed{where}: {self.checkpoints}")
        for r in self.recoveries:
            line = (
                f"  failure during superstep {r.failed_during} ({r.reason}): {r.kind} recovery "
                f"from superstep {r.resumed_from}, {r.rerun} superstep(s) re-run"
            )
            if r.lost_partitions:
                line += f", lost partitions {list(r.lost_partitions)}"
            if r.mass_after is not None:
                line += f", sum of values after recovery {r.mass_after:.6f}"
            lines.append(line)
            if r.note:
                lines.append(f"    note: {r.note}")
        return "\n".join(lines)
