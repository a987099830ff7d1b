# Set-up and entry points. `make demo` and `make test` work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# This machine's pip finds the CPU build of torch locally; elsewhere any torch >= 2.2 is fine:
# `make setup TORCH_SPEC=` keeps a torch that the venv already has.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.stamp-setup
FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: setup demo test test-all test-gpu lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	@if [ ! -d $(FASHION_MNIST) ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist)"; \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
		|| echo "could not install dataset-fashion-mnist: the demo falls back to --workload digits"; \
	fi
	touch $(STAMP)

demo: setup
	$(VENV)/bin/hetsync demo --out runs/demo

test: setup
	$(PY) -m pytest -q

test-all: setup  # the tests marked slow too (more of the same multi-process checks)
	$(PY) -m pytest -q -m ""

test-gpu: setup  # the tests that need a CUDA device (they skip without one): docs/gpus.md
	@$(PY) -c "import os, sys, torch; os.environ.get('HETSYNC_TEST_GPU_DEVICE') == 'cpu' \
	or torch.cuda.is_available() or sys.exit('make test-gpu: torch ' + torch.__version__ \
	+ ' sees no CUDA device, so every gpu test would skip; HETSYNC_TEST_GPU_DEVICE=cpu \
	make test-gpu checks their logic on the CPU')"
	$(PY) -m pytest -q -m gpu

lint: setup
	$(VENV)/bin/ruff check src tests experiments examples

bench: setup
	$(VENV)/bin/hetsync bench --out runs/bench-headline

clean:
	rm -rf runs .pytest_cache
