// Fused CPU kernels of a decoder layer's non-GEMM work (runtime/model_executor/kernels/cpu.py builds and
// loads this file; the module doc says why and when). Plain C ABI over raw pointers: no torch
// headers, so a build takes about a second. Every kernel reads and writes fp32 or bf16 (`bf16`
// flag: each kernel is a template instantiated for both, so its inner loops are branch-free and
// the compiler vectorises them) and computes in fp32. OpenMP parallel loops run only where the work is large enough to
// pay for waking the pool's sleeping threads (the workers' threads wait passively).
#include "cpu_lanes.h"

namespace {

using namespace mstar;

// Each row runs kLanes values at a time (cpu_lanes.h: 16 on AVX-512, 8 on AVX2), the last few one by one, same steps.

// one row: x * rsqrt(mean of squares + eps) in the dtype, times the weight. `squares`: the row's sum of squares
template <typename T>
inline void norm_row(const T* x, const T* weight, T* out, int64_t n, float squares, float eps) {
    const float r = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        store_lanes(out + i, load_lanes(weight + i) * round_lanes<T>(load_lanes(x + i) * r));
    for (; i < n; ++i) out[i] = from_f32<T>(to_f32(weight[i]) * round_to<T>(to_f32(x[i]) * r));
}

template <typename T>
inline float sum_of_squares(const T* x, int64_t n) {
    vf lanes{};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const vf v = load_lanes(x + i);
        lanes += v * v;
    }
    float ss = sum_lanes(lanes);
    for (; i < n; ++i) ss += to_f32(x[i]) * to_f32(x[i]);
    return ss;
}

template <typename T>
void rms_norm(const T* x, int64_t x_stride, const T* weight, T* out, int64_t out_stride, int64_t rows, int64_t n,
              float eps) {
#pragma omp parallel for if (rows * n >= kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
        const T* row = x + r * x_stride;
        norm_row(row, weight, out + r * out_stride, n, sum_of_squares(row, n), eps);
    }
}

// residual += delta (one rounding to the dtype), then the sum's norm; the sum is read back from the row it was
// stored in (in cache)
template <typename T>
void add_rms_norm(T* residual, const T* delta, const T* weight, T* out, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for if (rows * n >= kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
        T* res = residual + r * n;
        const T* del = delta + r * n;
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes) store_lanes(res + i, load_lanes(res + i) + load_lanes(del + i));
        for (; i < n; ++i) res[i] = from_f32<T>(to_f32(res[i]) + to_f32(del[i]));
        norm_row(res, weight, out + r * n, n, sum_of_squares(res, n), eps);
    }
}

template <typename T>
void silu_mul(const T* x, T* out, int64_t rows, int64_t n) {
#pragma omp parallel for if (rows * n >= kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
        const T* gate = x + r * 2 * n;
        const T* up = gate + n;
        T* o = out + r * n;
        int64_t i = 0;                             // torch: silu(gate) in the dtype, then * up
        for (; i + kLanes <= n; i += kLanes) {
            const vf g = load_lanes(gate + i);
            store_lanes(o + i, round_lanes<T>(g / (1.f + exp_lanes(-g))) * load_lanes(up + i));
        }
        for (; i < n; ++i) {
            const float g = to_f32(gate[i]);
            o[i] = from_f32<T>(round_to<T>(g / (1.f + fast_exp(-g))) * to_f32(up[i]));
        }
    }
}

template <typename T>
void rope_cache(T* q, int64_t q_stride, int64_t hq, T* k, int64_t k_stride, int64_t hkv, const T* v,
                int64_t v_stride, const T* cos, const T* sin, int64_t d, const int64_t* slots, T* k_cache,
                T* v_cache, int64_t rows) {
    const int64_t half = d / 2;
#pragma omp parallel for if (rows * (hq + hkv) * d >= kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
        const T* c = cos + r * d;
        const T* s = sin + r * d;
        for (int64_t h = 0; h < hq + hkv; ++h) {
            T* head = h < hq ? q + r * q_stride + h * d : k + r * k_stride + (h - hq) * d;
            int64_t i = 0;                         // torch: addcmul(x * cos (in the dtype), swapped, sin)
            for (; i + kLanes <= half; i += kLanes) {
                const vf x0 = load_lanes(head + i), x1 = load_lanes(head + half + i);
                store_lanes(head + i, round_lanes<T>(x0 * load_lanes(c + i)) + x1 * load_lanes(s + i));
                store_lanes(head + half + i,
                            round_lanes<T>(x1 * load_lanes(c + half + i)) + x0 * load_lanes(s + half + i));
            }
            for (; i < half; ++i) {
                const float x0 = to_f32(head[i]), x1 = to_f32(head[i + half]);
                head[i] = from_f32<T>(round_to<T>(x0 * to_f32(c[i])) + x1 * to_f32(s[i]));
                head[i + half] = from_f32<T>(round_to<T>(x1 * to_f32(c[i + half])) + x0 * to_f32(s[i + half]));
            }
        }
        std::memcpy(k_cache + slots[r] * hkv * d, k + r * k_stride, hkv * d * sizeof(T));
        std::memcpy(v_cache + slots[r] * hkv * d, v + r * v_stride, hkv * d * sizeof(T));
    }
}

// the index of each row's largest value, as torch.argmax: the first of equal maxima, the first NaN where a row
// has one (NaN counts as the largest). Lanes keep their own first maximum (a strict > never moves an equal one
// later); across lanes the smallest index of the largest value wins.
template <typename T>
void argmax_rows(const T* x, int64_t stride, int64_t rows, int64_t n, int64_t* out) {
#pragma omp parallel for if (rows * n >= 4 * kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
        const T* row = x + r * stride;
        float best = -INFINITY;
        int64_t at = 0, i = 0;
        bool nan = false;
        if (n >= kLanes) {
            vf top = load_lanes(row), where = kLaneIndex, seen = top != top ? vf{} + 1.f : vf{};
            // lane indices run in fp32: exact below 2^24, which cpu.py checks
            for (i = kLanes; i + kLanes <= n; i += kLanes) {
                const vf v = load_lanes(row + i);
                where = v > top ? kLaneIndex + static_cast<float>(i) : where;
                top = v > top ? v : top;
                seen = v != v ? vf{} + 1.f : seen;
            }
            nan = max_lanes(seen) > 0.f;
            if (!nan) {
                best = max_lanes(top);
                float first = static_cast<float>(n);
                for (int j = 0; j < kLanes; ++j)
                    if (top[j] == best) first = std::min(first, where[j]);
                at = static_cast<int64_t>(first);
            }
        }
        for (int64_t j = nan ? 0 : i; j < n; ++j) {    // the tail; the whole row, one by one, where it has a NaN
            const float v = to_f32(row[j]);
            if (v != v) { at = j; break; }
            if (v > best || (j == 0 && !nan)) best = v, at = j;
        }
        out[r] = at;
    }
}

#include "cpu_gemm.h"   // the panel GEMM: C = A W^T over W packed once

}  // namespace

// the C ABI: void pointers and a dtype flag (0 fp32, 1 bf16); shapes and strides in elements (DISPATCH)

extern "C" {

// out[r] = rmsnorm(x[r]) * weight
void mstar_rms_norm(const void* x, int64_t x_stride, const void* weight, void* out, int64_t out_stride,
                    int64_t rows, int64_t n, float eps, int bf16) {
    DISPATCH(rms_norm((const float*)x, x_stride, (const float*)weight, (float*)out, out_stride, rows, n, eps),
             rms_norm((const bf16_t*)x, x_stride, (const bf16_t*)weight, (bf16_t*)out, out_stride, rows, n, eps));
}

// residual[r] += delta[r] (in the dtype, as torch's add), then out[r] = rmsnorm(residual[r]) * weight
void mstar_add_rms_norm(void* residual, const void* delta, const void* weight, void* out, int64_t rows, int64_t n,
                        float eps, int bf16) {
    DISPATCH(add_rms_norm((float*)residual, (const float*)delta, (const float*)weight, (float*)out, rows, n, eps),
             add_rms_norm((bf16_t*)residual, (const bf16_t*)delta, (const bf16_t*)weight, (bf16_t*)out, rows, n,
                          eps));
}

// out[r, i] = silu(x[r, i]) * x[r, n + i]: the SwiGLU product of a fused gate/up projection (rows of 2n)
void mstar_silu_mul(const void* x, void* out, int64_t rows, int64_t n, int bf16) {
    DISPATCH(silu_mul((const float*)x, (float*)out, rows, n), silu_mul((const bf16_t*)x, (bf16_t*)out, rows, n));
}

// RoPE ("rotate half", cos and sign-folded sin tables of (rows, d)) on the q and k heads of each row,
// in place, then k and v written into the paged caches at slots[r] (block * block_size + offset);
// q, k, v are head-major rows at their own row strides (views into the fused QKV output)
void mstar_rope_cache(void* q, int64_t q_stride, int64_t hq, void* k, int64_t k_stride, int64_t hkv,
                      const void* v, int64_t v_stride, const void* cos, const void* sin, int64_t d,
                      const int64_t* slots, void* k_cache, void* v_cache, int64_t rows, int bf16) {
    DISPATCH(rope_cache((float*)q, q_stride, hq, (float*)k, k_stride, hkv, (const float*)v, v_stride,
                        (const float*)cos, (const float*)sin, d, slots, (float*)k_cache, (float*)v_cache, rows),
             rope_cache((bf16_t*)q, q_stride, hq, (bf16_t*)k, k_stride, hkv, (const bf16_t*)v, v_stride,
                        (const bf16_t*)cos, (const bf16_t*)sin, d, slots, (bf16_t*)k_cache, (bf16_t*)v_cache, rows));
}

// the index of the largest value of each of `rows` rows of n (row r at x + r * stride), as torch.argmax
void mstar_argmax(const void* x, int64_t stride, int64_t rows, int64_t n, int64_t* out, int bf16) {
    DISPATCH(argmax_rows((const float*)x, stride, rows, n, out), argmax_rows((const bf16_t*)x, stride, rows, n, out));
}

// the k extent of a packed panel (k, or k rounded up to even for bf16 pairs on AVX512-BF16 CPUs)
int64_t mstar_panel_depth(int64_t k, int bf16) { return panel_depth(k, bf16 != 0); }

// W (n, k) row-major -> its panels (ceil(n / 16) * depth * 16 elements at `packed`)
void mstar_pack_panels(const void* w, int64_t n, int64_t k, void* packed, int bf16) {
    DISPATCH(pack_panels((const float*)w, n, k, (float*)packed), pack_panels((const bf16_t*)w, n, k, (bf16_t*)packed));
}

// c (m, n; row stride ldc) = a (m, k; row stride lda) @ W^T (+ bias) over W's panels
void mstar_gemm(const void* a, int64_t lda, const void* packed, const void* bias, void* c, int64_t ldc, int64_t m,
                int64_t n, int64_t k, int bf16) {
    DISPATCH(gemm((const float*)a, lda, (const float*)packed, (const float*)bias, (float*)c, ldc, m, n, k),
             gemm((const bf16_t*)a, lda, (const bf16_t*)packed, (const bf16_t*)bias, (bf16_t*)c, ldc, m, n, k));
}

}  // extern "C"
