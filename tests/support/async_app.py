"""``async def`` task types for a real worker process: ``tests.support.async_app:app``
(``chongming-redis worker tests.support.async_app:app``).

``nap``    ``{"seconds": S}``: one ``acheckpoint`` (progress message ``"napping"``), then
           ``asyncio.sleep(S)``: a stop must cancel the sleep.
``tick``   counts and ``acheckpoint``s every 10 ms until it is stopped.
``echo``   returns its parameters after one ``await`` (async).
``plain``  returns its parameters (a plain function, beside the async ones).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("async-test")


class Nap(BaseModel):
    seconds: float = 60.0


@app.task()
async def nap(ctx: TaskContext, params: Nap) -> str:
    await ctx.acheckpoint(current=0, total=1, message="napping")
    await asyncio.sleep(params.seconds)
    return "woke"


@app.task()
async def tick(ctx: TaskContext, params: Any) -> int:
    count = 0
    while True:
        count += 1
        await ctx.acheckpoint(current=count)
        await asyncio.sleep(0.01)


@app.task()
async def echo(ctx: TaskContext, params: Any) -> Any:
    await asyncio.sleep(0)
    return params


@app.task()
def plain(ctx: TaskContext, params: Any) -> Any:
    return params
