# Shoal: `make run` starts a broker on 127.0.0.1:9092 with data in ./data; `make test` runs every test;
# `make compose-test` runs the docker-compose test stack and the deployment tests (needs Docker, see README).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
QUIX_VENV := .venv-quix

# protocol/, coordinator/ and persister/ are also checked with --strict.
STRICT_PACKAGES := -p shoal.protocol -p shoal.coordinator -p shoal.persister

.PHONY: run test check install install-test lint typecheck unit integration bench clean generate compose-test compose-up compose-down compat

$(VENV)/.installed: pyproject.toml setup.py protocol/_record_walk.c broker/storage/_fsync_worker.c
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml $(QUIX_VENV)/.installed
	$(PIP) install -q -e '.[test]'
	touch $@

# Quix Streams needs an older confluent-kafka than the test extra pins, so its test app runs in a venv of its own.
$(QUIX_VENV)/.installed: tests/quix-requirements.txt
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/pip install -q -r tests/quix-requirements.txt
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

run: install
	$(VENV)/bin/shoal-broker config/server.properties

# Workers for the suite: the Spark tests share one worker (one JVM), each other module runs on one worker
# (its broker starts once). Most integration tests wait on brokers, timers and other processes, so four
# workers pay off even on two cores.
TEST_WORKERS ?= 4

test: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup tests

# The quick loop: lint, types and the unit tests.
check: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/unit

unit: install-test
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup tests/unit

integration: install-test
	$(VENV)/bin/pytest -q tests/integration

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy shoal
	$(VENV)/bin/mypy --strict $(STRICT_PACKAGES)

# Typed message classes and ApiKey from protocol/specs (a unit test fails when they are stale).
generate: install
	$(PY) -m shoal.protocol.generate

# Docker: the stacks always get a project name of their own (`-p`); both files sit in docker/, and without it
# they would share the project `docker`, containers and volumes included.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
# Scripts that build local stand-ins for base images Docker Hub cannot serve here (see README).
STANDINS ?= ../shared/tools/docker-standins

compose-test: install-test
	STANDINS=$(STANDINS) PYTEST=$(VENV)/bin/pytest docker/compose-test.sh

compose-up:
	$(COMPOSE) -p shoal -f docker/docker-compose.yml up -d --build

compose-down:
	$(COMPOSE) -p shoal -f docker/docker-compose.yml down

# librdkafka's own broker tests against a Shoal broker, from tests/compat/allowlist.txt (docs/compat.md). Close
# to an hour, so not part of `make test`. Builds librdkafka into .cache/ first (and apt-get installs the
# build packages when run as root). COMPAT_ARGS="--only 0001,0102" runs a few.
compat: install-test
	$(PY) -m tests.compat.run_librdkafka_tests $(COMPAT_ARGS)

bench: install-test
	$(PY) bench/bench_produce_fetch.py

clean:
	rm -rf $(VENV) $(QUIX_VENV) data .pytest_cache .mypy_cache .ruff_cache
