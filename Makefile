# Everything a fresh machine needs goes through these targets; .ci/run uses them too.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test lint system-deps bench soak demo fleet fleet-sizing lock sync-monitoring proto fuzz screenshot clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

## run: the exporter on this node's GPUs, or on the built-in simulated node when there is no driver
run: $(STAMP)
	@if [ -e /dev/nvidiactl ] || ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml.so.1'; then \
		exec $(BIN)/gpu-exporter $(ARGS); \
	else \
		echo "No NVIDIA driver here: running the built-in simulated 8x H100 node (--simulate)."; \
		exec $(BIN)/gpu-exporter --simulate $(ARGS); \
	fi

## system-deps: Prometheus and Alertmanager binaries for the rule and end-to-end tests,
## Chromium for the status page's browser test, VictoriaMetrics, vmagent and vmalert for the
## kit's test on VictoriaMetrics, Slurm and munge for the one-node Slurm cluster, and Go with
## grpc-go's sources for the grpc-go kubelet of tests/allocation/test_grpc_go.py (built offline
## in GOPATH mode)
system-deps:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null \
		&& command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null \
		&& command -v chromium >/dev/null \
		&& command -v victoria-metrics >/dev/null && command -v vmagent >/dev/null \
		&& command -v vmalert >/dev/null \
		&& command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
		&& command -v go >/dev/null && [ -d /usr/share/gocode/src/google.golang.org/grpc ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus prometheus-alertmanager victoria-metrics chromium slurm-wlm munge golang-go \
			golang-google-grpc-dev >/dev/null; \
	else \
		echo "warning: promtool/amtool/victoria-metrics/vmagent/vmalert/chromium/slurmctld/munged/go or" \
		     "grpc-go's sources missing (apt-get install prometheus prometheus-alertmanager" \
		     "victoria-metrics chromium slurm-wlm munge golang-go golang-google-grpc-dev);" \
		     "tests that need them are skipped (they fail under CI=true)"; \
	fi

## test: install everything and run the whole suite (unit, integration, lint and types)
test: $(STAMP) system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## demo: simulated GPU nodes, Prometheus and Alertmanager with the kit's rules and routing; Ctrl-C stops
demo: $(STAMP) system-deps
	$(BIN)/python -m demo $(ARGS)

## fleet: N nodes (default 50) replayed from real simulated exporters on one loopback port, and a
## Prometheus file_sd file of their targets, to size a store (docs/operations.md "Sizing your store")
N ?= 50
fleet: $(STAMP)
	$(BIN)/python -m demo.fleet --nodes $(N) $(ARGS)

## fleet-sizing: the store's cost at 150, 300 and 600 replayed nodes, at defaults and with the detail
## flags (VictoriaMetrics, vmagent, vmalert; about 45 min; ARGS='--sizes 600 --variants defaults')
fleet-sizing: $(STAMP) system-deps
	$(BIN)/python bench/fleet_sizing.py $(ARGS)

## golden: rewrite tests/golden/exposition.txt, the whole exposition of tests/golden/scenario.yaml at
## a fixed simulated time; review its diff (every changed series is in it) and commit it
golden: $(STAMP)
	$(BIN)/python -m tests.golden.exposition

## lock: regenerate the image's pinned requirements from pyproject.toml
lock: $(STAMP)
	$(BIN)/python deploy/image/lock.py

## sync-monitoring: copy alerts/ and dashboards/ into deploy/monitoring/ for kustomize
sync-monitoring: $(STAMP)
	$(BIN)/python deploy/monitoring/sync.py

## proto: regenerate the committed kubelet pod-resources stubs (grpcio-tools is a dev dependency)
proto: $(STAMP)
	PYTHON=$(BIN)/python src/gpu_exporter/allocation/proto/regenerate.sh

## fuzz: coverage-guided search of the kernel-log parsers for FUZZ_SECONDS; failing inputs go to
## fuzz/crashes/ (installs atheris into the venv: it is not a CI dependency; docs/fuzzing.md)
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(BIN)/pip install -q 'atheris>=2.3'
	$(BIN)/python -m fuzz.kmsg_parser --seconds $(FUZZ_SECONDS) $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

## soak: 10 minutes of 64 scrapers with Xids, allocation changes and GPU losses injected; fails on a
## lost or double-counted Xid, a scrape error or RSS growth (ARGS='--duration 60' for a smoke run)
soak: $(STAMP)
	$(BIN)/python bench/soak.py $(ARGS)

## screenshot: regenerate docs/images/status-page.png (the status page in headless Chromium)
screenshot: $(STAMP) system-deps
	$(BIN)/python -m tests.status.screenshot

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
