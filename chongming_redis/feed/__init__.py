"""Following a store's change feed without ever skipping a change or a removal.

``FeedReader`` reads pages from a persisted cursor and applies each one, with its cursor, in one
transaction of the consumer's own store: ``SqliteFeedConsumer`` (standard library) or
``RedisFeedConsumer``. ``wire`` holds the page's JSON shape (``{"tasks": [...],
"next_cursor": "123"}``).
"""

from __future__ import annotations

from chongming_redis.feed.reader import (
    Binding,
    BindingConflict,
    Change,
    FeedConsumer,
    FeedReader,
    PageRejected,
)
from chongming_redis.feed.sqlite_consumer import SqliteFeedConsumer
from chongming_redis.feed.wire import item_to_json, page_to_json

__all__ = [
    "Binding",
    "BindingConflict",
    "Change",
    "FeedConsumer",
    "FeedReader",
    "PageRejected",
    "RedisFeedConsumer",
    "SqliteFeedConsumer",
    "item_to_json",
    "page_to_json",
]


def __getattr__(name: str) -> object:
    if name == "RedisFeedConsumer":  # imports redis-py only when asked for
        from chongming_redis.feed.redis_consumer import RedisFeedConsumer

        return RedisFeedConsumer
    raise AttributeError(f"module 'chongming_redis.feed' has no attribute {name!r}")
