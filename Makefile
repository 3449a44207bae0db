# The README's two commands: `make demo` and `make test`. Both create .venv and install on first use.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU wheel on CPU machines; GPU users: make install TORCH_SPEC=torch==2.13.0 TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
CONFIG ?= configs/train_dp.yaml
# Python writes a module's .pyc at its first import and every later process reads it, also where the
# machine sets PYTHONDONTWRITEBYTECODE=1 (as these do; without .pyc files every Ray worker compiles
# ray's sources again, ~4 s of CPU per process). The install imports once, in two processes (Ray's side
# and torch's), what the platform's processes import, so that processes starting together do not each
# compile it: 3,933 .pyc files, 21.5 s and 27 CPU-s for the whole install here, where compiling every
# installed file (uv's --compile-bytecode: transformers, sympy, pandas' and scipy's own test suites,
# ...) made it 34.9 s and 58 CPU-s. A module that only some test imports compiles at its first import.
export PYTHONDONTWRITEBYTECODE :=
WARM_RAY   := ray._private.workers.default_worker, ray.data._internal.execution.streaming_executor, \
	ray.serve._private.replica, ray.serve._private.controller, ray.serve._private.proxy, ray.dashboard.dashboard, \
	ray.dashboard.agent, ray._private.runtime_env.agent.main, ray.dashboard.modules.job.job_head
WARM_TORCH := torch.distributed.fsdp, torch.distributed.tensor.parallel, torch.distributed.pipelining, \
	torch.distributed.checkpoint, torch.ao.quantization, ray.train.torch, ray.train.v2._internal.execution.controller, \
	scaleforge.train, scaleforge.paramserver.fleet, serving.app, jobs.pipeline

.PHONY: install demo test test-fast gpu-check lint bench docs submit clean

install: $(STAMP)

# Everything through uv (16 s for torch against pip's 35 s), pip if uv cannot. Torch's CPU wheel lies in
# pip's find-links folder on CPU machines, where uv does not look unless told: it gets pip's setting.
# The project's own install keeps that torch, as it meets torch>=2.6.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	links=$$($(BIN)/python -m pip config get global.find-links 2>/dev/null || echo "$${PIP_FIND_LINKS:-}"); \
	$(BIN)/uv pip install --python $(BIN)/python -q "$(TORCH_SPEC)" \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $$(for l in $$links; do echo --find-links $$l; done) \
		|| $(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/uv pip install --python $(BIN)/python -q -e ".[test]" \
		|| $(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -c "import $(WARM_RAY)" & $(BIN)/python -c "import $(WARM_TORCH)"; status=$$?; wait $$! && exit $$status
	touch $(STAMP)

demo: install
	$(BIN)/python -m jobs.pipeline --config configs/pipeline.yaml

# Two workers (pytest-xdist), a test file per worker at a time: much of a test's time is spent
# waiting on processes it starts (jobs, heads, replicas); tests/conftest.py starts the longest first.
PYTEST_WORKERS ?= 2
# KubeRay's CRDs for tests/cluster/test_kuberay.py, read where they are (never copied into the tree):
# beside the checkout, else this machine's shared folder; without them those tests skip, saying so.
export SCALEFORGE_KUBERAY_CRDS ?= $(firstword $(wildcard $(CURDIR)/../shared/kuberay/v1.7.0 /work/shared/kuberay/v1.7.0))
test: install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# Ruff's lint rules and formatting (configured in pyproject.toml): both must be clean.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# On a machine with CUDA (install the CUDA build of torch first, see README): the GPU path, ~5 min.
gpu-check: install
	$(BIN)/python -m pytest -q -m gpu tests/gpu

test-fast: install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

# Every benchmark in bench/, side by side runs; their tables go into docs/results.md. A benchmark
# that ran to its bars but missed one gets its table written too (it ends "missed: ..."); one that
# crashed keeps its previous table (its output goes to bench/results/<name>.failed). Either way make
# fails at the end, naming it.
BENCHES ?= training node_loss resume preemption checkpoint_upload moe paramserver model_parallel serving compress lm lm_speedrun lm_layouts lm_levers lm_compile lm_big compress_lm generate pipeline_lm demo
bench: install
	mkdir -p bench/results
	failed=""; for b in $(BENCHES); do \
		if $(BIN)/python bench/$$b.py | tee bench/results/$$b.out; test $${PIPESTATUS[0]} -eq 0; then \
			mv bench/results/$$b.out bench/results/$$b.txt; rm -f bench/results/$$b.failed; \
		else if tail -n 1 bench/results/$$b.out | grep -q '^missed: '; then cp bench/results/$$b.out bench/results/$$b.txt; fi; \
			mv bench/results/$$b.out bench/results/$$b.failed; failed="$$failed $$b"; fi; done; \
	$(BIN)/python bench/results_tables.py docs/results.md bench/results README.md; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed (see bench/results/*.failed)" >&2; exit 1; fi

# The config reference, generated from the schemas' field docstrings (tests/tools/test_docs.py fails on drift).
docs: install
	$(BIN)/python -m scaleforge.config.reference docs/config.md

# Submit a job to a running cluster (RAY_ADDRESS, default the local head's dashboard).
submit: install
	RAY_AUTH_MODE=token $(BIN)/ray job submit --address $${RAY_ADDRESS:-http://127.0.0.1:8265} \
		--working-dir . --runtime-env-json '{"py_modules": ["platform/scaleforge"]}' \
		-- python -m jobs.train --config $(CONFIG)

clean:
	rm -rf $(VENV) .pytest_cache
