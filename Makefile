# rsub developer commands. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# buf (protobuf lint, format, breaking-change check) from npm, pinned in .tools/package-lock.json.
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
TOOLS_STAMP := $(TOOLS)/node_modules/.installed
# promtool (Prometheus rules check and unit tests) from Debian's prometheus package: fetched
# with apt-get download and unpacked here (nothing installed system-wide); pinned version.
PROMETHEUS_DEB := 2.42.0+ds-5+deb12u1
PROMTOOL := $(TOOLS)/prometheus/promtool
PROMTOOL_STAMP := $(TOOLS)/prometheus/.installed-$(PROMETHEUS_DEB)
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (tests/support/work_units.py: one work unit per test file,
# the Spark session's files together, longest first). PYTEST_ARGS=-n0 runs it in one process.
# Four: the real-server files wait more than they compute, so a fourth worker fills the two
# cores (docs/benchmarks.md, "The test suite"). The failback scenario's hold that once outlasted
# its test under that load is mended (a successor takes over a hold left standing).
WORKERS ?= 4

.PHONY: help venv lock java image-tools image image-test floors demo demo-spark test check lint lint-python proto proto-check proto-lint proto-format proto-release chart-check chart-readme config-schema promtool alerts-check unit soak sim-variants chaos fuzz bench clean

help:
	@echo "make demo   - set up and run the local multi-region demo"
	@echo "make demo-spark - the example Spark pipeline through a regional failover"
	@echo "make test   - set up, lint and run the whole test suite (WORKERS=4 in parallel)"
	@echo "make check  - the quick tier: lint the Python, the pure tests, a short simulation"
	@echo "make proto  - regenerate Python code from protos/"
	@echo "make proto-format - format protos/ with buf"
	@echo "make proto-release - make protos/ the released schema (the breaking-change baseline)"
	@echo "make chart-readme - regenerate helm/rsub-sidecar/README.md from values.yaml"
	@echo "make config-schema - regenerate the chart's config schema and docs/configuration.md's keys from sidecar/config"
	@echo "make soak SECONDS=600 - run the simulations (leases, the real runtime) for as long as asked"
	@echo "make sim-variants SEEDS=40 - the real runtime's simulation over SEEDS seeds of every kind of run"
	@echo "make chaos SEEDS=10 SECONDS=60 [FIRST_SEED=1] - randomized fault campaign, a run per seed"
	@echo "make fuzz SECONDS=60 - fuzz every target (atheris) for SECONDS each, keep new coverage"
	@echo "make bench  - run the benchmarks under bench/"
	@echo "make lock   - re-resolve the dependencies and pin them in constraints.txt"
	@echo "make image  - build the sidecar image with podman (no registry, no network in the build)"
	@echo "make image-test - build the image and run its tests (two regions in containers)"
	@echo "make floors - install the declared lowest dependency versions and smoke-test them"

$(STAMP): pyproject.toml devtools/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,spark]' -e ./devtools
	touch $(STAMP)

# Re-resolve every dependency to its newest allowed version and pin the result.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade -e '.[dev,spark]' -e ./devtools
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^rsub'; } > constraints.tmp
	mv constraints.tmp constraints.txt

venv: $(STAMP)

# Spark needs a JVM: use the machine's, install one with apt only when none is found.
java:
	@command -v java >/dev/null 2>&1 || { \
		echo "java not found: installing a headless JDK with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless; }

# The image (docs/deployment.md): podman, runc and mmdebstrap from Debian, installed with apt
# only when one is missing, as `make java` does.
image-tools:
	@missing=; for tool in podman runc mmdebstrap; do \
		command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then echo "not found:$$missing: installing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

image: $(STAMP) image-tools
	$(BIN)/python scripts/image_tool.py build

image-test: image
	RSUB_IMAGE=$$($(BIN)/python scripts/image_tool.py name) $(BIN)/pytest tests/deploy/test_image.py

# Every direct dependency at its declared lowest version (uv, lowest-direct) in a fresh
# virtualenv, and the product's smoke tests run there (tests/deploy/test_floors.py; make test
# runs it too).
floors: $(STAMP)
	$(BIN)/pytest tests/deploy/test_floors.py

proto: $(STAMP)
	$(BIN)/python protos/generate.py

proto-check: $(STAMP)
	$(BIN)/python protos/generate.py --check

$(TOOLS_STAMP): $(TOOLS)/package.json $(TOOLS)/package-lock.json
	npm ci --prefix $(TOOLS) --no-audit --no-fund --ignore-scripts
	touch $(TOOLS_STAMP)

# buf.yaml: lint STANDARD, formatted as `buf format` writes, no breaking change against the
# released schema in protos/released beyond those listed in protos/accepted-breaks.txt.
proto-lint: $(STAMP) $(TOOLS_STAMP)
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(BIN)/python protos/breaking.py --buf $(BUF)

proto-format: $(TOOLS_STAMP)
	$(BUF) format -w

# apt-get download needs the package lists: refreshed (as `make java` does) only when the
# pinned version is not found in them.
$(PROMTOOL_STAMP):
	rm -rf $(TOOLS)/prometheus && mkdir -p $(TOOLS)/prometheus/deb
	cd $(TOOLS)/prometheus/deb && { apt-get download -qq prometheus=$(PROMETHEUS_DEB) || \
		{ apt-get update -qq && apt-get download -qq prometheus=$(PROMETHEUS_DEB); }; }
	dpkg-deb -x $(TOOLS)/prometheus/deb/prometheus_*.deb $(TOOLS)/prometheus/deb/root
	mv $(TOOLS)/prometheus/deb/root/usr/bin/promtool $(PROMTOOL)
	rm -rf $(TOOLS)/prometheus/deb
	$(PROMTOOL) --version
	touch $(PROMTOOL_STAMP)

promtool: $(PROMTOOL_STAMP)

# The alert rules the chart renders (its PrometheusRule's spec), as Prometheus loads them.
alerts-check: $(STAMP) $(PROMTOOL_STAMP)
	$(BIN)/python scripts/helm_tool.py rules helm/rsub-sidecar \
		-f helm/rsub-sidecar/ci/full-values.yaml > $(TOOLS)/prometheus/rules.yaml
	$(PROMTOOL) check rules $(TOOLS)/prometheus/rules.yaml

# On a release: protos/ becomes the baseline of the breaking-change check.
proto-release: $(STAMP)
	$(BIN)/python protos/breaking.py --release

# The Helm chart as chart-testing lints it (each ci/*-values.yaml: lint, render, validate),
# its README generated from the values' comments and its `config` schema (with the table of
# keys of docs/configuration.md) from the sidecar's settings model.
chart-check: $(STAMP)
	$(BIN)/python scripts/helm_tool.py ci helm/rsub-sidecar
	$(BIN)/python scripts/chart_readme.py --check
	$(BIN)/python scripts/config_schema.py --check

chart-readme: $(STAMP)
	$(BIN)/python scripts/chart_readme.py

config-schema: $(STAMP)
	$(BIN)/python scripts/config_schema.py

lint-python: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict tests bench scripts protos

lint: $(STAMP) proto-check proto-lint chart-check alerts-check lint-python

# The image's tests (make image-test) are not part of it (they add 2 minutes on a fresh
# machine); CI's budget for the suite is 30 minutes, its time: docs/benchmarks.md.
test: $(STAMP) java lint
	$(BIN)/pytest -n $(WORKERS) --dist loadfile $(PYTEST_ARGS)

# The quick tier for the inner loop, within 2 minutes: the Python lint, the pure tests (no
# server, no Spark: neither `integration` nor `spark`) less the long campaigns `make test`
# runs (CHECK_LEAVES_OUT: the simulations' seeded sweeps, the fuzzing budget, the wheel
# builds), and 10 s of the simulations from a fresh seed instead (`make soak`).
CHECK_LEAVES_OUT := tests/dev/test_shell_sim.py tests/dev/test_shell_failback.py \
	tests/dev/test_lease_sim.py tests/fuzz/test_fuzz.py \
	tests/deploy/test_image_wheels.py
check: lint-python $(TOOLS_STAMP) $(PROMTOOL_STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not integration and not spark" \
		$(addprefix --ignore=,$(CHECK_LEAVES_OUT)) $(PYTEST_ARGS)
	$(BIN)/python -m rsub_dev.sim.soak --seconds 10

demo: $(STAMP)
	$(BIN)/python -m examples.demo

demo-spark: $(STAMP) java
	$(BIN)/python -m examples.spark_failover

soak: $(STAMP)
	$(BIN)/python -m rsub_dev.sim.soak --seconds $(or $(SECONDS),600)

# The wide sweep `make test` leaves out (docs/simulation.md): the real runtime under
# simulation over SEEDS seeds of every kind of run its broken variants are caught with.
sim-variants: $(STAMP)
	RSUB_SIM_SEEDS=$(or $(SEEDS),40) $(BIN)/pytest -q tests/dev/test_shell_sim.py \
		tests/dev/test_shell_failback.py -k real_runtime

# The randomized fault campaign (docs/reliability.md): SEEDS runs from FIRST_SEED, each with
# SECONDS of faults on a real three-servers-per-region super-cluster. Make variables, not
# shell ones: bash always sets its own $$SECONDS.
chaos: $(STAMP)
	$(BIN)/python -m rsub_dev.chaos --seeds $(or $(SEEDS),10) \
		--first-seed $(or $(FIRST_SEED),1) --seconds $(or $(SECONDS),60)

# Coverage-guided fuzzing (tests/fuzz): each target for SECONDS, from the corpus in
# tests/fuzz/corpus, to which the inputs reaching new coverage are added (commit them).
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --seconds $(or $(SECONDS),60) --merge

bench: $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(TOOLS)/node_modules .pytest_cache .mypy_cache .ruff_cache
