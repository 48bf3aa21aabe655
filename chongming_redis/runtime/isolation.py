"""Process isolation: run a task function in a child process.

For CPU-heavy work (the child has its own GIL) and for control that does not depend on the
task's cooperation: a stop kills the child, a pause stops it with SIGSTOP and a resume
continues it with SIGCONT, a lost lease kills it. The child's ``ctx.checkpoint()`` sends its
progress to the parent, which records it as usual; the parent (not the child) talks to the
store, so fencing and write-through are unchanged.

The function must be importable by name (a module-level function), because the child is
started with ``spawn`` (a clean interpreter, safe with the parent's threads).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

from chongming_redis.model import Progress
from chongming_redis.policy import class_names
from chongming_redis.runtime.app import TaskFunction
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped


class ChildFailed(Exception):
    """The task raised in its child process; carries the child's type name and traceback."""

    def __init__(
        self, error_type: str, message: str, child_traceback: str,
        names: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.error_type = error_type
        self.child_traceback = child_traceback
        #: the exception's classes, itself first, as ``policy.class_names`` names them: the
        #: parent matches a retry policy through the child's hierarchy
        self.names = names


class _ChildContext:
    """The ``ctx`` a task sees in the child: checkpoints go to the parent over a pipe."""

    def __init__(
        self, conn: Connection, task_id: str, attempt: int, parents: dict[str, Any]
    ) -> None:
        self._conn = conn
        self.task_id = task_id
        self.attempt = attempt
        self._parents = parents

    def parent_results(self) -> dict[str, Any]:
        """``TaskContext.parent_results``, read by the parent before the child began."""
        return dict(self._parents)

    def checkpoint(
        self,
        progress: Progress | None = None,
        *,
        current: int | float | None = None,
        total: int | float | None = None,
        message: str | None = None,
    ) -> None:
        if progress is None and current is not None:
            progress = Progress(current, total, message)
        self._conn.send(("beat", progress))


def _child_main(
    conn: Connection,
    fn_ref: tuple[str, str],
    params: Any,
    task_id: str,
    attempt: int,
    parents: dict[str, Any],
) -> None:
    try:
        fn = _resolve(fn_ref)
        result = fn(_ChildContext(conn, task_id, attempt, parents), params)
        conn.send(("result", result))
    except BaseException as exc:
        conn.send(
            ("error", type(exc).__name__, str(exc), traceback.format_exc(), class_names(type(exc)))
        )
    finally:
        conn.close()


def _reference(fn: Any) -> tuple[str, str]:
    """The function by name: the child imports it (the module attribute is the
    ``TaskFunction`` that ``@app.task()`` returned, not the function itself)."""
    return fn.__module__, fn.__qualname__


def _resolve(ref: tuple[str, str]) -> Any:
    module_name, qualname = ref
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found.fn if isinstance(found, TaskFunction) else found


def run_in_process(ctx: TaskContext, fn: Any, params: Any, poll: float = 0.05) -> Any:
    """Run ``fn(child_ctx, params)`` in a child process and mirror the parent's control onto
    it. Returns the result; raises ``TaskStopped``/``TaskLost`` after killing the child, or
    ``ChildFailed`` if the task raised."""
    spawn = multiprocessing.get_context("spawn")
    parent_end, child_end = spawn.Pipe(duplex=False)
    parents = ctx.parent_results() if ctx.parents else {}  # the child has no store
    child = spawn.Process(
        target=_child_main,
        args=(child_end, _reference(fn), params, ctx.task_id, ctx.attempt, parents),
        daemon=True,
    )
    child.start()
    child_end.close()
    stopped_by_us = False
    try:
        while True:
            if ctx.timed_out and ctx.lost_reason is None and not ctx.stop_requested:
                _terminate(child, grace=TIMEOUT_GRACE)
                raise ctx.timeout_error()
            if ctx.lost_reason is not None or ctx.stop_requested:
                child.kill()
                child.join()
                if ctx.lost_reason is not None:
                    raise TaskLost(ctx.task_id, f"task {ctx.task_id!r}: {ctx.lost_reason}")
                raise TaskStopped(ctx.task_id, f"task {ctx.task_id!r}: stop requested")
            if ctx.paused != stopped_by_us and child.pid is not None:
                os.kill(child.pid, signal.SIGSTOP if ctx.paused else signal.SIGCONT)
                stopped_by_us = ctx.paused
            if parent_end.poll(poll):
                try:
                    message = parent_end.recv()
                except EOFError:
                    child.join()
                    raise ChildFailed("ChildDied", f"exit code {child.exitcode}", "") from None
                if message[0] == "beat":
                    ctx.record(message[1])
                elif message[0] == "result":
                    child.join()
                    return message[1]
                else:
                    child.join()
                    raise ChildFailed(message[1], message[2], message[3], tuple(message[4]))
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        parent_end.close()


#: How long a child past its timeout has to exit after SIGTERM before it is killed.
TIMEOUT_GRACE = 2.0


def _terminate(child: Any, *, grace: float) -> None:
    """SIGTERM (and SIGCONT, in case a pause froze it), then SIGKILL after ``grace`` s."""
    child.terminate()
    if child.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGCONT)
    child.join(grace)
    if child.is_alive():
        child.kill()
        child.join()
