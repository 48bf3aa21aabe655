"""The stress harness: ``chongming-redis stress`` (or ``python -m chongming_redis.stress``).

A real pool of worker processes behind a fault proxy, a seeded nemesis, then checkers over
Redis's own records; see docs/reliability.md. Nothing here is imported by the library itself.
"""
