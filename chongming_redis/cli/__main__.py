"""``python -m chongming_redis.cli``: the same as the ``chongming-redis`` console script."""

from chongming_redis.cli.root import main

if __name__ == "__main__":
    main()
