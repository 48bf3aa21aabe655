"""``CommandHandler``: control commands. Claims a batch, applies the ones for tasks this
process holds (stop, pause, resume), moves tasks nobody holds itself (a ``PENDING`` task, or one
paused before it started), and releases at once the commands for tasks another process holds,
so their holder can claim them."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from chongming_redis.model import Command, CommandKind, TaskSnapshot, TaskStatus
from chongming_redis.runtime.held import Held, advance, holder
from chongming_redis.runtime.notify import WORK
from chongming_redis.runtime.submission import unchanged, unheld_target
from chongming_redis.runtime.writer import TaskWriter
from chongming_redis.validation import check_identifier


class CommandHandler:
    def __init__(
        self,
        writer: TaskWriter,
        *,
        stop_unbegun: Callable[[Held], bool] = lambda held: False,
        release_unbegun: Callable[[Held], bool] = lambda held: False,
    ) -> None:
        """``stop_unbegun`` / ``release_unbegun``: settle a stopped / paused task whose
        function has not begun yet (prefetched) at once; False when it has begun (the
        runner's, given by the controller)."""
        self.writer = writer
        self.store = writer.store
        self.stop_unbegun = stop_unbegun
        self.release_unbegun = release_unbegun

    def control(self, task_id: str, kind: CommandKind, publish: Callable[[str], None]) -> str:
        """``Controller.stop/pause/resume``: act locally on a task this process holds;
        otherwise queue a command for the holder and nudge it (``publish`` its topic). Returns
        the outcome (local) or ``"sent:<command id>"``."""
        check_identifier(task_id, "task_id")
        held = self.writer.held.get(task_id)
        if held is not None and not held.done:
            return self.apply(held, kind, command_id=None)
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise ValueError(f"no task {task_id!r}")
        if snapshot.status.is_terminal:
            return "already-terminal"
        command_id = f"cmd-{secrets.token_hex(8)}"
        owner = self.writer.owner
        command = Command(command_id, task_id, kind, self.writer.clock.now(), issued_by=owner)
        self.store.submit_command(command)
        publish(holder(snapshot) or WORK)
        return f"sent:{command_id}"

    def handle_commands(self) -> int:
        """Claim and handle one batch of commands; returns how many were claimed."""
        now = self.writer.clock.now()
        claimed = self.store.claim_commands(
            now=now, lease_seconds=self.writer.config.command_lease, limit=50
        )
        for command in claimed:
            self._handle(command)
        return len(claimed)

    def _handle(self, command: Command) -> None:
        held = self.writer.held.get(command.task_id)
        if held is not None and not held.done:
            outcome = self.apply(held, command.kind, command.command_id)
            if outcome != "stopping":
                self.writer.complete(command.command_id, self.writer.clock.now(), outcome)
            return
        snapshot = self.store.get(command.task_id)
        now = self.writer.clock.now()
        if snapshot is None:
            self.writer.complete(command.command_id, now, "no-such-task")
        elif snapshot.status.is_terminal:
            self.writer.complete(command.command_id, now, "already-terminal")
        elif holder(snapshot) is None:
            outcome = self.control_unheld(snapshot, command)
            if outcome == "conflict-retry":  # it changed meanwhile: judged again at once
                self.store.release_command(command.command_id, now=now)
            else:
                self.writer.complete(command.command_id, now, outcome)
        else:  # held by another process: hand it back at once so the holder can claim it
            self.store.release_command(command.command_id, now=now)

    def control_unheld(self, snapshot: TaskSnapshot, command: Command) -> str:
        """Stop, pause or resume a task nobody runs (``PENDING``, or paused before it started
        or handed back paused)."""
        target = unheld_target(snapshot, command.kind)
        if target is None:
            return unchanged(snapshot, command.kind)
        now = self.writer.clock.now()
        reason = f"{command.kind.value} by {command.issued_by or '?'}"
        if not self.writer.move(snapshot, advance(snapshot, target, now), reason):
            return "conflict-retry"
        # The same words as for a held task and as a producer's own compare-and-set.
        return "resumed" if command.kind is CommandKind.RESUME else target.value

    def apply(self, held: Held, kind: CommandKind, command_id: str | None) -> str:
        """Act on a task this process holds; returns the outcome (``"stopping"``: the stop
        command is completed when the task has really ended)."""
        ctx, status = held.ctx, held.snapshot.status
        if kind is CommandKind.STOP:
            if command_id is not None:
                held.stop_commands.append(command_id)
            ctx.request_stop()
            ctx.set_paused(False)
            if self.stop_unbegun(held):  # it waited for a slot: STOPPED now, commands answered
                return "stopped" if command_id is None else "stopping"
            return "stopping"
        if kind is CommandKind.PAUSE:
            if status is TaskStatus.PAUSED:
                return "already-paused"
            if not self.writer.transition(held, TaskStatus.PAUSED, "pause requested"):
                return "already-terminal"  # it ended (or was handed back) meanwhile
            ctx.set_paused(True)
            self.writer.flush(held)
            self.release_unbegun(held)  # it waited for a slot: handed back paused, unheld
            return "paused"
        if status is not TaskStatus.PAUSED:
            return "not-paused"
        if not self.writer.transition(held, TaskStatus.RUNNING, "resume requested"):
            return "already-terminal"
        ctx.set_paused(False)
        self.writer.flush(held)
        return "resumed"
