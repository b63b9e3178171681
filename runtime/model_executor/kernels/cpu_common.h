// Shared by the CPU kernels' sources (cpu.cpp, cpu_decode.cpp, cpu_prefill.cpp): the dtypes, their conversions, the
// fast exp, the limits cpu.py checks.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>
#include <omp.h>

namespace mstar {

constexpr int64_t kParallelWork = 1 << 16;   // elements below which a loop stays on the calling thread
constexpr int64_t kMaxHeadDim = 256;          // cpu.py checks it

using bf16_t = uint16_t;

inline float to_f32(float x) { return x; }
inline float to_f32(bf16_t x) {
    uint32_t u = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

template <typename T> inline T from_f32(float v);
template <> inline float from_f32<float>(float v) { return v; }
template <> inline bf16_t from_f32<bf16_t>(float v) {     // round to nearest even, as torch's cast; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x40u);
    return static_cast<bf16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// a value as the dtype holds it: where torch computes a step in bf16, the result is rounded there
template <typename T> inline float round_to(float v) { return to_f32(from_f32<T>(v)); }

// exp in plain float arithmetic the compiler vectorises (Cephes' expf: range reduction by ln 2, a
// degree-6 polynomial, the exponent built in the bits); about 1 ulp from libm's over the clamp range.
// exp(r) for |r| <= ln 2 / 2: the polynomial, on a float or on a vector of them (cpu_lanes.h)
template <typename V>
inline V exp_reduced(V r) {
    V p = V{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.f;
}

inline float fast_exp(float x) {
    x = std::min(std::max(x, -87.33654f), 88.72283f);
    const float n = std::floor(x * 1.44269504088896341f + 0.5f);
    const float y = exp_reduced(x - n * 0.693359375f + n * 2.12194440e-4f);
    const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &e, 4);
    return y * scale;
}

}  // namespace mstar

// the C ABIs' dtype switch: `bf16` is 0 (fp32) or 1 (bf16)
#define DISPATCH(call_f32, call_bf16) \
    if (bf16) call_bf16; else call_f32
