"""The fixtures of ``tests/support/fixtures.py`` (real servers on free loopback ports), as in
``tests/``."""

pytest_plugins = ["tests.support.fixtures"]
