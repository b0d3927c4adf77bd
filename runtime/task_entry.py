"""The task process's entry point, whatever launched it.

``run_task`` runs once per task process: it binds its input gates, exchanges the
endpoints with every other task of the attempt (``exchange``: all tasks' messages, in
task order), then builds, opens and runs its `Task` (``runtime.task``) and always
closes what it opened, gracefully or not.

``run_barrier_task`` is the Spark barrier task's (index and host from the
`BarrierTaskContext`, the exchange through the driver's rendezvous,
``channels.rendezvous``: Spark's own ``allGather`` takes a second); ``runtime.local_entry``
is the local launcher's (the exchange through the job manager's pipes).
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from collections.abc import Callable
from typing import Any

import zmq

from channels.rendezvous import gather
from channels.security import Guard
from channels.zmq_io import InputGate, local_namespace
from runtime import control as P
from runtime.errors import TaskCancelled
from runtime.plan import JobPlan
from runtime.scheduling import task_scheduling
from runtime.task import Task
from runtime.task_environment import TaskEnvironment
from runtime.task_gc import task_gc
from runtime.task_io import ZmqTaskIO

__all__ = ["Exchange", "barrier_task_address", "run_barrier_task", "run_task"]

# One message (this task's endpoints, JSON) in, every task's messages (task order) out.
Exchange = Callable[[str], list[str]]


def run_barrier_task(plan: JobPlan, env: TaskEnvironment, rendezvous: str) -> list[Any]:
    """Entry point inside a Spark barrier task (the Python worker process); ``rendezvous``
    is the endpoint of the driver's `channels.rendezvous.Rendezvous` for this attempt."""
    index, host = barrier_task_address()
    exchange = functools.partial(gather, rendezvous, index, keys=env.channel_keys)
    return run_task(plan, env, index, host, exchange)


def barrier_task_address() -> tuple[int, str]:
    """Inside a Spark barrier task: its partition index and the address of its executor
    (what its gates bind on)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
    with contextlib.suppress(OSError):
        host = socket.gethostbyname(host)  # bind needs an address, Spark may give a name
    return index, host


def run_task(
    plan: JobPlan, env: TaskEnvironment, index: int, host: str, exchange: Exchange
) -> list[Any]:
    """Run task ``index`` of ``plan`` on ``host`` (the address its gates bind on), under
    the configured ``task_scheduling`` (set before the ZeroMQ context's I/O threads start,
    so that they inherit it; restored after) and ``gc_threshold``."""
    with task_scheduling(env.config.task_scheduling), task_gc(env.config.gc_threshold):
        return _run_task(plan, env, index, host, exchange)


def _run_task(
    plan: JobPlan, env: TaskEnvironment, index: int, host: str, exchange: Exchange
) -> list[Any]:
    spec = plan.tasks[index]
    zctx = zmq.Context()
    guard: Guard | None = None
    gate: InputGate | None = None
    feedback: InputGate | None = None
    priority: InputGate | None = None
    task: Task | None = None
    graceful = False
    try:
        if env.channel_keys is not None:  # before any gate binds: it answers their handshakes
            guard = Guard(zctx, env.channel_keys, f"task {spec.task_id}").start()
        hwm = env.config.channel_hwm
        rcvbuf = env.config.socket_buffer
        gate = (
            InputGate(zctx, host, rcvhwm=hwm, rcvbuf=rcvbuf, guard=guard)
            if spec.regular_inputs
            else None
        )
        feedback = InputGate(zctx, host, rcvhwm=hwm, guard=guard) if spec.back_edge_inputs else None
        if spec.regular_inputs and env.config.barriers_overtake:
            priority = InputGate(zctx, host, rcvhwm=1000, guard=guard)
        here = local_namespace() if env.config.local_channels else None
        local = gate.bind_local() if gate is not None and here is not None else ""
        gathered = exchange(
            json.dumps(
                [index, *(g.endpoint if g else "" for g in (gate, feedback, priority)), here, local]
            )
        )
        exchanged = [json.loads(m) for m in gathered]
        # A sender in the receiver's namespace takes its Unix socket, any other its TCP port.
        endpoints = {
            i: lo if lo and ns is not None and ns == here else ep
            for i, ep, _fb, _pr, ns, lo in exchanged
        }
        feedback_endpoints = {i: fb for i, _ep, fb, _pr, _ns, _lo in exchanged if fb}
        priority_endpoints = {i: pr for i, _ep, _fb, pr, _ns, _lo in exchanged if pr}
        io = ZmqTaskIO(
            zctx,
            gate,
            endpoints,
            env.config,
            env.jm_endpoint,
            P.peer_identity(index, env.attempt, env.run_id),
            feedback,
            feedback_endpoints,
            priority,
            priority_endpoints,
            guard,
        )
        task = Task(plan, spec, env, io, host)
        task.open()
        task.run()
        graceful = True
    except TaskCancelled:
        pass
    finally:
        if task is not None:
            task.close(graceful)
        for g in (gate, feedback, priority):
            if g is not None:
                g.close()
        if guard is not None:
            guard.close()
        # Closes whatever a half-built Task left open (term() alone would wait forever),
        # giving a queued Failed message up to a second to leave.
        zctx.destroy(linger=1000)
    return []
