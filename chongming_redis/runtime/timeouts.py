"""Timeouts: how an attempt that runs past its task type's ``timeout`` is ended.

Three layers, each a backstop for the one before: the task itself (``ctx.checkpoint()`` raises
``TaskTimeout``; an ``async def`` task is cancelled; an ``isolation="process"`` child gets
SIGTERM then SIGKILL), its worker's supervisor (``end_overdue``: a thread that does not
checkpoint is ended ``timeout_grace`` seconds later all the same, its late result discarded),
and any worker's reconcile (``endings.overdue_in_store``: a task still ``RUNNING`` past the deadline
its start recorded plus the grace — its holder wedged or gone while its lease is renewed — is
ended by compare-and-set, which fences whatever its holder writes next). A timeout is a failure
with ``error_type`` ``"TaskTimeout"``, retried or not by the task's policy.
"""

from __future__ import annotations

import logging

from chongming_redis.model import Failure, TaskStatus
from chongming_redis.policy import TaskTimeout
from chongming_redis.runtime.held import Held
from chongming_redis.runtime.runner import Runner

log = logging.getLogger("chongming_redis.runtime")


def end_overdue(runner: Runner, held: Held) -> None:
    """A held task past its timeout + grace that has not ended: its function runs without a
    checkpoint (a thread wedged in C code, a loop that never checks in), or it still waits for
    a slot (prefetched). Ended ``FAILED``/``TaskTimeout`` now (retried if its policy says so),
    whatever the thread does next — ``TaskWriter.end`` is claimed once, so its late result is
    discarded; one that waited never begins. A running thread's slot stays taken until it
    returns (a thread cannot be killed); the other slots go on."""
    writer = runner.writer
    begun = not runner.claim_unbegun(held)  # one that waits for a slot never begins now
    how = "it did not stop at a checkpoint" if begun else "it waited for a slot that long"
    failure = Failure("TaskTimeout", f"{held.ctx.timeout_error()}; {how}, so its worker "
                      "ended it")  # fmt: skip
    retry = "timed out" if writer.policy_of(held.snapshot).retries_type(TaskTimeout) else None
    reason = "timed out: still running past its timeout and grace"
    if not writer.end(held, TaskStatus.FAILED, reason, failure=failure, retry_after=retry):
        return
    log.warning("%s: %s ran past its timeout (%s); ended FAILED (TaskTimeout)", writer.owner,
                held.task_id, how)  # fmt: skip
    writer.events.task_timed_out(held.snapshot.name)
    held.done = True
    held.final_outcome = TaskStatus.FAILED.value
    writer.flush(held)
    if not begun:  # no thread holds a slot for it: settled as any finished task
        runner.settle(held)
        return
    # Answered and let go as Runner.settle does, but still counted as outstanding: the thread
    # holds its slot until it returns (then Runner._free_slot releases it).
    for command_id in held.stop_commands:
        writer.complete(command_id, writer.clock.now(), held.final_outcome)
    if not held.pending:
        runner.held.forget(held)
