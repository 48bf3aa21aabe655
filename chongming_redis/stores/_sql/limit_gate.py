"""The admission of one SQL ``start_tasks`` call (``Gate``): the limits judged in start order,
the lines of the refs that refused a task, and its **parked** tasks. The rules are
``_sql/limits.py``'s (holders, waiters, lines); this module adds the parking:

* a ``PENDING`` task a full concurrency ref refuses is parked (``tasks.parked`` = that ref):
  the start order index is partial (``parked IS NULL``), so a flooded ref's backlog is not even
  read by a start, whatever its size;
* a start that finds such a ref with room again unparks its oldest parked tasks, as many as the
  room (passing over those another blocked line holds); a candidate of it that another ref
  refuses during the walk gives its place to the next parked one, and the walk reads its page
  again, so the tasks of the ref start in the order the in-memory reference starts them;
* any other write of the row clears ``parked`` (a saved task is judged afresh).
"""

from __future__ import annotations

from collections.abc import Sequence

from chongming_redis.limits import Concurrency, Limit, RateLimit, ref_limit_id, refill
from chongming_redis.stores._sql.limits import _UNLIMITED, _limits, refs_of
from chongming_redis.stores._sql.rows import integer, text
from chongming_redis.stores._sql.schema import Tx, ready_ms, store_clock_us
from chongming_redis.stores.codec import Row

#: Rows a limited start walk reads per query once it refused one (a refused row waits in a
#: blocked line, left out of the next page, so a walk through a newly flooded ref takes few).
PAGE = 64
#: The start walk's condition: not waiting in a blocked line.
NOT_BLOCKED = (
    "NOT EXISTS (SELECT 1 FROM limit_waiters AS w JOIN limit_lines AS l ON l.ref = w.ref"
    " WHERE w.task_id = tasks.task_id AND l.blocked = 1)"
)
# -- the admission of one start call -----------------------------------------------------------


class Gate:
    """The limits as one start call judges them, in start order (``admit``); ``None`` from
    ``open_gate`` when no limit is recorded (every ref then limits nothing)."""

    def __init__(self, tx: Tx, limits: dict[str, Limit], caller_us: int) -> None:
        self._tx, self._limits, self._caller_us = tx, limits, caller_us
        self._now_us: int | None = None  # read once, when a rate ref is first met
        self._held: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, int]] = {}
        self._spent: set[str] = set()
        self._refused: set[str] = set()
        self._blocked: set[str] = set()  # the lines blocked now (limit_lines)
        #: Set when a refusal unparked a task: the walk reads its page again from the start.
        self.reread = False

    def judge_lines(self) -> None:
        """Judge every line (a ref with waiters) once, in one statement: blocked while it has
        no room. Exact for the whole call: a start only takes slots and tokens, so a line full
        now stays full until the call ends, and the walk may leave its waiters out."""
        rooms: list[tuple[str, int]] = []
        for ref_raw, blocked, held, waiting, tokens, at in self._tx.rows(_LINES):
            ref = text(ref_raw)
            if not waiting:
                self._tx.run("DELETE FROM limit_lines WHERE ref = ?", [ref])
                continue
            self._held[ref] = int(held)
            limit = self._limits.get(ref_limit_id(ref))
            if isinstance(limit, RateLimit):
                found = None if tokens is None else (float(tokens), integer(at, ref, "at_us"))
                self._buckets[ref] = self._tokens(found, limit)
            room = self._room(ref)
            full = room < 1
            if not full and isinstance(limit, Concurrency):
                rooms.append((ref, room))
            if full:
                self._blocked.add(ref)
            if full != bool(blocked):
                self._tx.run("UPDATE limit_lines SET blocked = ? WHERE ref = ?", [int(full), ref])
        # Room again: as many of a ref's oldest parked tasks back into the start order (a flood
        # stays parked), passing over those another blocked line holds (the walk would leave
        # them out). One that another worker's buckets hold may stay out of this walk: it is
        # refused and parked again once the ref is full, so the unparked stay about the room.
        for ref, room in rooms:
            self._unpark(ref, room)

    def _unpark(self, ref: str, count: int) -> None:
        """``count`` of ``ref``'s oldest parked tasks (no other blocked line holds) back into
        the start order: a page read after this one walks them."""
        self._tx.run(_UNPARK.format(ready=ready_ms(self._tx.dialect)), [ref, ref, count])

    @property
    def refused_any(self) -> bool:
        """Whether this call refused a candidate (its walk then reads pages of ``PAGE``)."""
        return bool(self._refused)

    def admit(self, row: Row) -> bool:
        """Whether ``row`` (the next candidate in start order) may start now; if so its
        slots and tokens are counted as taken, else it waits under each ref that refused it,
        and those refs' lines are blocked: they refuse every later candidate of this call,
        and the next page of the walk leaves their waiters out."""
        refs = refs_of(row)
        blocking = [ref for ref in refs if ref in self._refused or self._room(ref) < 1]
        if blocking:
            self._refused.update(blocking)
            self._wait(text(row["task_id"]), blocking)
            for ref in refs:  # its place in a ref with room: the next of that ref's parked
                if ref not in blocking and isinstance(self._limits.get(ref_limit_id(ref)),
                                                      Concurrency):  # fmt: skip
                    self._unpark(ref, 1)
                    self.reread = True  # it may come before the rest of this page
            return False
        for ref in refs:
            limit = self._limits.get(ref_limit_id(ref))
            if isinstance(limit, Concurrency):
                self._held[ref] += 1
            elif isinstance(limit, RateLimit):
                tokens, at = self._buckets[ref]
                self._buckets[ref] = (tokens - 1.0, at)
                self._spent.add(ref)
        return True

    def close(self) -> None:
        """Write the buckets this call spent from."""
        for ref in sorted(self._spent):
            tokens, at = self._buckets[ref]
            self._tx.run(
                "INSERT INTO limit_buckets (ref, tokens, at_us) VALUES (?, ?, ?)"
                " ON CONFLICT (ref) DO UPDATE SET tokens = excluded.tokens,"
                " at_us = excluded.at_us",
                [ref, tokens, at],
            )

    def _room(self, ref: str) -> int:
        limit = self._limits.get(ref_limit_id(ref))
        if isinstance(limit, Concurrency):
            if ref not in self._held:
                ((count,),) = self._tx.rows(
                    "SELECT COUNT(*) FROM limit_holders WHERE ref = ?", [ref]
                )
                self._held[ref] = int(count)
            return limit.max - self._held[ref]
        if isinstance(limit, RateLimit):
            if ref not in self._buckets:
                found = self._tx.rows(
                    "SELECT tokens, at_us FROM limit_buckets WHERE ref = ?", [ref]
                )
                stored = None
                if found:
                    stored = (float(found[0][0]), integer(found[0][1], ref, "at_us"))
                self._buckets[ref] = self._tokens(stored, limit)
            return int(self._buckets[ref][0])
        return _UNLIMITED

    def _tokens(self, stored: tuple[float, int] | None, limit: RateLimit) -> tuple[float, int]:
        """The bucket's tokens now and the moment they are counted to: a clock behind the
        last start refills nothing and never moves that moment back."""
        now = self._clock()
        if stored is None:
            return float(limit.burst or 1), now
        tokens, at = stored
        if now <= at:
            return tokens, at
        return refill(tokens, at, now, limit), now

    def _clock(self) -> int:
        if self._now_us is None:
            self._now_us = min(self._caller_us, store_clock_us(self._tx))
        return self._now_us

    def _wait(self, task_id: str, refs: Sequence[str]) -> None:
        full = next(
            (r for r in refs if isinstance(self._limits.get(ref_limit_id(r)), Concurrency)), None
        )
        if full is not None:  # parked: out of the start order until the ref has room
            self._tx.run("UPDATE tasks SET parked = ? WHERE task_id = ?", [full, task_id])
        for ref in refs:
            self._tx.run(
                "INSERT INTO limit_waiters (ref, task_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [ref, task_id],
            )
            if ref not in self._blocked:
                self._blocked.add(ref)
                self._tx.run(
                    "INSERT INTO limit_lines (ref, blocked) VALUES (?, 1)"
                    " ON CONFLICT (ref) DO UPDATE SET blocked = 1",
                    [ref],
                )


#: Each line with what judging it needs: its holders, whether it still has waiters, its
#: bucket (one statement per start call, each count a range of a primary key).
_LINES = (
    "SELECT l.ref, l.blocked, (SELECT COUNT(*) FROM limit_holders AS h WHERE h.ref = l.ref),"
    " (SELECT COUNT(*) FROM limit_waiters AS w WHERE w.ref = l.ref), b.tokens, b.at_us"
    " FROM limit_lines AS l LEFT JOIN limit_buckets AS b ON b.ref = l.ref"
)
#: A ref's oldest parked tasks (``tasks_parked``) back into the start order.
_UNPARK = (
    "UPDATE tasks SET parked = NULL WHERE task_id IN (SELECT task_id FROM tasks"
    " WHERE parked = ? AND NOT EXISTS (SELECT 1 FROM limit_waiters AS w JOIN limit_lines AS l"
    " ON l.ref = w.ref WHERE w.task_id = tasks.task_id AND l.blocked = 1 AND w.ref <> ?)"
    " ORDER BY priority DESC, {ready}, task_id LIMIT ?)"
)


def open_gate(tx: Tx, caller_us: int) -> Gate | None:
    """The gate of one start call, its lines judged; ``None`` when no limit is recorded."""
    limits = _limits(tx)
    if not limits:
        return None
    gate = Gate(tx, limits, caller_us)
    gate.judge_lines()
    return gate
