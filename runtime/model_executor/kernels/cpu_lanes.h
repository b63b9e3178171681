// Float vectors of one register for the CPU kernels (GCC's vector extension): 16 lanes in a zmm on AVX-512,
// 8 in a ymm on AVX2, shared by cpu.cpp, cpu_decode.cpp and cpu_prefill.cpp. (A 16-lane vector on AVX2 is no
// register of GCC's: every operation on one went through the stack, its halves stored and reloaded, which ran
// the kernels slower than torch's ops there; docs/benchmark-log.md, the Zen 3 runs.)
#pragma once
#include "cpu_common.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mstar {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef float vfu __attribute__((vector_size(kLanes * 4), aligned(4)));
typedef uint16_t vh __attribute__((vector_size(kLanes * 2), aligned(2)));
typedef uint32_t vu __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));

inline vf load_lanes(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline vf load_lanes(const bf16_t* p) {
    const vu bits = __builtin_convertvector(*reinterpret_cast<const vh*>(p), vu) << 16;
    vf out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
}
inline void store_lanes(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }

// the bf16 bits of 16 floats, as from_f32<bf16_t> rounds each (to nearest even; a NaN stays a NaN)
inline vu bf16_bits(vf v) {
    vu u;
    std::memcpy(&u, &v, sizeof(u));
    const vu nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : nearest;
}
inline void store_lanes(bf16_t* p, vf v) { *reinterpret_cast<vh*>(p) = __builtin_convertvector(bf16_bits(v), vh); }

// 16 values as the dtype holds them (round_to in cpu_common.h, lane by lane)
template <typename T> inline vf round_lanes(vf v);
template <> inline vf round_lanes<float>(vf v) { return v; }
template <> inline vf round_lanes<bf16_t>(vf v) {
    const vu bits = bf16_bits(v) << 16;
    vf out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
}
#if defined(__AVX512F__)
const vf kLaneIndex = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
const vf kLaneIndex = {0, 1, 2, 3, 4, 5, 6, 7};
#endif

// the lanes' largest value / sum: AVX2 halves the vector three times (a loop over the lanes would move each lane
// out on its own)
inline float max_lanes(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX2__)
    const __m256 y = reinterpret_cast<__m256>(v);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
#else
    float top = v[0];
    for (int j = 1; j < kLanes; ++j) top = std::max(top, v[j]);
    return top;
#endif
}

// fast_exp (cpu_common.h) on every lane at once, the same steps
inline vf exp_lanes(vf x) {
    x = x < -87.33654f ? vf{} - 87.33654f : x;
    x = x > 88.72283f ? vf{} + 88.72283f : x;
    const vf y0 = x * 1.44269504088896341f + 0.5f;
    vi n = __builtin_convertvector(y0, vi);                                     // toward zero, then down: floor
    n += __builtin_convertvector(n, vf) > y0;
    const vf nf = __builtin_convertvector(n, vf);
    const vf y = exp_reduced(x - nf * 0.693359375f + nf * 2.12194440e-4f);
    const vi e = (n + 127) << 23;
    vf scale;
    std::memcpy(&scale, &e, sizeof(scale));
    return y * scale;
}

inline float sum_lanes(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX2__)
    const __m256 y = reinterpret_cast<__m256>(v);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
#else
    float s = 0.f;
    for (int j = 0; j < kLanes; ++j) s += v[j];
    return s;
#endif
}

}  // namespace mstar
