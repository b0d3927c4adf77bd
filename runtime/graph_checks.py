"""Whole-graph checks that depend on the job's settings (called by Dataflow.validate)."""

from __future__ import annotations

from runtime.config import JobConfig, SnapshotMode
from runtime.errors import GraphError
from runtime.graph import LogicalGraph, StepKind


def check_mode_fits(graph: LogicalGraph, config: JobConfig) -> None:
    """Loops checkpoint with cyclic ABS (aligned regular inputs, logged back-edges)."""
    if not config.records_channel_state:
        return
    loop = next((s for s in graph.steps if s.kind is StepKind.ITERATE), None)
    if loop is not None:
        what = (
            "snapshot_mode='unaligned'"
            if config.snapshot_mode is SnapshotMode.UNALIGNED
            else "aligned_timeout"
        )
        raise GraphError(
            f"loop '{loop.name}': {what} is not supported on dataflows with loops (their "
            "back-edge logs need aligned regular inputs); use snapshot_mode='exactly_once' "
            "(cyclic ABS, the default) or 'at_least_once', without aligned_timeout."
        )
