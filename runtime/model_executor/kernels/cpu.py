"""Fused CPU kernels for a decoder layer's work between its GEMMs (cpu.cpp, cpu_decode.cpp, cpu_prefill.cpp).

Why: on CPU a decode step of a small model spends about a third of its time outside the GEMMs
(`python tools/profile_decode.py`: norms, RoPE, the KV write, attention, SiLU·up, residual adds),
as some forty torch ops a layer, each a dispatch, a fresh tensor and often a pass over memory.
These kernels do the same work in five calls a layer, each one pass:

    rms_norm(x, weight, eps)                  the first layer's input norm
    add_rms_norm(residual, delta, weight, eps) residual += delta, then its norm (every later norm)
    rope_cache(q, k, v, cos, sin, slots, ...) RoPE on q and k in place, k and v into the paged cache
    paged_decode(q, k_cache, v_cache, ...)    decode attention reading the cache's blocks in place
    paged_prefill(q, k_cache, v_cache, ...)   a prompt chunk's causal attention over the same blocks
    silu_mul(gate_up)                         SwiGLU's silu(gate) * up

The same library holds the panel GEMM the packed linears use (`pack_panels(weight)` once, then
`gemm(x, packed, n, bias)`; runtime.model_executor.parallel.cpu_linear says when): each output one in-order sum
over k, so a row does not depend on its batch. Its blocks are chosen at build time for the
CPU's vectors: 6 rows x 16 columns on AVX2, up to 12 rows x 32 columns on AVX-512, bf16 pairs
for `vdpbf16ps` where the CPU has AVX512-BF16 (`panel_depth`: the packed k, even there).

They keep torch's arithmetic where it rounds (fp32 math, bf16 results rounded at the points
torch rounds them), so tokens match the torch path's; the summation order differs, as with any
other kernel (tests/runtime/kernels/test_cpu_kernels.py states the tolerances).

Built on first use with the system's C++ compiler (`$CXX`, else `c++`), `-O3 -march=native
-fopenmp`, in about a second, cached in `~/.cache/mstar/kernels` (`MSTAR_KERNEL_CACHE`) under
a hash of the source, the compiler and this CPU's flags (a home that cannot be written: a
folder in the temp dir); loaded with ctypes (a plain C ABI: no
torch headers, no pickle). The OpenMP runtime is torch's own libgomp, already loaded, so the
kernels share the worker's thread pool and its passive waits.

`MSTAR_CPU_KERNELS=torch` switches them off (the panel GEMM too: `auto` then picks oneDNN).
Where they cannot build (no compiler) the layers
run their torch ops and `status()` says why; the worker logs it as a warning and `/v1/models`
lists it (`cpu_kernels`): a slower mode, never a silent one.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "cpu.cpp", HERE / "cpu_decode.cpp", HERE / "cpu_prefill.cpp", HERE / "cpu_stack.cpp",
           HERE / "cpu_quant.cpp")   # one library
HEADERS = (HERE / "cpu_common.h", HERE / "cpu_lanes.h", HERE / "cpu_gemm.h")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-Wno-psabi", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math", "-shared", "-fPIC", "-std=c++17")
MAX_HEAD_DIM = 256                         # the kernels' fixed per-thread buffers (cpu.cpp)
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_lib: ctypes.CDLL | None = None
_status: str | None = None                 # "" once loaded; else why not


@functools.cache
def cpu_flags() -> str:
    """This CPU's flags line of /proc/cpuinfo ("flags : fpu vme ..."), or the platform's processor name."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _cache_dir() -> Path:
    """MSTAR_KERNEL_CACHE, else ~/.cache/mstar/kernels, else (a home that cannot be written) one in the temp dir."""
    if os.environ.get("MSTAR_KERNEL_CACHE"):
        path = Path(os.environ["MSTAR_KERNEL_CACHE"])
        path.mkdir(parents=True, exist_ok=True)
        return path
    for path in (Path.home() / ".cache" / "mstar" / "kernels", Path(tempfile.gettempdir()) / f"mstar-kernels-{os.getuid()}"):
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
        except OSError:
            continue
    raise RuntimeError("no writable directory for the built kernels (set MSTAR_KERNEL_CACHE)")


def _build() -> Path:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("no C++ compiler (set CXX or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    parts = [*(p.read_text() for p in (*SOURCES, *HEADERS)), compiler, version, " ".join(FLAGS), cpu_flags(),
             platform.machine()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    cache = _cache_dir()
    target = cache / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")     # then renamed: workers may build at once
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-800:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def _load() -> ctypes.CDLL:
    torch.get_num_threads()                 # torch (and its libgomp) loaded first: the kernels bind to it
    lib = ctypes.CDLL(str(_build()))
    p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    signatures = {
        "mstar_rms_norm": [p, i, p, p, i, i, i, f, ctypes.c_int],
        "mstar_add_rms_norm": [p, p, p, p, i, i, f, ctypes.c_int],
        "mstar_silu_mul": [p, p, i, i, ctypes.c_int],
        "mstar_rope_cache": [p, i, i, p, i, i, p, i, p, p, i, p, p, p, i, ctypes.c_int],
        "mstar_paged_decode": [p, i, p, p, p, i, p, p, i, i, i, i, i, f, ctypes.c_int],
        "mstar_paged_prefill": [p, p, p, p, i, i, p, i, i, i, i, f, ctypes.c_int],
        "mstar_pack_panels": [p, i, i, p, ctypes.c_int],
        "mstar_gemm": [p, i, p, p, p, i, i, i, i, ctypes.c_int],
        "mstar_argmax": [p, i, i, i, p, ctypes.c_int],
        "mstar_decoder_stack": [p, i, p, p, p, i, i, i, i, i, i, i, f, f, p, p, p, p, p, ctypes.c_int],
        "mstar_quant_pack": [p, i, i, ctypes.c_int, p],
        "mstar_quant_gemm": [p, i, i, p, p, ctypes.c_int, p, i, i, i],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    lib.mstar_panel_depth.argtypes, lib.mstar_panel_depth.restype = [i, ctypes.c_int], i
    lib.mstar_quant_amx.argtypes, lib.mstar_quant_amx.restype = [], ctypes.c_int
    return lib


def status() -> str:
    """"" when the kernels are loaded, else why the layers run their torch ops (builds on first call)."""
    global _lib, _status
    if _status is None:
        if os.environ.get("MSTAR_CPU_KERNELS", "fused") == "torch":
            _status = "switched off (MSTAR_CPU_KERNELS=torch)"
        else:
            try:
                _lib, _status = _load(), ""
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                _status = f"not built: {exc}"
    return _status


@contextlib.contextmanager
def switched_off(reason: str = "switched off for this caller") -> Iterator[None]:
    """The kernels off for this process while the block runs (layers take their torch ops, `gemm_kernel`
    packs no panels): a model loaded and run inside it is torch's own evaluation of the same weights."""
    global _status
    built = status()
    _status = reason
    try:
        yield
    finally:
        _status = built


def describe() -> str:
    """What /v1/models says of a CPU decoder node: "fused", or why its layers run torch ops."""
    return "fused" if status() == "" else status()


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels take tensors like `x` (CPU, fp32 or bf16, not under torch.compile, not tracked by
    autograd: the kernels write in place behind its back, so a forward that keeps a graph runs torch's ops)."""
    return (x.device.type == "cpu" and x.dtype in _DTYPES and not x.requires_grad
            and not torch.compiler.is_compiling() and status() == "")


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of x (rows, n), last dim contiguous, as runtime.model_executor.layers.norm computes it."""
    rows, n = x.shape
    if x.stride(1) != 1:
        raise ValueError("rms_norm needs each row contiguous")
    out = torch.empty((rows, n), dtype=x.dtype)
    _lib.mstar_rms_norm(_ptr(x), x.stride(0), _ptr(weight), _ptr(out), n, rows, n, eps, _DTYPES[x.dtype])
    return out


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += delta (in place; both (rows, n) contiguous), then RMSNorm of the sum."""
    rows, n = residual.shape
    if not residual.is_contiguous():
        raise ValueError("add_rms_norm updates a contiguous residual in place")
    delta = delta.contiguous()
    out = torch.empty_like(residual)
    _lib.mstar_add_rms_norm(_ptr(residual), _ptr(delta), _ptr(weight), _ptr(out), rows, n, eps,
                            _DTYPES[residual.dtype])
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused (rows, 2n) gate/up projection (contiguous) -> (rows, n)."""
    rows, two_n = gate_up.shape
    gate_up = gate_up.contiguous()
    out = torch.empty((rows, two_n // 2), dtype=gate_up.dtype)
    _lib.mstar_silu_mul(_ptr(gate_up), _ptr(out), rows, two_n // 2, _DTYPES[gate_up.dtype])
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of rows x (rows, n), last dim contiguous: (rows,) int64, the first maximum of a
    row (its first NaN where it has one). Rows of more than 2^24 values (the kernel's fp32 lane indices) take
    torch's op."""
    rows, n = x.shape
    if x.stride(1) != 1 or n >= 1 << 24 or n == 0:
        return torch.argmax(x, dim=-1)
    out = torch.empty(rows, dtype=torch.int64)
    _lib.mstar_argmax(_ptr(x), x.stride(0), rows, n, _ptr(out), _DTYPES[x.dtype])
    return out


def heads_fit(head_dim: int) -> bool:
    return head_dim <= MAX_HEAD_DIM and head_dim % 2 == 0


def prefill_heads_fit(head_dim: int) -> bool:
    """Whether `paged_prefill` takes heads of this size (it runs over a head 16 values at a time)."""
    return head_dim % 16 == 0


def rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Rotate q (N, Hq, D) and k (N, Hkv, D) in place by the (N, 1, D) `cos`/`sin` tables of
    `RotaryEmbedding.cos_sin`, then store k and v (N, Hkv, D) at flat cache slots (N,) int64.
    q, k, v may be row-strided views (of the fused QKV output); heads and lanes contiguous."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    for t in (q, k, v):
        if t.stride(2) != 1 or t.stride(1) != d:
            raise ValueError("rope_cache needs each row's heads contiguous")
    cos, sin, slots = cos.contiguous(), sin.contiguous(), slots.to(torch.int64).contiguous()
    _lib.mstar_rope_cache(_ptr(q), q.stride(0), hq, _ptr(k), k.stride(0), hkv, _ptr(v), v.stride(0),
                          _ptr(cos), _ptr(sin), d, _ptr(slots), _ptr(k_cache), _ptr(v_cache), n, _DTYPES[q.dtype])


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention: row b of q (B, Hq, D) over its seq_lens[b] (B,) int64 cached tokens, found through
    tables[b] (B, W) int64 block ids, in caches of (blocks, block_size, Hkv, D); -> (B, Hq, D). q may be a
    row-strided view (of the fused QKV output): no copy where each row's heads are contiguous."""
    b, hq, d = q.shape
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    out = torch.empty((b, hq, d), dtype=q.dtype)
    _lib.mstar_paged_decode(_ptr(q), q.stride(0), _ptr(k_cache), _ptr(v_cache), _ptr(tables), tables.shape[1],
                            _ptr(seq_lens), _ptr(out), b, hq, k_cache.shape[2], d, k_cache.shape[1], scale,
                            _DTYPES[q.dtype])
    return out


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                  context: int, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a request's chunk q (n, Hq, D), at positions context .. context + n - 1, over its
    cached tokens 0 .. context + n - 1 (the chunk's own already written), found through `blocks` (int64 block
    ids) in caches of (blocks, block_size, Hkv, D); -> `out` (n, Hq, D, contiguous), a new tensor if None.
    A row's result does not depend on how the prompt is cut into chunks (cpu_prefill.cpp)."""
    n, hq, d = q.shape
    q, blocks = q.contiguous(), blocks.to(torch.int64).contiguous()
    out = torch.empty_like(q) if out is None else out
    if not out.is_contiguous() or out.shape != q.shape:
        raise ValueError("paged_prefill writes a contiguous output of q's shape")
    _lib.mstar_paged_prefill(_ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(blocks), context, n, _ptr(out), hq,
                             k_cache.shape[2], d, k_cache.shape[1], scale, _DTYPES[q.dtype])
    return out


def decoder_stack(table: torch.Tensor, num_layers: int, first_norm: torch.Tensor, residual: torch.Tensor,
                  out: torch.Tensor, n: int, hidden: int, hq: int, hkv: int, d: int, inter: int, block_size: int,
                  eps: float, scale: float, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                  rows_info: torch.Tensor, rows_ptrs: torch.Tensor) -> None:
    """A decoder's layers in one call: runtime/model_executor/layers/cpu_stack.py builds the arguments (cpu_stack.cpp)."""
    _lib.mstar_decoder_stack(_ptr(table), num_layers, _ptr(first_norm), _ptr(residual), _ptr(out), n, hidden, hq,
                             hkv, d, inter, block_size, eps, scale, _ptr(cos), _ptr(sin), _ptr(slots),
                             _ptr(rows_info), _ptr(rows_ptrs), _DTYPES[residual.dtype])


PANEL = 16


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """A (N, K) weight as `gemm` reads it: ceil(N / 16) panels of (K, 16), k-major, zero-padded."""
    n, k = weight.shape
    weight = weight.detach().contiguous()
    depth = _lib.mstar_panel_depth(k, _DTYPES[weight.dtype])
    packed = torch.empty((-(-n // PANEL), depth, PANEL), dtype=weight.dtype)
    _lib.mstar_pack_panels(_ptr(weight), n, k, _ptr(packed), _DTYPES[weight.dtype])
    return packed


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) -> (..., n), W given as `pack_panels(W)`."""
    lead, k = x.shape[:-1], x.shape[-1]
    a = x.reshape(-1, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    out = torch.empty((a.shape[0], n), dtype=x.dtype)
    _lib.mstar_gemm(_ptr(a), a.stride(0), _ptr(packed), _ptr(bias) if bias is not None else None, _ptr(out), n,
                    a.shape[0], n, k, _DTYPES[x.dtype])
    return out.view(*lead, n)


def panel_rows(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Rows `ids` (any shape) of the (N, k) weight `packed` holds (`pack_panels`): (*ids.shape, k). A table
    packed for the LM head answers the embedding's lookups from the same copy."""
    flat = ids.reshape(-1)
    panel, col = flat // PANEL, flat % PANEL
    if _pairs(packed.dtype):      # bf16 on AVX512-BF16: k in pairs, (panels, depth / 2, 16, 2)
        rows = packed.view(packed.shape[0], packed.shape[1] // 2, PANEL, 2)[panel, :, col, :]
        rows = rows.reshape(flat.shape[0], packed.shape[1])
    else:                         # (panels, depth, 16)
        rows = packed[panel, :, col]
    return rows[:, :k].reshape(*ids.shape, k)


def gemm_columns(x: torch.Tensor, packed: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """x (..., K) @ W[lo:hi]^T for the weight `packed` holds: the panel GEMM over the panels of rows lo .. hi - 1."""
    first, last = lo // PANEL, -(-hi // PANEL)
    out = gemm(x, packed[first:last], (last - first) * PANEL, None)
    return out[..., lo - first * PANEL:hi - first * PANEL]


@functools.cache
def _pairs(dtype: torch.dtype) -> bool:
    """Whether `pack_panels` interleaves k in pairs for `dtype` (the C++ kPairs: bf16 with AVX512-BF16)."""
    probe = pack_panels(torch.tensor([[1.0, 2.0]], dtype=dtype))
    return bool(probe.reshape(-1)[1] == 2)


# ---- weight-only int8 / int4 GEMM on AMX tiles (cpu_quant.cpp; runtime/model_executor/parallel/quant.py) ----

QUANT_COLS, QUANT_DEPTH = 16, 32          # a weight's outputs in blocks of 16, its inputs in tiles of 32


def quant_amx() -> bool:
    """Whether the quantized GEMM on AMX tiles is built here and the OS lets this process use the tiles."""
    return status() == "" and bool(_lib.mstar_quant_amx())


def quant_pack(codes: torch.Tensor, int4: bool) -> torch.Tensor:
    """Codes (n, k) (int8, or uint8 in [0, 15]) in the blocked layout cpu_quant.cpp reads: n * k bytes, or half."""
    n, k = codes.shape
    codes = codes.contiguous().view(torch.uint8)
    out = torch.empty(n * k // (2 if int4 else 1), dtype=torch.uint8)
    _lib.mstar_quant_pack(_ptr(codes), n, k, int(int4), _ptr(out))
    return out


def quant_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, int4: bool, n: int) -> torch.Tensor:
    """x (m, k) bf16 @ the quantized (n, k) weight^T -> (m, n) bf16."""
    m, k = x.shape
    out = torch.empty(m, n, dtype=torch.bfloat16)
    _lib.mstar_quant_gemm(_ptr(x), x.stride(0), m, _ptr(packed), _ptr(scales), int(int4), _ptr(out), n, n, k)
    return out
