"""The records of ``benchmarks/evaluate.py``'s runs, and their JSON form in its result
file (``benchmarks/results/evaluate.json``), from which ``benchmarks/render.py`` writes
``docs/evaluation.md``: the measurement and the page are one path, never two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from paper_topology import latency_hist, percentile

MODES: dict[str, dict[str, Any]] = {
    "exactly_once": {"snapshot_mode": "exactly_once"},
    "synchronous": {"snapshot_mode": "synchronous"},
    "unaligned": {"snapshot_mode": "unaligned"},
    "at_least_once": {"snapshot_mode": "at_least_once"},
    "aligned_timeout": {"snapshot_mode": "exactly_once", "aligned_timeout": 0.05},
}

# The per-checkpoint figures the report reads; the rest of a checkpoint's summary is not
# kept in the result file.
CHECKPOINT_KEYS = (
    "duration_ms",
    "queueing_ms",
    "alignment_ms",
    "write_ms",
    "halt_ms",
    "drain_ms",
    "max_alignment_ms",
    "channel_state_bytes",
)


@dataclass(frozen=True)
class Config:
    """One configuration of a run: a snapshot mode at an interval, or no checkpoints."""

    mode: str | None
    interval: float | None = None

    @property
    def label(self) -> str:
        return "none" if self.mode is None else f"{self.mode}@{self.interval}"

    def settings(self) -> dict[str, Any]:
        if self.mode is None:
            return {}
        return {"checkpoint_interval": self.interval, **MODES[self.mode]}


@dataclass(frozen=True)
class Setting:
    seconds: float
    repeat: int
    parallelism: int
    intervals: list[float]
    other_modes: list[str]  # beside ABS and synchronous, at 0.5 s
    throttle: float
    throttled: list[Config]
    parallelisms: list[int]
    backpressure_modes: list[str]
    backpressure_n: int = 500_000
    hot_sleep: float = 0.00004
    # Fig. 7 (fixed data, p grows): the paper checkpoints every 3 s there.
    scaling_interval: float = 3.0
    launcher: str = "spark"

    def full_speed(self) -> list[Config]:
        configs = [Config(None)]
        for interval in self.intervals:
            configs += [Config("exactly_once", interval), Config("synchronous", interval)]
        return configs + [Config(m, 0.5) for m in self.other_modes]

    @property
    def scaling_label(self) -> str:
        return Config("exactly_once", self.scaling_interval).label

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Setting:
        return cls(**{**doc, "throttled": [Config(**c) for c in doc["throttled"]]})


@dataclass(frozen=True)
class Run:
    """The figures of one finished run."""

    processing: float
    checkpoints: list[dict[str, Any]]
    failed: int
    latency_ms: dict[float, float]  # end-to-end latency quantile (0.5, 0.99) -> ms

    QUANTILES = (0.5, 0.99)

    @classmethod
    def of(cls, result: Any) -> Run:
        """From a ``JobResult``: processing time (start-up taken off), the periodic
        checkpoints' figures, failed checkpoints, the sinks' latency histogram."""
        return cls(
            processing=result.duration - (result.startup_seconds or 0.0),
            checkpoints=[
                {k: v for k, v in c.encode().items() if k in CHECKPOINT_KEYS and v is not None}
                for c in result.checkpoints
                if not c.final
            ],
            failed=len(result.failed_checkpoints),
            latency_ms={f: percentile(hist, f) for f in cls.QUANTILES}
            if (hist := latency_hist(result))
            else {},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "processing": round(self.processing, 4),
            "failed": self.failed,
            "latency_ms": {str(f): ms for f, ms in self.latency_ms.items()},
            "checkpoints": [
                {k: round(float(v), 3) for k, v in c.items() if k in CHECKPOINT_KEYS}
                for c in self.checkpoints
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Run:
        return cls(
            processing=float(doc["processing"]),
            checkpoints=list(doc["checkpoints"]),
            failed=int(doc["failed"]),
            latency_ms={float(f): float(ms) for f, ms in doc["latency_ms"].items()},
        )


@dataclass(frozen=True)
class Study:
    """Runs per configuration label, in rounds (``runs[label][round]``)."""

    n: int
    rate: float | None = None
    runs: dict[str, list[Run]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "rate": self.rate,
            "runs": {label: [r.to_json() for r in runs] for label, runs in self.runs.items()},
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Study:
        return cls(
            n=int(doc["n"]),
            rate=doc["rate"],
            runs={label: [Run.from_json(r) for r in runs] for label, runs in doc["runs"].items()},
        )


@dataclass(frozen=True)
class Evaluation:
    """Everything one ``evaluate.py`` run measured: the ``figures`` of its result file."""

    setting: Setting
    capacity: float
    full: Study
    throttled: Study
    scaling: dict[int, Study]  # the full-speed study stands for p = setting.parallelism
    backpressure: Study
    recovery: dict[str, tuple[float | None, bool]]
    elapsed: float

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting.to_json(),
            "capacity": round(self.capacity, 1),
            "full": self.full.to_json(),
            "throttled": self.throttled.to_json(),
            "scaling": {
                str(p): s.to_json()
                for p, s in self.scaling.items()
                if p != self.setting.parallelism
            },
            "backpressure": self.backpressure.to_json(),
            "recovery": {m: [sec, ok] for m, (sec, ok) in self.recovery.items()},
            "elapsed": round(self.elapsed, 1),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Evaluation:
        setting = Setting.from_json(doc["setting"])
        full = Study.from_json(doc["full"])
        scaling = {int(p): Study.from_json(s) for p, s in doc["scaling"].items()}
        if setting.parallelism in setting.parallelisms:
            scaling[setting.parallelism] = full
        return cls(
            setting=setting,
            capacity=float(doc["capacity"]),
            full=full,
            throttled=Study.from_json(doc["throttled"]),
            scaling=dict(sorted(scaling.items())),
            backpressure=Study.from_json(doc["backpressure"]),
            recovery={m: (sec, bool(ok)) for m, (sec, ok) in doc["recovery"].items()},
            elapsed=float(doc["elapsed"]),
        )
