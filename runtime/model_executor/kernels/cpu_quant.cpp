// Weight-only int8 / int4 GEMM on AMX tiles: C (M, N) bf16 = A (M, K) bf16 x W^T, W quantized
// (runtime/model_executor/parallel/quant.py: int8 per output channel, int4 in groups of 32 inputs).
//
// AMX multiplies bf16 tiles: A is 16 rows x 32 k of the activations (read in place), B 16 k-pairs x 16 columns
// in VNNI order (one 64-byte row per pair of k: column c's k and k + 1 side by side). The weights are stored
// blocked for that, as the kernel reads them: per set of 4 blocks of 16 output columns (one thread's unit), per tile
// of 32 k, per block, per pair of k, the 16 columns' two codes (int8: 32 bytes; int4: 16 bytes, column c's even k
// in byte c's low nibble, its odd k in the high one): a set is one sequential stream. Each B tile is made from its codes
// in registers as it is needed and stored to a 1 KiB buffer the tile loads from:
//   int8: the codes themselves (exact in bf16); the column's scale multiplies the fp32 sum at the end.
//   int4: 128 + q, exact in bf16; each group's (a tile's 32 k) fp32 sums are scaled and shifted after the tile
//   multiply (b_int4): no weight is rounded.
// Sums are fp32 in the C tiles. Four C tiles (64 columns) share each A tile. Threads split the column groups.
//
// Built only where the compiler targets AMX-BF16 (-march=native on such a CPU); `mstar_quant_amx` says whether
// this build has it and the kernel granted the process the tile state (arch_prctl).
#include "cpu_common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MSTAR_AMX 1
#endif

namespace {

constexpr int kCols = 16;           // columns per block (a B tile's width)
constexpr int kDepth = 32;          // k per tile (and int4's group)
constexpr int kBlocks = 4;          // column blocks (C tiles) sharing one A tile

constexpr int64_t tile_bytes(bool int4) { return (kDepth / 2) * kCols * (int4 ? 1 : 2); }

#ifdef MSTAR_AMX

struct TileConfig {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// tiles 0-3: C (rows x 16 fp32), 4: A (rows x 32 bf16), 5: B (16 pairs x 16 columns x 2 bf16)
void configure(int rows) {
    TileConfig cfg;
    for (int t = 0; t < 4; ++t) cfg.rows[t] = rows, cfg.colsb[t] = 64;
    cfg.rows[4] = rows, cfg.colsb[4] = 64;
    cfg.rows[5] = 16, cfg.colsb[5] = 64;
    _tile_loadconfig(&cfg);
}

// one B tile from int8 codes: 16 rows of 32 bytes -> 16 rows of 32 bf16
inline void b_int8(const int8_t* src, uint16_t* buf) {
    for (int r = 0; r < 16; ++r) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + r * 32))));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + r * 32 + 16))));
        _mm512_storeu_si512(buf + r * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

// one B tile from int4 codes: 16 rows of 16 bytes -> 16 rows of 32 bf16 128 + q, exact (bf16 bits 0x4300 | q:
// exponent 2^7, q in the mantissa); byte c holds column c's even k (low nibble) and odd k (high), which land in the
// low and high halves of lane c, the VNNI pair order. The group's scale and zero apply to the tile's fp32 sums
// (group_rows): sum x w = s sum x (128 + q) + (z - 136 s) sum x, for w = (q - 8) s + z.
inline void b_int4(const uint8_t* src, uint16_t* buf) {
    const __m512i low = _mm512_set1_epi32(0x0f), high = _mm512_set1_epi32(0xf0), bias = _mm512_set1_epi32(0x43004300);
    for (int r = 0; r < 16; ++r) {
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(src + r * 16)));
        const __m512i pair = _mm512_or_si512(_mm512_and_si512(d, low), _mm512_slli_epi32(_mm512_and_si512(d, high), 12));
        _mm512_storeu_si512(buf + r * 32, _mm512_or_si512(pair, bias));
    }
}

// a C tile's rows into `tmp` (rows x 16 fp32; tile numbers are immediates)
inline void store_c(int j, float* tmp) {
    switch (j) {
        case 0: _tile_stored(0, tmp, 64); break;
        case 1: _tile_stored(1, tmp, 64); break;
        case 2: _tile_stored(2, tmp, 64); break;
        default: _tile_stored(3, tmp, 64); break;
    }
}

inline void multiply(int j) {      // C_j += A B
    switch (j) {
        case 0: _tile_dpbf16ps(0, 4, 5); break;
        case 1: _tile_dpbf16ps(1, 4, 5); break;
        case 2: _tile_dpbf16ps(2, 4, 5); break;
        default: _tile_dpbf16ps(3, 4, 5); break;
    }
}

// rows r0 .. r0 + rows - 1 of C for column blocks b0 .. b0 + nb - 1. int8: the sums over all k stay in the C tiles,
// times the column's scale at the end. int4: each group's sums go to `acc` (rows x 64 fp32) scaled as b_int4 says;
// `xsum` (m x groups): each row's sum of x over each group.
template <bool kInt4>
void group_rows(const uint16_t* a, int64_t lda, int64_t r0, int rows, const uint8_t* packed, const uint16_t* scales,
                const float* xsum, uint16_t* c, int64_t ldc, int64_t b0, int nb, int64_t k, uint16_t* buf, float* tmp,
                float* acc) {
    const int64_t groups = k / kDepth;
    const uint8_t* set = packed + b0 * groups * tile_bytes(kInt4);
    if constexpr (kInt4) std::fill(acc, acc + rows * kBlocks * kCols, 0.f);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t g = 0; g < groups; ++g) {
        _tile_loadd(4, a + r0 * lda + g * kDepth, lda * 2);
        for (int j = 0; j < nb; ++j) {      // every B tile of this k first: its stores drain before the tile loads
            const uint8_t* src = set + (g * nb + j) * tile_bytes(kInt4);
            if constexpr (kInt4) b_int4(src, buf + j * 512);
            else b_int8(reinterpret_cast<const int8_t*>(src), buf + j * 512);
        }
        for (int j = 0; j < nb; ++j) {
            _tile_loadd(5, buf + j * 512, 64);
            multiply(j);
        }
        if constexpr (kInt4) {
            for (int j = 0; j < nb; ++j) {
                store_c(j, tmp);
                const uint16_t* sz = scales + ((b0 + j) * groups + g) * 2 * kCols;
                const __m512 s = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)sz));
                const __m512 z = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(sz + kCols)));
                const __m512 shift = _mm512_fnmadd_ps(_mm512_set1_ps(136.f), s, z);    // z - 136 s
                for (int r = 0; r < rows; ++r) {
                    float* out = acc + (r * kBlocks + j) * kCols;
                    const __m512 part = _mm512_fmadd_ps(shift, _mm512_set1_ps(xsum[(r0 + r) * groups + g]),
                                                        _mm512_loadu_ps(out));
                    _mm512_storeu_ps(out, _mm512_fmadd_ps(s, _mm512_loadu_ps(tmp + r * kCols), part));
                }
            }
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        }
    }
    for (int j = 0; j < nb; ++j) {
        const int64_t col = (b0 + j) * kCols;
        if constexpr (!kInt4) store_c(j, tmp);
        for (int r = 0; r < rows; ++r) {
            uint16_t* out = c + (r0 + r) * ldc + col;
            for (int q = 0; q < kCols; ++q)
                out[q] = mstar::from_f32<mstar::bf16_t>(kInt4 ? acc[(r * kBlocks + j) * kCols + q]
                                                              : tmp[r * kCols + q] * mstar::to_f32(scales[col + q]));
        }
    }
}

#endif  // MSTAR_AMX

}  // namespace

extern "C" {

// 1 where this build multiplies on AMX tiles and the process may use them, else 0
int mstar_quant_amx() {
#ifdef MSTAR_AMX
    static const int granted = [] {
        constexpr long kReqPerm = 0x1023, kTileData = 18;     // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        return syscall(SYS_arch_prctl, kReqPerm, kTileData) == 0 ? 1 : 0;
    }();
    return granted;
#else
    return 0;
#endif
}

// codes (n, k) row-major -> the blocked layout (module comment); int4: codes 0..15, two per byte
void mstar_quant_pack(const uint8_t* codes, int64_t n, int64_t k, int int4, uint8_t* out) {
    const int64_t blocks = n / kCols, groups = k / kDepth, tile = tile_bytes(int4);
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t b0 = b / kBlocks * kBlocks, nb = std::min<int64_t>(kBlocks, blocks - b0);
        for (int64_t g = 0; g < groups; ++g) {
            uint8_t* dst = out + b0 * groups * tile + (g * nb + (b - b0)) * tile;
            for (int64_t p = 0; p < kDepth / 2; ++p)
                for (int c = 0; c < kCols; ++c) {
                    const uint8_t* row = codes + (b * kCols + c) * k + g * kDepth + 2 * p;
                    if (int4) {
                        dst[p * kCols + c] = static_cast<uint8_t>((row[0] & 0x0f) | (row[1] << 4));
                    } else {
                        dst[(p * kCols + c) * 2] = row[0];
                        dst[(p * kCols + c) * 2 + 1] = row[1];
                    }
                }
        }
    }
}

// C (m, n) bf16 = A (m, k) bf16 x W^T; W packed by mstar_quant_pack; scales: int8 (n) bf16, int4 per (block, group)
// 16 scales then 16 zeros, bf16. n a multiple of 16, k of 32.
void mstar_quant_gemm(const void* a, int64_t lda, int64_t m, const void* packed, const void* scales, int int4,
                      void* c, int64_t ldc, int64_t n, int64_t k) {
#ifdef MSTAR_AMX
    const int64_t blocks = n / kCols, sets = (blocks + kBlocks - 1) / kBlocks;
    const auto* A = static_cast<const uint16_t*>(a);
    const auto* W = static_cast<const uint8_t*>(packed);
    const auto* S = static_cast<const uint16_t*>(scales);
    auto* C = static_cast<uint16_t*>(c);
    const int64_t groups = k / kDepth;
    std::vector<float> xsum(int4 ? m * groups : 0);      // int4: each row's sum of x over each group (b_int4)
    for (int64_t r = 0; r < (int4 ? m : 0); ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const __m512 lo = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(A + r * lda + g * kDepth)));
            const __m512 hi = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(A + r * lda + g * kDepth + 16)));
            xsum[r * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
        }
#pragma omp parallel if (sets > 1)
    {
        alignas(64) uint16_t buf[kBlocks * 512];
        alignas(64) float tmp[16 * kCols];
        alignas(64) float acc[16 * kBlocks * kCols];
        int configured = -1;
#pragma omp for schedule(static)
        for (int64_t s = 0; s < sets; ++s) {
            const int nb = static_cast<int>(std::min<int64_t>(kBlocks, blocks - s * kBlocks));
            for (int64_t r0 = 0; r0 < m; r0 += 16) {
                const int rows = static_cast<int>(std::min<int64_t>(16, m - r0));
                if (rows != configured) configure(rows), configured = rows;
                if (int4)
                    group_rows<true>(A, lda, r0, rows, W, S, xsum.data(), C, ldc, s * kBlocks, nb, k, buf, tmp, acc);
                else
                    group_rows<false>(A, lda, r0, rows, W, S, nullptr, C, ldc, s * kBlocks, nb, k, buf, tmp, acc);
            }
        }
        _tile_release();
    }
#else
    (void)a, (void)lda, (void)m, (void)packed, (void)scales, (void)int4, (void)c, (void)ldc, (void)n, (void)k;
#endif
}

}  // extern "C"
