"""Task policies: how a task type is retried (``RetryPolicy``), how long an attempt may run
(``timeout``) and how long a finished task is kept (``retention``), with the two exceptions a
task meets (``NonRetryable`` it raises, ``TaskTimeout`` it is given).

The policies are frozen into each task when it is submitted (``TaskSnapshot.retry``,
``timeout``, ``retention``), so whichever worker starts, reconciles or retries the task applies
the task's own policy, whatever its own code says. Low in the package: the model imports it,
it imports only ``validation``.
"""

from __future__ import annotations

import builtins
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chongming_redis.validation import check_int

#: How long a finished task is kept when neither its submit, its type nor its app says (7 days).
DEFAULT_RETENTION = 7 * 86400.0
#: The longest ``timeout`` (30 days) and ``retention`` (100 years) accepted.
MAX_TIMEOUT = 30 * 86400.0
MAX_RETENTION = 100 * 365 * 86400.0
#: The longest backoff a retry may wait (30 days).
MAX_DELAY = 30 * 86400.0
#: The most attempts a policy may allow.
MAX_ATTEMPTS = 1000


class NonRetryable(Exception):
    """Raised by a task: it fails now, whatever its retry policy says."""


class TaskTimeout(Exception):
    """An attempt ran past its type's ``timeout``: raised at ``ctx.checkpoint()`` (the failure's
    ``error_type`` is ``"TaskTimeout"`` however the attempt was ended)."""


def exception_name(cls: type[BaseException]) -> str:
    """How an exception class is named in a stored policy: builtins bare (``ValueError``),
    others by module and qualified name (``myapp.errors.Flaky``)."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def class_names(cls: type[BaseException]) -> tuple[str, ...]:
    """An exception class and its bases, as ``exception_name`` names them (itself first)."""
    return tuple(exception_name(c) for c in cls.__mro__ if issubclass(c, BaseException))


def _names(value: object, what: str) -> tuple[str, ...]:
    if isinstance(value, str | bytes | type) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a tuple of exception classes (or their names)")
    names = []
    for item in value:
        if isinstance(item, type) and issubclass(item, BaseException):
            names.append(exception_name(item))
        elif isinstance(item, str) and item and all(p.isidentifier() for p in item.split(".")):
            if "." not in item and not _is_builtin_exception(item):  # a typo, or not a class
                raise TypeError(f"{what}: {item!r} is no built-in exception (a class of your own "
                                "is named module.QualName, or given as the class)")  # fmt: skip
            names.append(item)
        else:
            raise TypeError(f"{what}: {item!r} is not an exception class (nor its dotted name)")
    return tuple(names)


def _is_builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


def _seconds(value: object, what: str, *, minimum: float, maximum: float) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif type(value) in (int, float):
        seconds = float(value)  # type: ignore[arg-type]
    else:
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, not "
                        f"{type(value).__name__}")  # fmt: skip
    if not math.isfinite(seconds) or seconds < minimum or seconds > maximum:
        raise ValueError(f"{what} must be a number of seconds from {minimum:g} to {maximum:g}, "
                         f"not {value!r}")  # fmt: skip
    return seconds


def check_duration(value: object, what: str, *, maximum: float) -> float | None:
    """A ``timeout`` / ``retention``: ``None``, or seconds (a number or a timedelta) > 0 and
    ``<= maximum``; ``TypeError``/``ValueError`` otherwise (0, negative, NaN, infinite)."""
    if value is None:
        return None
    seconds = _seconds(value, what, minimum=0.0, maximum=maximum)
    if seconds <= 0:
        raise ValueError(f"{what} must be more than 0 seconds, not {value!r}")
    return seconds


@dataclass(frozen=True)
class RetryPolicy:
    """How a task type is retried. ``max_attempts`` counts the first run. The n-th retry waits
    ``base_delay * multiplier ** (n - 1)`` seconds, spread by ± ``jitter`` (a fraction) and
    capped at ``max_delay``, on the store's clock. A failure is retried when its exception is
    an instance of a class in ``retry_on`` and of none in ``no_retry_on`` (matched through the
    class hierarchy, by name: the classes are stored as ``exception_name``); ``NonRetryable``
    is never retried. A ``LOST`` attempt (its worker died) is retried while attempts remain."""

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 300.0
    multiplier: float = 2.0
    jitter: float = 0.1
    retry_on: tuple[Any, ...] = (Exception,)
    no_retry_on: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        check_int(self.max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS)
        _set = object.__setattr__
        _set(self, "base_delay", _seconds(self.base_delay, "base_delay", minimum=0.0,
                                          maximum=MAX_DELAY))  # fmt: skip
        _set(self, "max_delay", _seconds(self.max_delay, "max_delay", minimum=0.0,
                                         maximum=MAX_DELAY))  # fmt: skip
        _set(self, "multiplier", _seconds(self.multiplier, "multiplier", minimum=1.0,
                                          maximum=1000.0))  # fmt: skip
        _set(self, "jitter", _seconds(self.jitter, "jitter", minimum=0.0, maximum=1.0))
        _set(self, "retry_on", _names(self.retry_on, "retry_on"))
        _set(self, "no_retry_on", _names(self.no_retry_on, "no_retry_on"))

    def allows(self, attempt: int) -> bool:
        """Whether attempt ``attempt`` (1 = the first run) may be followed by another."""
        return attempt < self.max_attempts

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure with ``exc`` may be retried (attempts aside)."""
        if isinstance(exc, NonRetryable):
            return False
        return self.retries_type(type(exc))

    def retries_type(self, cls: type[BaseException]) -> bool:
        return self.retries_names(class_names(cls))

    def retries_names(self, names: Iterable[str]) -> bool:
        """For an exception known by its classes' names (``class_names``: a child process's
        failure): the same rule as ``retries``."""
        found = set(names)
        if found & set(self.no_retry_on) or exception_name(NonRetryable) in found:
            return False
        return bool(found & set(self.retry_on))

    def retries_error_type(self, error_type: str) -> bool:
        """For a failure known by its ``error_type`` alone (a child process's, a timeout):
        matched by that one name."""

        def named(names: tuple[str, ...]) -> bool:  # a stored failure names its class bare
            return any(error_type in (name, name.rsplit(".", 1)[-1]) for name in names)

        if named(self.no_retry_on) or error_type == NonRetryable.__name__:
            return False
        return named(self.retry_on) or "Exception" in self.retry_on

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """The wait before the attempt after ``attempt``."""
        raw = self.base_delay * self.multiplier ** max(0, attempt - 1)
        spread = 1.0 + self.jitter * (2.0 * (rng or random).random() - 1.0)
        return timedelta(seconds=min(self.max_delay, raw * spread))

    # -- the stored form -------------------------------------------------------------------

    def to_json(self) -> str:
        """The compact JSON stored with each task (``TaskSnapshot.retry``)."""
        return json.dumps(
            [self.max_attempts, self.base_delay, self.max_delay, self.multiplier, self.jitter,
             list(self.retry_on), list(self.no_retry_on)], separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> RetryPolicy:
        """The policy ``to_json`` wrote (``ValueError`` for anything else)."""
        try:
            n, base, cap, mult, jitter, on, no = json.loads(text)
            policy = cls(n, base, cap, mult, jitter, (), ())
            # The stored names as written (by exception_name): not judged again, so a class
            # this process cannot see still reads back.
            for field, names in (("retry_on", on), ("no_retry_on", no)):
                if not all(isinstance(x, str) and x for x in names):
                    raise ValueError(f"{field} holds a name that is not text")
                object.__setattr__(policy, field, tuple(names))
            return policy
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a stored retry policy: {text[:200]!r} ({exc})") from None

    def describe(self) -> str:
        """One line for ``show`` and the dashboard."""
        on = ", ".join(self.retry_on) or "nothing"
        text = (f"{self.max_attempts} attempts, {self.base_delay:g}s x{self.multiplier:g} "
                f"(max {self.max_delay:g}s, ±{self.jitter:.0%}), retry on {on}")  # fmt: skip
        if self.no_retry_on:
            text += f", never on {', '.join(self.no_retry_on)}"
        return text


#: What a worker applies to a task submitted without a policy of its own (``--max-attempts``,
#: ``--retry-backoff`` set the first two): a LOST attempt is retried, a failure is final.
def worker_default(max_attempts: int = 3, base_delay: float = 1.0) -> RetryPolicy:
    return RetryPolicy(max_attempts=max_attempts, base_delay=base_delay,
                       max_delay=max(60.0, base_delay), jitter=0.5, retry_on=())  # fmt: skip
