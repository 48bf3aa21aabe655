"""Task policies in the runtime (issue 25): ``RetryPolicy`` per task type, frozen into each task;
``timeout`` per attempt, enforced by the holder and backed by the store's deadline; retention
swept by the workers; unique submits. On the in-memory reference and a real redis-server (the
``store`` fixture of ``tests/test_controller.py``); the stores' own duties are in the shipped
contract (``testing/extensions/task_policies.py``), real worker processes in
``tests/test_policy_processes.py``."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from chongming_redis import (
    App,
    Client,
    InMemoryTaskStore,
    NonRetryable,
    RetryPolicy,
    TaskContext,
    TaskStatus,
    TaskTimeout,
)
from chongming_redis.model import Failure
from chongming_redis.policy import DEFAULT_RETENTION, exception_name, worker_default
from chongming_redis.runtime.held import advance
from tests import test_controller
from tests.test_controller import FAST, wait_history, wait_status, wait_until
from tests.test_store_adapter import MinimalStore

P, R, OK, FAILED, LOST = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED,
                          TaskStatus.FAILED, TaskStatus.LOST)  # fmt: skip
# The controller tests' fixtures: ``store`` (memory, redis), ``make``, ``gate``.
store, make, gate = test_controller.store, test_controller.make, test_controller.gate
QUICK = RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=1.0, jitter=0.0)


class Flaky(Exception):
    pass


class VeryFlaky(Flaky):
    pass


# -- the policy itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 1.5}, TypeError),
        ({"base_delay": -1}, ValueError),
        ({"base_delay": math.nan}, ValueError),
        ({"max_delay": math.inf}, ValueError),
        ({"multiplier": 0.5}, ValueError),
        ({"jitter": 1.5}, ValueError),
        ({"retry_on": (int,)}, TypeError),
        ({"retry_on": ValueError}, TypeError),  # a class, not a tuple of them
        ({"no_retry_on": ("not a name",)}, TypeError),
        ({"retry_on": ("int",)}, TypeError),  # a builtin, not an exception
        ({"no_retry_on": ("ValueErorr",)}, TypeError),  # a typo of a builtin exception
    ],
)
def test_a_bad_retry_policy_is_refused(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**options)


def test_exceptions_match_through_the_class_hierarchy_by_name() -> None:
    assert RetryPolicy(retry_on=("myapp.errors.Flaky", "KeyError")).retry_on == (
        "myapp.errors.Flaky", "KeyError")  # fmt: skip
    policy = RetryPolicy(retry_on=(Flaky, "OSError"), no_retry_on=(VeryFlaky,))
    assert policy.retry_on == (exception_name(Flaky), "OSError")
    assert policy.retries(Flaky()) and policy.retries(ConnectionError())  # OSError's child
    assert not policy.retries(VeryFlaky())  # no_retry_on wins over its base class
    assert not policy.retries(ValueError())  # not in retry_on
    assert not RetryPolicy().retries(NonRetryable("never"))  # whatever retry_on says
    assert RetryPolicy().retries(ValueError())  # the default: Exception


def test_the_stored_form_round_trips_and_a_broken_one_is_refused() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=9.0, multiplier=3.0,
                         jitter=0.25, retry_on=(Flaky,), no_retry_on=(KeyError,))  # fmt: skip
    assert RetryPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ValueError):
        RetryPolicy.from_json('{"not": "a policy"}')


def test_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay=1.0, multiplier=3.0, max_delay=20.0, jitter=0.0)
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, 20.0]


# -- registration and submit: bad input, nothing written -----------------------------------------


@pytest.mark.parametrize(
    "options",
    [{"timeout": 0}, {"timeout": -1}, {"timeout": math.nan}, {"retention": 0},
     {"retention": -5.0}, {"retry": {"max_attempts": 3}}, {"timeout": "10"}],
)  # fmt: skip
def test_bad_policies_are_refused_at_registration(options: dict[str, Any]) -> None:
    app = App()
    with pytest.raises((TypeError, ValueError)):
        app.task("job", **options)(lambda ctx, params: None)
    assert "job" not in app.types


@pytest.mark.parametrize(
    "options",
    [{"timeout": -1.0}, {"retention": 0}, {"retry": 3}, {"unique": "u" * 1025}, {"unique": ""}],
)
def test_bad_policies_are_refused_at_submit_and_nothing_is_written(
    options: dict[str, Any],
) -> None:
    memory = InMemoryTaskStore()
    with Client(memory) as client, pytest.raises((TypeError, ValueError)):
        client.submit("job", {}, **options)
    assert memory.query() == []


def test_policies_are_frozen_into_the_task_at_submit() -> None:
    app = App(retention=3600)
    policy = RetryPolicy(max_attempts=7)
    app.task("typed", retry=policy, timeout=timedelta(seconds=90))(lambda ctx, p: None)
    app.task("plain")(lambda ctx, p: None)
    memory = InMemoryTaskStore()
    with Client(memory, app=app) as client:
        typed = client.submit("typed").get()
        plain = client.submit("plain").get()
        override = client.submit("typed", retry=QUICK, timeout=2, retention=60).get()
    assert typed is not None and plain is not None and override is not None
    assert (typed.retry, typed.timeout, typed.retention) == (policy, 90.0, 3600.0)
    assert (plain.retry, plain.timeout, plain.retention) == (None, None, 3600.0)
    assert (override.retry, override.timeout, override.retention) == (QUICK, 2.0, 60.0)
    with Client(memory) as bare:  # no app: nothing it does not know is frozen
        loose = bare.submit("anything", timeout=5).get()
    assert loose is not None and (loose.retry, loose.timeout, loose.retention) == (None, 5.0, None)


def test_the_worker_fills_in_its_types_policies_for_a_task_submitted_without_them(
    store: Any, make: Any
) -> None:
    """A producer that does not import the worker's code freezes no policy: the worker that
    starts the task applies its type's (and writes them with the task's end)."""
    worker = make()
    attempts: list[int] = []

    @worker.task(retry=QUICK, retention=3600)
    def flaky(ctx: TaskContext, params: Any) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 2:
            raise Flaky("once")
        return "second"

    with Client(store) as bare:
        task_id = bare.submit("flaky").task_id
    assert store.get(task_id).retry is None
    worker.start()
    done = wait_status(store, task_id, OK)
    assert attempts == [1, 2] and (done.retry, done.retention) == (QUICK, 3600.0)
    never_ran = bare_stopped(store)
    assert never_ran.retention == DEFAULT_RETENTION  # finished unstarted: the default


def bare_stopped(store: Any) -> Any:
    with Client(store) as bare:
        handle = bare.submit("flaky", delay=3600)
        assert handle.stop() == "stopped"
    return store.get(handle.task_id)


# -- retries -------------------------------------------------------------------------------------


def test_a_failing_task_is_retried_by_its_policy_with_backoff_until_it_succeeds(
    store: Any, make: Any
) -> None:
    worker = make()
    calls: list[float] = []

    @worker.task(retry=QUICK)
    def flaky(ctx: TaskContext, params: Any) -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Flaky(f"try {len(calls)}")
        return "third time"

    worker.start()
    task_id = worker.submit("flaky")
    done = wait_status(store, task_id, OK)
    assert (done.result, done.attempt, done.failure) == ("third time", 3, None)
    history = wait_history(store, task_id, 8)
    assert [e.to_status for e in history] == [P, R, FAILED, P, R, FAILED, P, R, OK]
    retries = [e for e in history if e.to_status is P and e.from_status is FAILED]
    assert [r.reason.split(" after")[0] for r in retries] == ["retry 2/3", "retry 3/3"]
    assert all("failed (Flaky)" in r.reason for r in retries)
    assert [r.reason.rsplit(" in ", 1)[1] for r in retries] == ["0.050s", "0.100s"]
    # the backoff, doubling, measured between the failure and the next start
    assert calls[1] - calls[0] >= 0.05 - 0.01 and calls[2] - calls[1] >= 0.1 - 0.01


def test_no_attempt_beyond_max_attempts_and_the_last_failure_is_kept(store: Any, make: Any) -> None:
    worker = make()

    @worker.task(retry=RetryPolicy(max_attempts=2, base_delay=0.01, jitter=0.0))
    def always(ctx: TaskContext, params: Any) -> None:
        raise Flaky(f"attempt {ctx.attempt}")

    worker.start()
    task_id = worker.submit("always")
    failed = wait_status(store, task_id, FAILED)
    time.sleep(0.3)  # nothing more happens
    final = store.get(task_id)
    assert final.status is FAILED and final.attempt == 2
    assert final.failure.error_type == "Flaky" and final.failure.message == "attempt 2"
    assert [e.to_status for e in store.history(task_id)].count(R) == 2
    assert failed.status_version == final.status_version


def test_non_retryable_and_no_retry_on_end_the_task_at_once(store: Any, make: Any) -> None:
    worker = make()
    policy = RetryPolicy(max_attempts=5, base_delay=0.01, no_retry_on=(VeryFlaky,))

    @worker.task(retry=policy)
    def refuses(ctx: TaskContext, params: Any) -> None:
        raise NonRetryable("the card was declined")

    @worker.task(retry=policy)
    def very(ctx: TaskContext, params: Any) -> None:
        raise VeryFlaky("subclass of a retried class, listed in no_retry_on")

    worker.start()
    for name, error_type in (("refuses", "NonRetryable"), ("very", "VeryFlaky")):
        task_id = worker.submit(name)
        failed = wait_status(store, task_id, FAILED)
        assert failed.attempt == 1 and failed.failure.error_type == error_type
    time.sleep(0.2)
    assert all(t.attempt == 1 for t in store.query())


def test_without_a_policy_a_failure_is_final_and_a_lost_attempt_is_retried(
    store: Any, make: Any
) -> None:
    worker = make(retry=worker_default(max_attempts=2, base_delay=0.01))

    @worker.task()
    def plain(ctx: TaskContext, params: Any) -> None:
        raise Flaky("no policy")

    worker.start()
    task_id = worker.submit("plain")
    assert wait_status(store, task_id, FAILED).attempt == 1
    time.sleep(0.2)
    assert store.get(task_id).attempt == 1


def test_a_reconciler_applies_the_tasks_own_frozen_policy_not_its_own(
    store: Any, make: Any
) -> None:
    """A task submitted with max_attempts=1 and lost: a reconciler whose default allows 5 and
    whose app says 5 for the type still applies the task's 1 — it is LOST for good."""
    producer = make()
    producer.task("job", retry=RetryPolicy(max_attempts=1))(lambda ctx, p: None)
    frozen = producer.submit("job")
    generous = producer.submit("job", retry=RetryPolicy(max_attempts=5, base_delay=0.01))
    for task_id in (frozen, generous):  # started by a holder that died at once
        snapshot = store.get(task_id)
        running = advance(snapshot, R, snapshot.updated_at, lease_owner=None, lease_until=None)
        store.save(running, expect_version=snapshot.status_version)
    reconciler = make(owner="other", retry=worker_default(max_attempts=5), task_lease=0.01)
    reconciler.task("job", retry=RetryPolicy(max_attempts=5))(lambda ctx, p: None)
    time.sleep(0.05)
    report = reconciler.reconcile()
    assert sorted(report.lost) == sorted([frozen, generous]) and report.retried == [generous]
    assert store.get(frozen).status is LOST
    assert (store.get(generous).status, store.get(generous).attempt) == (P, 2)


# -- timeouts ------------------------------------------------------------------------------------


def test_a_checkpointing_task_past_its_timeout_fails_with_task_timeout_and_is_retried(
    store: Any, make: Any
) -> None:
    worker = make()
    seen: list[int] = []

    @worker.task(timeout=0.3, retry=RetryPolicy(max_attempts=2, base_delay=0.01, jitter=0))
    def slow(ctx: TaskContext, params: Any) -> str:
        seen.append(ctx.attempt)
        if ctx.attempt == 2:
            return "quick this time"
        while True:
            ctx.checkpoint()
            time.sleep(0.02)

    worker.start()
    task_id = worker.submit("slow")
    done = wait_status(store, task_id, OK)
    assert done.attempt == 2 and seen == [1, 2]
    history = store.history(task_id)
    failed = next(e for e in history if e.to_status is FAILED)
    started = next(e for e in history if e.to_status is R)
    assert 0.3 <= (failed.at - started.at).total_seconds() < 0.3 + FAST["task_lease"]
    assert any((e.reason or "").startswith("retry 2/2 after failed (TaskTimeout)") for e in history)


def test_a_silent_thread_is_ended_by_its_worker_and_its_late_result_discarded(
    store: Any, make: Any, gate: threading.Event
) -> None:
    worker = make(timeout_grace=0.2)
    returned: list[str] = []

    @worker.task(timeout=0.2, retry=RetryPolicy(max_attempts=1))
    def wedged(ctx: TaskContext, params: Any) -> str:
        gate.wait(15)  # like C code: no checkpoint, while the lease renewals go on
        returned.append(ctx.task_id)
        return "too late"

    @worker.task()
    def other(ctx: TaskContext, params: Any) -> str:
        return "still working"

    worker.start()
    task_id = worker.submit("wedged")
    failed = wait_status(store, task_id, FAILED)
    assert failed.failure.error_type == "TaskTimeout" and "did not stop" in failed.failure.message
    assert wait_status(store, worker.submit("other"), OK).result == "still working"
    version = failed.status_version
    gate.set()
    wait_until(lambda: returned == [task_id])
    time.sleep(0.3)
    final = store.get(task_id)
    assert (final.status, final.result, final.status_version) == (FAILED, None, version)


def test_an_async_task_past_its_timeout_is_cancelled(store: Any, make: Any) -> None:
    worker = make()

    @worker.task(timeout=0.3, retry=RetryPolicy(max_attempts=1))
    async def sleeper(ctx: TaskContext, params: Any) -> None:
        await asyncio.sleep(30)  # no checkpoint: the cancellation ends it

    worker.start()
    started = time.monotonic()
    failed = wait_status(store, worker.submit("sleeper"), FAILED)
    assert failed.failure.error_type == "TaskTimeout"
    assert time.monotonic() - started < 10


def test_a_reconcile_ends_a_task_running_past_its_deadline_whoever_holds_it(
    store: Any, make: Any
) -> None:
    """Its holder is wedged (or gone) while its lease is still valid: any worker's reconcile
    ends it by compare-and-set, then retries it under its policy."""
    producer = make()
    producer.task("job", timeout=0.1, retry=RetryPolicy(max_attempts=2, base_delay=0.01,
                                                         retry_on=(TaskTimeout,)))(
        lambda ctx, p: None
    )  # fmt: skip
    task_id = producer.submit("job")
    snapshot = store.get(task_id)
    now = snapshot.updated_at
    running = advance(snapshot, R, now, deadline=now + timedelta(seconds=0.1))
    store.save(running, expect_version=snapshot.status_version)
    store.touch(task_id, lease_owner="wedged-holder", lease_until=now + timedelta(hours=1))
    other = make(owner="other", timeout_grace=0.1)
    report = wait_until(lambda: other.reconcile().timed_out, what="the timeout backstop")
    assert report == [task_id]
    again = store.get(task_id)
    assert (again.status, again.attempt) == (P, 2)
    entries = store.history(task_id)[-2:]
    assert [e.to_status for e in entries] == [FAILED, P]
    assert entries[0].reason.startswith("timed out: RUNNING past its deadline")


# -- retention -----------------------------------------------------------------------------------


def test_finished_tasks_past_their_retention_are_removed_by_the_workers(
    store: Any, make: Any
) -> None:
    worker = make()
    worker.task("short", retention=0.3)(lambda ctx, p: "gone soon")
    worker.task("long", retention=3600)(lambda ctx, p: "kept")
    worker.start()
    short, long = worker.submit("short"), worker.submit("long")
    wait_status(store, short, OK)
    wait_status(store, long, OK)
    wait_until(lambda: store.get(short) is None, what="the expired task to be removed")
    assert store.history(short) == []
    assert store.get(long).status is OK and len(store.history(long)) == 3


# -- unique submits ------------------------------------------------------------------------------


def test_a_unique_submit_returns_the_unfinished_holder_and_is_free_once_it_finished(
    store: Any, make: Any, gate: threading.Event
) -> None:
    worker = make()
    worker.task("invoice")(lambda ctx, p: gate.wait(15))
    with Client(store) as client:
        first = client.submit("invoice", {"n": 1}, unique="invoice-42")
        again = client.submit("invoice", {"n": 2}, unique="invoice-42")
        assert first.created and not again.created and again.task_id == first.task_id
        assert len(store.query()) == 1 and store.get(first.task_id).params == {"n": 1}
        worker.start()
        gate.set()
        wait_status(store, first.task_id, OK)
        third = client.submit("invoice", {"n": 3}, unique="invoice-42")
        assert third.created and third.task_id != first.task_id
        # the unique id routes like a key: one bucket for all its tasks
        assert store.get(third.task_id).bucket == store.get(first.task_id).bucket


def test_a_store_that_keeps_no_unique_ids_refuses_a_unique_submit_in_one_line() -> None:
    minimal = MinimalStore()
    with Client(minimal) as client:  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="does not keep unique ids"):
            client.submit("job", unique="u-1")
        assert minimal.inner.query() == []
        client.submit("job")  # the rest works


def test_a_failure_record_of_a_timeout_is_an_ordinary_failure() -> None:
    failure = Failure("TaskTimeout", "ran past its timeout")
    assert RetryPolicy(retry_on=(TaskTimeout,)).retries_error_type(failure.error_type)
    assert not RetryPolicy(retry_on=(Flaky,)).retries_error_type(failure.error_type)


def test_a_retry_by_hand_is_refused_while_another_task_holds_its_unique_id(store: Any) -> None:
    from chongming_redis import UniqueTaken

    with Client(store) as client:
        first = client.submit("job", unique="nightly")
        first.stop()
        second = client.submit("job", unique="nightly")  # the id was free again
        assert second.created and second.task_id != first.task_id
        with pytest.raises(UniqueTaken) as refused:
            client.retry(first.task_id)
        assert refused.value.holder == second.task_id
        assert store.get(first.task_id).status is TaskStatus.STOPPED  # nothing written
        second.stop()
        assert client.retry(first.task_id).task_id == first.task_id  # free: taken again
        assert store.unique_holder("nightly") == first.task_id


def test_a_lost_and_retried_task_of_a_producer_without_the_app_keeps_its_types_retention(
    store: Any, make: Any
) -> None:
    """The LOST end is final for a moment only: its retry must not carry the default retention
    the final move fills in; the reconciler and the worker apply the type's year."""
    year = 365 * 86400.0
    with Client(store) as bare:
        task_id = bare.submit("kept").task_id
    snapshot = store.get(task_id)
    running = advance(snapshot, R, snapshot.updated_at)  # its holder died at once
    store.save(running, expect_version=snapshot.status_version)
    reconciler = make(owner="other", retry=worker_default(max_attempts=2, base_delay=0.01),
                      task_lease=0.01)  # fmt: skip
    reconciler.task("kept", retention=year)(lambda ctx, p: "done")
    time.sleep(0.05)
    assert reconciler.reconcile().retried == [task_id]
    assert store.get(task_id).retention == year
    worker = make(owner="runner")  # the usual lease: it runs the retry
    worker.task("kept", retention=year)(lambda ctx, p: "done")
    worker.start()
    done = wait_status(store, task_id, OK)
    assert (done.attempt, done.retention) == (2, year)


def test_unique_submits_on_a_store_without_batching_and_the_controllers_refusal() -> None:
    """A ``TaskPoliciesStore`` without ``BatchingStore`` (the adapter's create-then-append
    fallback) still returns the holder; a ``Controller`` on a store that keeps no unique ids
    refuses ``unique=`` in one line, as the clients do."""

    class PoliciesOnly(MinimalStore):
        def unique_holder(self, unique: str) -> str | None:
            return self.inner.unique_holder(unique)

        def expire_finished(self, *, now: Any, limit: int = 100) -> list[str]:
            return self.inner.expire_finished(now=now, limit=limit)

        def expiry_backlog(self, *, now: Any) -> Any:
            return self.inner.expiry_backlog(now=now)

    policies = PoliciesOnly()
    with Client(policies) as client:  # type: ignore[arg-type]
        first = client.submit("job", unique="u-1")
        again = client.submit("job", unique="u-1")
    assert first.created and not again.created and again.task_id == first.task_id
    assert len(policies.inner.query()) == 1
    from chongming_redis.runtime.controller import Controller

    app = App()
    app.task("job")(lambda ctx, p: None)
    bare = MinimalStore()
    with pytest.raises(ValueError, match="does not keep unique ids"):
        Controller(bare, app=app).submit("job", unique="u-2")  # type: ignore[arg-type]
    assert bare.inner.query() == []


def test_the_async_client_on_redis_submits_unique(redis_proc: Any, namespace: str) -> None:
    from chongming_redis import AsyncClient

    async def main() -> tuple[Any, Any]:
        async with AsyncClient.from_url(redis_proc.url, namespace=namespace) as client:
            return (await client.submit("job", unique="a-1"),
                    await client.submit("job", unique="a-1"))  # fmt: skip

    first, again = asyncio.run(main())
    assert first.created and not again.created and again.task_id == first.task_id
