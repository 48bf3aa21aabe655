"""The task types of ``chongming-redis demo`` (``chongming_redis.demo.app:app``)."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("demo")


class Render(BaseModel):
    frames: int = Field(ge=1, le=10_000)
    frame_ms: int = Field(default=40, ge=0, le=10_000)


@app.task()
def render(ctx: TaskContext, params: Render) -> dict[str, int]:
    """Pretend to render ``frames`` frames, checking in after each one."""
    for frame in range(params.frames):
        ctx.checkpoint(current=frame, total=params.frames)
        time.sleep(params.frame_ms / 1000)
    ctx.checkpoint(current=params.frames, total=params.frames)  # done: the bar shows 100 %
    return {"frames": params.frames, "attempt": ctx.attempt}
