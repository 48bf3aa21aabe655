"""The Redis machinery behind ``stores/redis.py`` and ``stores/redis_async.py`` (private).

Where an operation lives: its Lua script is ``lua/<operation>.lua`` (KEYS, ARGV and replies in
its header; ``lua/lib/`` holds the includes), loaded by ``scripts.py``; ``keys.py`` builds every
key of a namespace; its *plan* (the keys, the arguments, how the reply is read; no I/O) is in
``ops.py`` (what a plan may request, and the producer's operations, which the sync and the
async store both drive), ``worker_ops.py`` (the worker's writes and the bucket pool) or
``dashboard_ops.py`` (the reads of dashboards and the change feed); ``driver.py`` holds what
the two stores share of driving a plan (the closed check, which call sends a script, their
state), so that they differ only in their I/O; ``replies.py`` maps the scripts' reply codes to
exceptions; ``rows.py`` encodes a task's arguments and decodes hashes into records. The
transports: ``connect.py`` (a client from a URL), ``sentinel.py``, ``cluster.py`` and
``cluster_async.py`` (Redis Cluster), ``durability.py`` (WAIT after each write) and
``server.py`` (what the server is and allows). ``extensions.py`` holds ``RedisTaskStore``'s
methods beyond the ``TaskStore`` protocol (dashboards, the pool, the feed).

This ``__init__`` imports nothing: importing ``keys`` must not load redis-py.
"""
