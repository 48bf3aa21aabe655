"""``BucketPolicy``: which bucket a task key falls in, the same on every machine.

The hash is BLAKE2b of the key's UTF-8 bytes, never the built-in ``hash()`` (salted per process),
so every process, machine and Python version agrees.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from chongming_redis.validation import check_identifier, check_int


@dataclass(frozen=True)
class BucketPolicy:
    """``num_buckets`` is deployment-wide: every process of a namespace must use the same."""

    num_buckets: int = 64

    def __post_init__(self) -> None:
        check_int(self.num_buckets, "num_buckets", minimum=1, maximum=65536)

    def bucket_for(self, key: str) -> int:
        check_identifier(key, "key")
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.num_buckets
