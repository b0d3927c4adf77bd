"""The watermark a restored task starts from, for every task (not only those whose
operators keep one in their own state).

Every task's ack records its watermark at the snapshot (``AckMetrics.watermark``, in the
checkpoint's ``_metadata``), so a task without an event-time operator (a map between a
timestamp assigner and a window, say) also comes back at its watermark instead of minus
infinity. A chain at its old parallelism starts from its own subtask's; a chain restored
at another parallelism (a keyed window rescaled) from the **minimum** over its old
subtasks: each of them had fired every timer up to its own watermark, so nothing due at
or below that minimum is left, and nothing above it is declared late too early.

A task whose metrics have no watermark (it had seen none, or its input had ended) counts
as ``NO_WATERMARK``: never higher than what it had.
"""

from __future__ import annotations

from runtime.watermarks import NO_WATERMARK
from statebackend.metadata import CheckpointMetadata


def chain_of(task_id: str) -> str:
    """``"count[1]"`` -> ``"count"``."""
    return task_id.rpartition("[")[0] or task_id


def restored_watermark(metadata: CheckpointMetadata, task_id: str, parallelism: int) -> float:
    """The watermark task ``task_id`` of a chain now at ``parallelism`` starts from (see
    the module docstring); ``NO_WATERMARK`` when the chain is not in ``metadata``."""
    chain = chain_of(task_id)
    old = {t: m for t, m in metadata.task_metrics.items() if chain_of(t) == chain}
    if not old:
        return NO_WATERMARK
    marks = {t: NO_WATERMARK if m.watermark is None else float(m.watermark) for t, m in old.items()}
    if len(old) == parallelism and task_id in old:  # the same subtasks: its own
        return marks[task_id]
    return min(marks.values())
