"""The suite's fixtures live in ``tests/support/fixtures.py`` (real servers on free loopback
ports, store targets), shared with ``stress/`` by this one line."""

pytest_plugins = ["tests.support.fixtures"]
