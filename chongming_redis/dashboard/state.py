"""What every route of one dashboard shares: the store, the feed hub, the renderer, the
control settings, and the overview read at most once per ``OVERVIEW_TTL`` however many pages
watch it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from anyio import to_thread

from chongming_redis.dashboard.hub import FeedHub
from chongming_redis.dashboard.reads import Overview, read_overview
from chongming_redis.dashboard.render import Renderer
from chongming_redis.stores.protocol import TaskStore

#: The overview is shared by every watcher for this long (seconds).
OVERVIEW_TTL = 1.0


@dataclass(frozen=True)
class ControlSettings:
    """``--allow-control``: the token that signs a user in, the sessions signed in (kept in
    memory: a restart signs everyone out) and the secret the CSRF values and the outcome notes
    are signed with (new each start)."""

    token: str
    secret: bytes
    command_timeout: float = 10.0
    #: The signed-in sessions (random ids, newest last); sign-out removes one.
    sessions: dict[str, None] = field(default_factory=dict)


@dataclass
class DashboardState:
    store: TaskStore
    hub: FeedHub
    renderer: Renderer
    namespace: str
    control: ControlSettings | None = None
    _overview: tuple[float, Overview] | None = field(default=None, repr=False)

    async def overview(self) -> Overview:
        cached = self._overview
        if cached is not None and time.monotonic() - cached[0] < OVERVIEW_TTL:
            return cached[1]
        overview = await to_thread.run_sync(read_overview, self.store)
        self._overview = (time.monotonic(), overview)
        return overview

    async def overview_parts(self) -> dict[str, str]:
        """The overview page's live parts, by element id."""
        ov = await self.overview()
        throughput = self.hub.throughput
        return self.renderer.parts(
            {
                "counts": "counts",
                "workers": "workers",
                "feed": "feed",
                "buckets": "buckets",
                "throughput": "throughput",
                "limits": "limits",
            },
            ov=ov,
            series=throughput.series(ov.now),
            rate=throughput.per_second(ov.now),
            bin_seconds=throughput.bin_seconds,
        )
