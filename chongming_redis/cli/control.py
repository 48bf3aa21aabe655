"""The CLI commands that act on tasks and report what happened: ``stop``, ``pause``, ``resume``
(wait for the holder's outcome and print it with the latency), ``retry``, ``result``, ``wait``,
and ``prune`` (drop the oldest finished tasks).

Exit status: 0 done (a result, or a command applied), 1 a user error (unknown task, Redis
unreachable, bad input), 3 the task ended without a result (failed, stopped, lost), 4 no
answer in time (the task is still under way, or nobody answered a command).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from chongming_redis.cli.common import (
    ClusterOpt,
    DurabilityOpt,
    JsonOpt,
    NamespaceOpt,
    RedisOpt,
    StoreOpt,
    UserError,
    console,
    err,
    open_store,
    progress,
    user_errors,
)
from chongming_redis.cli.json_output import plain
from chongming_redis.cli.registry import Commands
from chongming_redis.outcomes import TaskFailed, TaskOutcome

if TYPE_CHECKING:
    from chongming_redis.client.client import Client

commands = Commands()
ENDED_WITHOUT_RESULT = 3
NO_ANSWER = 4
#: ``prune``: terminal tasks dropped per step of the progress bar.
PRUNE_STEP = 1000

TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="seconds to wait for the outcome", min=0.0)
]


def open_client(
    redis_url: str | None,
    namespace: str,
    store_url: str | None,
    durability_replicas: int = 0,
    cluster: bool = False,
) -> Client:
    from chongming_redis.client.client import Client

    name = f"cli-{os.uname().nodename}-{os.getpid()}"
    store = open_store(redis_url, namespace, store_url=store_url,
                       durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
    return Client(store, name=name, owns_store=True)


# -- stop / pause / resume ---------------------------------------------------------------------

#: What each outcome means, for the line the user reads.
_MEANING = {
    "already-terminal": "it had already finished",
    "no-change": "nothing to change",
    "succeeded": "it finished before it reached a checkpoint that saw the stop",
    "failed": "it failed before it reached a checkpoint that saw the stop",
    "already-paused": "it was already paused",
    "not-paused": "it was not paused",
}


def control_command(action: str) -> Callable[..., None]:
    def command(
        task_id: Annotated[str, typer.Argument(help="the task's id (as `tasks` prints it)")],
        wait: Annotated[
            bool, typer.Option("--wait/--no-wait", help="wait for the holder's outcome")
        ] = True,
        timeout: TimeoutOpt = 30.0,
        json_out: JsonOpt = False,
        redis: RedisOpt = None,
        store_url: StoreOpt = None,
        namespace: NamespaceOpt = "default",
        durability_replicas: DurabilityOpt = 0,
        cluster: ClusterOpt = False,
    ) -> None:
        with user_errors():
            from chongming_redis.client.client import CommandTimeout

            client = open_client(redis, namespace, store_url, durability_replicas, cluster)
            began = time.monotonic()
            try:
                outcome = getattr(client, action)(task_id, wait=wait, timeout=timeout)
            except CommandTimeout as exc:
                _report_timeout(action, task_id, exc, time.monotonic() - began, json_out)
                return
            finally:
                client.close()
            if outcome == "no-such-task":
                raise UserError(f"no task {task_id!r} in namespace {namespace!r}")
            _report_outcome(action, task_id, outcome, time.monotonic() - began, json_out)

    command.__name__ = action
    command.__doc__ = (
        f"{action.capitalize()} a task, wherever it runs, and print the outcome.\n\n"
        f"Waits (at most --timeout) until the task's holder has acted: `{action} ID` prints "
        f"e.g. `{action} of task 250ef4a4…: {_DONE[action]} after 31 ms`. A task nobody "
        "runs is changed at once.\n\n"
        f"Example: chongming-redis {action} 250ef4a44e1bd7a2c0f9 --redis redis://127.0.0.1:6379/0"
    )
    return command


_DONE = {"stop": "stopped", "pause": "paused", "resume": "resumed"}


def _report_outcome(action: str, task_id: str, outcome: str, took: float, json_out: bool) -> None:
    sent = outcome.startswith("sent:")
    command_id = outcome.removeprefix("sent:") if sent else None
    if json_out:
        document = {"task_id": task_id, "action": action, "outcome": "sent" if sent else outcome,
                    "command_id": command_id, "latency_ms": round(took * 1000, 1)}  # fmt: skip
        print(json.dumps(document))
    elif sent:
        console.print(f"{action} of task {task_id}: sent (command {command_id}); not waiting",
                      highlight=False, soft_wrap=True)  # fmt: skip
    else:
        meaning = _MEANING.get(outcome)
        suffix = f" ({meaning})" if meaning else ""
        console.print(f"{action} of task {task_id}: {outcome}{suffix} after {_ms(took)}",
                      highlight=False, soft_wrap=True)  # fmt: skip


def _report_timeout(action: str, task_id: str, exc: Exception, took: float, json_out: bool) -> None:
    if json_out:
        document = {"task_id": task_id, "action": action, "outcome": "no-answer",
                    "command_id": getattr(exc, "command_id", None),
                    "latency_ms": round(took * 1000, 1)}  # fmt: skip
        print(json.dumps(document))
    else:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(NO_ANSWER)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


# -- retry / result / wait ---------------------------------------------------------------------


def retry(
    task_id: Annotated[str, typer.Argument(help="a failed, stopped or lost task")],
    json_out: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Give a FAILED, STOPPED or LOST task a new attempt (PENDING now, any worker runs it).

    Example: chongming-redis retry 250ef4a44e1bd7a2c0f9
    """
    with user_errors():
        from chongming_redis.client.client import TaskNotFound

        client = open_client(redis, namespace, store_url, durability_replicas, cluster)
        try:
            client.retry(task_id)
            snapshot = client.get(task_id)
        except TaskNotFound as exc:
            raise UserError(f"{exc} in namespace {namespace!r}") from None
        finally:
            client.close()
        attempt = None if snapshot is None else snapshot.attempt
        if json_out:
            print(json.dumps({"task_id": task_id, "outcome": "pending", "attempt": attempt}))
        else:
            console.print(f"task {task_id}: retried, attempt {attempt} is pending",
                          highlight=False, soft_wrap=True)  # fmt: skip


def result(
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Print a finished task's result as JSON; exit 3 if it ended without one.

    Exit 4 while it is still under way (`result` never waits: see `wait`).

    Example: chongming-redis result 250ef4a44e1bd7a2c0f9 | jq .width
    """
    with user_errors():
        waited = _wait_all([task_id], (redis, store_url), namespace, timeout=0.0,
                           json_out=True, bar=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
    raise typer.Exit(waited)


def wait(
    task_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="one or more task ids")],
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds (default: no limit)", min=0.0)
    ] = None,
    json_out: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Wait until the tasks finish; print one line per task with its outcome and result.

    Exit 0 when every task succeeded, 3 when one ended without a result (failed, stopped,
    lost), 4 when one was still under way after --timeout.

    Example: chongming-redis wait 250ef4a44e1bd7a2c0f9 9c1d... --timeout 60
    """
    with user_errors():
        status = _wait_all(task_ids, (redis, store_url), namespace, timeout=timeout,
                           json_out=json_out, bar=len(task_ids) > 1,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
    raise typer.Exit(status)


def _wait_all(task_ids: list[str], urls: tuple[str | None, str | None], namespace: str, *,
              timeout: float | None, json_out: bool, bar: bool,
              durability_replicas: int = 0, cluster: bool = False) -> int:  # fmt: skip
    """Wait for each task in turn (one shared deadline); the exit status."""
    from chongming_redis.client.client import TaskNotFinished, TaskNotFound

    client = open_client(urls[0], namespace, urls[1], durability_replicas, cluster)
    missing = [task_id for task_id in task_ids if client.get(task_id) is None]
    if missing:  # refused before waiting for the others: no half-written report
        client.close()
        raise UserError(f"no task {missing[0]!r} in namespace {namespace!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    worst = 0
    with _progress(len(task_ids), bar) as advance:
        for task_id in task_ids:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                value = client.wait(task_id, timeout=left)
                _print_result(task_id, "succeeded", value, None, json_out)
            except TaskNotFound as exc:
                client.close()
                raise UserError(f"{exc} in namespace {namespace!r}") from None
            except TaskOutcome as exc:
                _print_result(task_id, _status(exc), None, exc, json_out)
                worst = max(worst, ENDED_WITHOUT_RESULT)
            except TaskNotFinished as exc:
                _print_result(task_id, exc.snapshot.status.value, None, exc, json_out)
                worst = max(worst, NO_ANSWER)
            advance()
    client.close()
    return worst


def _status(exc: TaskOutcome) -> str:
    return exc.snapshot.status.value if exc.snapshot is not None else type(exc).__name__


def _print_result(task_id: str, status: str, value: Any, exc: Exception | None,
                  json_out: bool) -> None:  # fmt: skip
    if json_out:
        document: dict[str, Any] = {"task_id": task_id, "status": status}
        if exc is None:
            document["result"] = plain(value)
        else:
            document["error"] = str(exc)
            if isinstance(exc, TaskFailed) and exc.failure is not None:
                document["failure"] = {"error_type": exc.failure.error_type,
                                       "message": exc.failure.message}  # fmt: skip
        print(json.dumps(document), flush=True)
        return
    if exc is None:
        console.print(f"{task_id} {status} {json.dumps(plain(value))}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    else:
        console.print(f"{task_id} {status}: {exc}", highlight=False, soft_wrap=True)


class _progress:
    """A progress bar on stderr when it is a terminal and there is more than one task."""

    def __init__(self, total: int, wanted: bool) -> None:
        self.total = total
        self.wanted = wanted and sys.stderr.isatty()
        self._bar: Any = None

    def __enter__(self) -> Callable[[], None]:
        if not self.wanted:
            return lambda: None
        from rich.progress import Progress

        self._bar = Progress(console=err, transient=True)
        self._bar.start()
        task = self._bar.add_task("waiting", total=self.total)
        return lambda: self._bar.advance(task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def prune(
    keep: Annotated[int, typer.Option(help="terminal tasks to keep (the newest)")] = 1000,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Drop the oldest terminal tasks beyond --keep, with their history."""
    with user_errors():
        if keep < 0:
            raise UserError(f"--keep must be at least 0, not {keep}")
        store = open_store(redis, namespace, store_url=store_url,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        terminal = sum(n for s, n in store.counts().items() if s.is_terminal)
        to_drop = max(0, terminal - keep)
        dropped = 0
        with progress("pruning", to_drop, shown=None if to_drop > PRUNE_STEP else False) as advance:
            # Steps that keep ever fewer: each drops the oldest, as one prune would.
            for target in range(terminal - PRUNE_STEP, keep, -PRUNE_STEP):
                n = store.prune(keep_terminal=target)
                dropped += n
                advance(n)
            n = store.prune(keep_terminal=keep)
            dropped += n
            advance(n)
        console.print(f"pruned {dropped} task(s)", highlight=False)


for _action in ("stop", "pause", "resume"):
    commands.add(control_command(_action), name=_action)
for _command in (retry, result, wait):
    commands.add(_command)
commands.add(prune, epilog="Example: chongming-redis prune --keep 10000")
register = commands.register
