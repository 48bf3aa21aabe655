"""The SQL machinery shared by ``stores/sqlite.py`` and ``stores/postgres.py`` (private).

``store.py`` is the facade both stores extend (each operation: check the input, open a
transaction, call the operation's module); ``tasks.py`` and ``commands.py`` hold the task and
command operations, ``limits.py`` the limits (``LimitsStore``: the holders and waiters kept
with the task rows, the admission of a start), ``policies.py`` the task policies, ``feed.py``
the change feed, ``query.py`` the filtered reads; ``rows.py``
converts records to rows, ``schema.py`` holds the DDL of both dialects; ``pool.py`` hands out
connections, ``pg_connection.py`` adapts psycopg's to the same shape.
"""
