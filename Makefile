# The two entry points are `make demo` and `make test`; each builds what it needs from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest system-deps clean

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Java 17 runs the Kafka broker; Maven fetches its jars. Both come from Debian's packages
# when the machine lacks them (CI and developers run as root).
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then \
	  echo "installing Java 17 and Maven"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check sidecar comparators tests bench
	$(BIN)/ruff format --check sidecar comparators tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/ragflow-sidecar demo $(DEMO_ARGS)

clean:
	-$(BIN)/ragflow-sidecar local-stack down
	rm -rf .local $(VENV)
