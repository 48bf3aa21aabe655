"""The sections of ``StoreContract`` (``chongming_redis.testing.store_contract``), one
module per part of the protocol."""
