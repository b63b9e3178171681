# Sourced by tools/setup_vllm_cpu.sh and tools/setup_llamacpp.sh.
# peer_venv VENV PY PACKAGE...: a benchmark peer's own virtual environment on the local torch CPU wheel.
peer_venv() {
    local venv=$1 py=$2
    shift 2
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    # torch first, pinned: the local CPU wheel (anything unpinned would fetch a CUDA build)
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/pip" install -q "$@"
}
