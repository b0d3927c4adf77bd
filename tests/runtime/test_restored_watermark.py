"""The watermark a restored task starts from (runtime/restored_watermark.py): its own
subtask's at the same parallelism, the minimum over the old subtasks otherwise."""

from __future__ import annotations

from runtime.restored_watermark import chain_of, restored_watermark
from statebackend.metadata import CheckpointMetadata
from statebackend.metrics import AckMetrics, CheckpointSummary

NO = float("-inf")


def metadata(**marks: float | None) -> CheckpointMetadata:
    """A checkpoint whose tasks (``merge_0=42`` for task ``merge[0]``) acked these
    watermarks."""
    metrics = {
        name.rpartition("_")[0] + f"[{name.rpartition('_')[2]}]": AckMetrics(watermark=mark)
        for name, mark in marks.items()
    }
    return CheckpointMetadata(
        7, "et", 0, False, 0.0, 0.0, 1.0, 128, {}, metrics, CheckpointSummary()
    )


def test_own_subtask_at_the_same_parallelism_else_the_minimum() -> None:
    meta = metadata(w_0=40.0, w_1=70.0, other_0=5.0)
    assert restored_watermark(meta, "w[1]", 2) == 70.0
    assert restored_watermark(meta, "w[0]", 2) == 40.0
    assert restored_watermark(meta, "w[2]", 3) == 40.0  # rescaled 2 -> 3: the minimum
    assert restored_watermark(metadata(w_0=40.0, w_1=70.0, w_2=9.0), "w[0]", 2) == 9.0  # 3 -> 2
    assert restored_watermark(metadata(w_0=40.0, w_1=None), "w[1]", 2) == NO  # saw none
    assert restored_watermark(meta, "new[0]", 1) == NO  # not in the checkpoint


def test_the_chain_of_a_task_is_its_name_before_the_subtask() -> None:
    assert chain_of("count[1]") == "count"
    assert chain_of("a[b][12]") == "a[b]"
    assert chain_of("driver") == "driver"


def test_a_chain_whose_name_prefixes_another_is_not_mixed_with_it() -> None:
    meta = metadata(w_0=40.0, w_1=70.0, ww_0=1.0)
    assert restored_watermark(meta, "w[2]", 3) == 40.0  # not ww[0]'s 1.0
    assert restored_watermark(meta, "ww[0]", 1) == 1.0
