"""The user's API: build a ``Dataflow`` of streams and run it (``runtime.api.testing`` runs
it without Spark). This package is the only part of ``runtime`` that calls the job
manager; the task side (task loop, chain, operators, barriers) never imports it."""

from runtime.api.dataflow import (
    ConnectedStreams,
    Dataflow,
    KeyedStream,
    Loop,
    Stream,
    WindowedStream,
)

__all__ = ["ConnectedStreams", "Dataflow", "KeyedStream", "Loop", "Stream", "WindowedStream"]
