"""The Redis machinery behind ``stores/redis.py`` and ``stores/redis_async.py`` (private).

Where an operation lives: its Lua script is ``lua/<operation>.lua`` (KEYS, ARGV and replies in
its header; ``lua/lib/`` holds the includes), loaded by ``scripts.py``; ``keys.py`` builds every
key of a namespace; ``ops.py`` holds the sans-I/O plan of each operation (the keys, the
arguments, how the reply is read), which the sync and the async store drive alike;
``replies.py`` maps the scripts' reply codes to exceptions; ``rows.py`` decodes hashes into
records. The transports: ``connect.py`` (a client from a URL), ``sentinel.py``, ``cluster.py``
and ``cluster_async.py`` (Redis Cluster), ``durability.py`` (WAIT after each write) and
``server.py`` (what the server is and allows). ``extensions.py`` holds the reads beyond the
``TaskStore`` protocol (dashboards, paged queries).

This ``__init__`` imports nothing: importing ``keys`` must not load redis-py.
"""
