"""Private servers and processes on loopback, for the demo, the tests and the benches.

``redis_server.py``: ``EmbeddedRedis`` (a redis-server of our own, from PATH or the
``[embedded]`` extra) and ``RedisProc`` (the tests' server on a free port).
``redis_cluster.py``: a 3 + 3 Redis Cluster of private servers. ``postgres_server.py``: a private
PostgreSQL (Debian's ``initdb`` + ``postgres``) in a temporary directory. ``workers.py``:
``chongming-redis worker`` processes started and stopped by the tests and benches.

Nothing here is imported by a producer or a worker that is given a store URL.
"""
