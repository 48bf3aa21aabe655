"""``RetryPolicy``: when a lost (or, if asked, failed) task gets a new attempt, and when."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` counts the first run. The n-th retry waits
    ``min(max_delay, base_delay * 2**(n-1))``, scaled by a random factor in
    ``[1 - jitter, 1]`` so a burst of lost tasks does not restart in lockstep."""

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 60.0
    jitter: float = 0.5
    retry_failures: bool = False

    def allows(self, attempt: int) -> bool:
        return attempt < self.max_attempts

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        raw = min(self.max_delay, self.base_delay * 2 ** max(0, attempt - 1))
        factor = 1.0 - (rng or random).random() * self.jitter
        return timedelta(seconds=raw * factor)
