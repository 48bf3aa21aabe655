"""``release_pass``: a worker's part of the dependencies (``DependenciesStore``). The write
that ends a parent moves up to ``RELEASE_STEP`` of its waiting children itself; a wider
fan-out is continued here, every ``release_poll_interval``, by whichever workers run (each
call is one atomic step of the store's, and a child is judged once however many call). A pass
continues while the store reports a full step, at most ``MAX_STEPS`` steps (then the next
pass), so one pass of a 10,000-wide fan-out is 100 calls and the starter hears of the
released children after each."""

from __future__ import annotations

from collections.abc import Callable

from chongming_redis.stores.dependency_store import RELEASE_STEP, DependenciesStore

#: At most this many ``release_dependents`` calls per pass.
MAX_STEPS = 100


def release_pass(
    store: DependenciesStore, *, wake: Callable[[], None], step: int = RELEASE_STEP
) -> int:
    """Continue the stores' releases: children judged in this pass. ``wake``: called after
    each call that judged any (this worker's starter looks now)."""
    judged = 0
    for _ in range(MAX_STEPS):
        done = store.release_dependents(limit=step)
        judged += done
        if done:
            wake()
        if done < step:
            break
    return judged


def releaser(store: object) -> DependenciesStore | None:
    """The store, if it keeps dependencies (else there is nothing to continue)."""
    return store if isinstance(store, DependenciesStore) else None
