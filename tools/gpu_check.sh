#!/usr/bin/env bash
# GPU check, on a machine with a CUDA device (tests <= 150 s, benchmark <= 100 s: < 5 minutes in all):
#   1. the gpu-marked tests (Triton paged attention and CFG kernels, CUDA sampling, decode CUDA graphs:
#      capture + replay against the eager step, and the decoder LM executor capturing its plan's buckets);
#   2. a short decode benchmark of SmolLM2-135M (random weights, bf16): paged eager vs dense eager vs
#      paged CUDA graphs (tools/bench_paged_decode.py).
# It uses the machine's own torch and triton (never installs or upgrades them; no torch 2.13-only API is
# needed: torch 2.11 / triton 3.6 / Python 3.12 are fine) and installs the repository with --no-deps plus
# whichever small dependency the tests import is missing (into .gpu-check-deps/). Without network, fetch
# those wheels first on a networked machine and carry the folder along:
#   bash tools/gpu_check.sh --download-wheels .gpu-wheels     # on a networked machine (cp312, x86_64; ~20 MB)
#   MSTAR_WHEELS=.gpu-wheels bash tools/gpu_check.sh         # on the GPU machine (.gpu-wheels carried along)
# (The project's H200 image lacks only jsonschema and msgspec of these; it has no network.)
# Usage: bash tools/gpu_check.sh   (from anywhere; PY=python to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

# import name -> distribution name of what the gpu tests and the benchmark import besides torch/triton
DEPS="yaml:pyyaml jsonschema:jsonschema msgspec:msgspec safetensors:safetensors tqdm:tqdm numpy:numpy \
pytest:pytest pytest_timeout:pytest-timeout"

if [[ "${1:-}" == "--download-wheels" ]]; then
    dir=${2:?usage: gpu_check.sh --download-wheels DIR}
    python3 -m pip download -q -d "$dir" --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 \
        $(for d in $DEPS; do printf '%s ' "${d#*:}"; done)
    echo "wheels for the GPU check are in $dir"
    exit 0
fi

if [[ -z "${PY:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
unset TRITON_INTERPRET   # kernels must compile for the device, not run in the interpreter

"$PY" - <<'PYEOF'
import os, sys
try:
    import torch
except ImportError:
    sys.exit(f"gpu_check: FAILED - torch is not installed for {sys.executable}; set PY to the Python that has it")
if not torch.cuda.is_available():
    sys.exit("gpu_check: FAILED - no CUDA device (torch.cuda.is_available() is False, torch "
             f"{torch.__version__}, built for CUDA {torch.version.cuda}); run this on a GPU machine")
if not os.path.exists("/dev/nvidiactl"):
    sys.exit("gpu_check: FAILED - /dev/nvidiactl is missing: tests/conftest.py would skip every gpu test")
import triton
print(f"gpu_check: {torch.cuda.get_device_name(0)}, Python {sys.version.split()[0]}, torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), triton {triton.__version__}")
PYEOF

missing=$("$PY" - "$DEPS" <<'PYEOF'
import importlib.util, sys
pairs = [d.split(":") for d in sys.argv[1].split()]
print(" ".join(dist for module, dist in pairs if importlib.util.find_spec(module) is None))
PYEOF
)
# missing dependencies go to a folder of their own (no change to the machine's site-packages; works
# where pip refuses system-wide installs)
deps_dir=${MSTAR_GPU_DEPS:-.gpu-check-deps}
if [[ -n "$missing" ]]; then
    echo "gpu_check: installing $missing into $deps_dir"
    "$PY" -m pip install -q --target "$deps_dir" ${MSTAR_WHEELS:+--no-index --find-links "$MSTAR_WHEELS"} $missing
fi
# the repository itself, without its dependencies (torch and triton stay as they are); PYTHONPATH covers
# an interpreter where an editable install is not possible (no setuptools, an externally managed Python)
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || echo "gpu_check: editable install skipped; importing the repository through PYTHONPATH"
export PYTHONPATH="$PWD:$PWD/$deps_dir${PYTHONPATH:+:$PYTHONPATH}"

echo "gpu_check: gpu-marked tests"
mapfile -t gpu_tests < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu "${gpu_tests[@]}"

echo "gpu_check: decode benchmark (SmolLM2-135M shapes, random weights, bf16, triton attention)"
timeout 100 "$PY" tools/bench_paged_decode.py --device cuda --dtype bf16 --backend triton \
    --batches 1 8 32 --steps 16 --repeats 3
echo "gpu_check: OK"
