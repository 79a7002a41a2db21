# The two entry points are `make demo` and `make test`; each builds what it needs from nothing.
# `make check` is the one to run while working: lint, typecheck and the tests that need no server.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test check pytest-check lint typecheck pytest pytest-ragflow-pins test-kafka39 system-deps clean bench helm jaeger

# The Apache Kafka release every broker of the tests runs (tests/conftest.py): empty is the local
# stack's 4.x; `make test KAFKA_VERSION=3.9.1` runs the whole suite on the seed's Kafka 3.9.
KAFKA_VERSION ?=
# With KAFKA_VERSION unset, `make test` also runs the Kafka-facing tests (marked kafka39: the
# transport, topics, mirror, shadow and its group's rebalances, the served path and
# drain-to-redis, reconcile, SASL_SSL/SCRAM and the ACLs, and the broker faults) on 3.9 (the
# seed's compose pins bitnami/kafka:3.9, which many RAGFlow sites run). About 6 minutes on 2 CPUs.
KAFKA39_VERSION ?= 3.9.1

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Java 17 runs the Kafka broker; Maven fetches its jars. docker-compose (1.29) and promtool
# check compose/ without a Docker engine (tests/test_compose.py); prometheus runs the
# dashboards' queries (tests/test_prometheus.py). docker-compose comes without its recommended
# engine package; prometheus and promtool are taken out of Debian's prometheus package
# without installing it, so no Prometheus service is set up or started. All come from Debian's
# packages when the machine lacks them (CI and developers run as root).
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then \
	  echo "installing Java 17 and Maven"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven; \
	fi
	@if ! command -v docker-compose >/dev/null; then \
	  echo "installing docker-compose"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; \
	fi
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  echo "installing prometheus and promtool"; \
	  tmp=$$(mktemp -d) && cd "$$tmp" && apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root prometheus \
	    && dpkg-deb -x prometheus_*.deb root \
	    && install -m 0755 root/usr/bin/prometheus root/usr/bin/promtool /usr/local/bin/ \
	    && cd / && rm -rf "$$tmp"; \
	fi

# Helm renders and lints the chart in compose/helm/ (tests/test_helm*.py): built from the Go module
# proxy with the installed Go and cached beside Kafka's jars, so it is built once per version
# (a few minutes on 2 CPUs) and never downloaded at test time. The tests find it through HELM.
HELM_VERSION ?= v4.3.2
# The same cache directory as Kafka's jars (sidecar/dev/local_stack/kafka.py, cache_root).
CACHE_ROOT   := $(or $(SIDECAR_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ragflow-kafka-sidecar)
HELM_DIR     := $(CACHE_ROOT)/helm-$(HELM_VERSION)
HELM         := $(HELM_DIR)/helm

$(HELM):
	rm -rf $(HELM_DIR).tmp
	GOBIN=$(HELM_DIR).tmp GOFLAGS=-mod=mod go install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)
	rm -rf $(HELM_DIR) && mv $(HELM_DIR).tmp $(HELM_DIR)

helm: $(HELM)

# Jaeger (v2) stores and answers for the sidecar's traces in the end-to-end tracing tests
# (tests/test_jaeger_e2e.py): built like Helm, from the one approved module version, and found
# by the tests through JAEGER. The v2 binary is cmd/jaeger; v1.75.0 is its module version.
JAEGER_VERSION ?= v1.75.0
JAEGER_DIR     := $(CACHE_ROOT)/jaeger-$(JAEGER_VERSION)
JAEGER         := $(JAEGER_DIR)/jaeger

# `go install pkg@version` refuses it (its go.mod has a replace directive), so it is built as a
# tool of a throwaway module that carries the same replace (Jaeger's go.mod: Shopify/sarama).
$(JAEGER):
	rm -rf $(JAEGER_DIR).tmp && mkdir -p $(JAEGER_DIR).tmp/mod
	cd $(JAEGER_DIR).tmp/mod && go mod init jaeger-build \
	  && go mod edit -replace github.com/Shopify/sarama=github.com/Shopify/sarama@v1.33.0 \
	  && GOFLAGS=-mod=mod go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@$(JAEGER_VERSION) \
	  && go build -o ../jaeger github.com/jaegertracing/jaeger/cmd/jaeger
	rm -rf $(JAEGER_DIR).tmp/mod $(JAEGER_DIR) && mv $(JAEGER_DIR).tmp $(JAEGER_DIR)

jaeger: $(JAEGER)

lint: $(STAMP)
	$(BIN)/ruff check sidecar comparators ragflow_mq tests bench dashboards tools
	$(BIN)/ruff format --check sidecar comparators ragflow_mq tests bench dashboards tools

# ragflow_mq runs on RAGFlow's interpreter (3.12 in RAGFlow v0.23-v0.25, 3.13 from v0.26):
# checked against both versions' standard library, with what it imports (its tests run on 3.13
# in .venv-ragflow below).
typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy --python-version 3.13 -p ragflow_mq
	$(BIN)/mypy --python-version 3.12 -p ragflow_mq

pytest: $(STAMP) $(HELM) $(JAEGER)
	HELM=$(HELM) JAEGER=$(JAEGER) KAFKA_VERSION=$(KAFKA_VERSION) $(BIN)/pytest

# ragflow_mq's tests again (marked ragflow_pins), on RAGFlow's Python 3.13, in a second
# virtualenv holding what ragflow_mq's install brings at
# RAGFlow's versions (compose/ragflow-constraints.txt, from RAGFlow's uv.lock: valkey 6.0.2,
# orjson, PyYAML, cramjam, ...), so that a pin RAGFlow raises or lowers fails here first. First
# the plain install under RAGFlow's constraints, as RAGFlow's image makes it; then, with those
# versions held, the sidecar's extra and the test tools, which never meet RAGFlow's pins in a
# deployment. Built again only when the constraints or pyproject.toml change; `verify` prints
# the shared versions and fails on one that is not RAGFlow's. About 5 minutes on 2 busy CPUs.
RAGFLOW_VENV        := .venv-ragflow
RAGFLOW_STAMP       := $(RAGFLOW_VENV)/.installed
# RAGFlow's own interpreter (3.13 from v0.26): pyenv's on this machine; RAGFLOW_PYTHON=... to
# name another. Without one the build stops, rather than test RAGFlow's side on ours.
RAGFLOW_PYTHON      ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3) \
                         $(shell command -v python3.13))
RAGFLOW_CONSTRAINTS := compose/ragflow-constraints.txt
RAGFLOW_MQ_FREEZE   := $(RAGFLOW_VENV)/ragflow-mq-install.txt

$(RAGFLOW_STAMP): $(RAGFLOW_CONSTRAINTS) pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@test -n "$(RAGFLOW_PYTHON)" || { echo "Python 3.13 (RAGFlow's interpreter) not found: pyenv install 3.13, or RAGFLOW_PYTHON=/path/to/python3.13"; exit 2; }
	rm -rf $(RAGFLOW_VENV)
	$(RAGFLOW_PYTHON) -m venv $(RAGFLOW_VENV)
	$(RAGFLOW_VENV)/bin/python -m pip install -q --upgrade pip
	$(RAGFLOW_VENV)/bin/python -m pip install -q -c $(RAGFLOW_CONSTRAINTS) -e .
	$(RAGFLOW_VENV)/bin/python -m pip freeze --exclude-editable > $(RAGFLOW_MQ_FREEZE)
	$(RAGFLOW_VENV)/bin/python -m pip install -q -c $(RAGFLOW_MQ_FREEZE) -e '.[dev]'
	touch $(RAGFLOW_STAMP)

pytest-ragflow-pins: $(RAGFLOW_STAMP)
	$(RAGFLOW_VENV)/bin/python -m tools.ragflow_constraints verify --only $(RAGFLOW_MQ_FREEZE) $(RAGFLOW_CONSTRAINTS)
	$(RAGFLOW_VENV)/bin/pytest -m ragflow_pins

# The tests that need no server (no Valkey, Kafka, Helm, Prometheus, docker-compose, package
# index): those tests/tiers.py leaves unmarked by `servers`. About a minute and a half on 2
# busy CPUs; the stack is never started for them (tests/conftest.py).
pytest-check: $(STAMP)
	$(BIN)/pytest -m "not servers" -p no:cacheprovider --durations=5

# Side by side: ruff, mypy and pytest are each one process, and this machine has 2 CPUs; each
# one's output is printed whole when it ends (-O).
check: $(STAMP)
	@$(MAKE) --no-print-directory -j3 -O lint typecheck pytest-check

test-kafka39: $(STAMP)
	KAFKA_VERSION=$(KAFKA39_VERSION) $(BIN)/pytest -m kafka39

# The 3.9 row and RAGFlow's pins first, so that the run's closing line is the whole suite's count.
test: lint typecheck $(if $(KAFKA_VERSION),,test-kafka39) pytest-ragflow-pins pytest

demo: $(STAMP)
	$(BIN)/ragflow-sidecar demo $(DEMO_ARGS)
	$(BIN)/python tools/shift_demo.py

# Every benchmark in turn, each on a local stack of its own (docs/performance.md); a bench that
# misses its target or fails its check exits non-zero and stops the run, so the two with
# targets that a busy machine can miss (tracing, comparators) come first and last. Options per
# bench (see each file's docstring), e.g. `make bench OUTAGE_BENCH_ARGS="--outage-s 20"`; these
# defaults take about 30 minutes on 2 busy CPUs and keep the mirror's 1,000,000-entry backlog.
# The drain bench defaults to 200,000 tasks (~5 minutes); the 1,000,000 of issue 13 take ~18:
# `make bench DRAIN_BENCH_ARGS="--tasks 1000000"` (4 GB of free RAM, docs/performance.md).
# The second e2e run is issue 13's throughput target: `run` with the noop handler at 5,000
# tasks/s. The join bench runs last and does not fail the run (the leading -): its verdicts/s
# target (5,000/s or 0.3x the mirror) is met on some of these machines and not on others
# (docs/performance.md); it prints MISSED where not.
COMPARE_BENCH_ARGS ?=
MIRROR_BENCH_ARGS  ?= --entries 100000
OUTAGE_BENCH_ARGS  ?=
DRAIN_BENCH_ARGS   ?= --tasks 200000
STATE_BENCH_ARGS   ?=
# State-store bytes per served task (claim, done marker, document evidence), ~1 minute.
SERVED_STATE_BENCH_ARGS ?=
E2E_BENCH_ARGS     ?=
E2E_SATURATION_ARGS ?= --rate 5000 --seconds 60 --warmup-s 60 --handler noop
SERVE_BENCH_ARGS   ?=
SERVE_LATENCY_BENCH_ARGS ?=
# One 30-task document on 3 executors x 5 slots, 6 s tasks, Redis then Kafka: ~1 minute.
DOCUMENT_BENCH_ARGS ?=
# What install() costs one RAGFlow process (start-up, RSS, threads, CPU idle and served): ~3 min.
FOOTPRINT_BENCH_ARGS ?=
TRACING_BENCH_ARGS ?= --entries 5000 --mirror-entries 50000
JOIN_BENCH_ARGS    ?=
# No services: simulated rollouts through the gate's own tests, ~3 minutes on 2 CPUs.
GATE_BENCH_ARGS    ?=
# Issue 36's bound beside the gate's documents a step (60 A/A runs at 5 and 25 a minute).
GATE_BOUND_BENCH_ARGS ?=
# The watch at 100 % against a baseline, also simulated: ~2 minutes.
WATCH_BENCH_ARGS   ?=
LOADAVG = echo "load average: $$(cut -d' ' -f1-3 /proc/loadavg)"

bench: $(STAMP)
	@$(LOADAVG)
	$(BIN)/python bench/compare_throughput.py $(COMPARE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/mirror_throughput.py $(MIRROR_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/outage_rss.py $(OUTAGE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/drain_rss.py $(DRAIN_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/state_store_memory.py $(STATE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/served_state_bytes.py $(SERVED_STATE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/e2e_latency.py $(E2E_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/e2e_latency.py $(E2E_SATURATION_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/serve_throughput.py $(SERVE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/serve_latency.py $(SERVE_LATENCY_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/document_parallelism.py $(DOCUMENT_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/ragflow_mq_footprint.py $(FOOTPRINT_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/tracing_overhead.py $(TRACING_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/gate_calibration.py $(GATE_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/gate_bound.py $(GATE_BOUND_BENCH_ARGS)
	@$(LOADAVG)
	$(BIN)/python bench/watch_calibration.py $(WATCH_BENCH_ARGS)
	@$(LOADAVG)
	-$(BIN)/python bench/join_throughput.py $(JOIN_BENCH_ARGS)
	@$(LOADAVG)

clean:
	-$(BIN)/ragflow-sidecar local-stack down
	rm -rf .local $(VENV) $(RAGFLOW_VENV)
