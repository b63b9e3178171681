// The panel GEMM of the CPU kernels and its packing (AVX-512, with AVX512-BF16 pairs where the CPU has them, or
// AVX2). Textually part of cpu.cpp: included there inside its anonymous namespace, after the dtype helpers.
#pragma once

// ---- GEMM for decode-sized batches: C (M, N) = A (M, K) W^T (+ bias), W packed once into panels ----
//
// W (N, K) is stored as ceil(N / 16) panels, each (K, 16): panel p holds columns 16p .. 16p + 15 of C,
// k-major, zero past N. A block of up to 6 rows of A runs over one panel with 12 8-wide accumulators
// (6 rows x 16 columns) in registers: per k, two panel loads, six broadcasts, twelve FMAs. On AVX2 a batch of
// several blocks takes a panel 256 k values at a time, every block in turn, so the later blocks read the chunk
// from L1 (their sums carried between chunks in fp32). Each C element is one sum over k in order 0 .. K-1,
// whatever M or the row's place in its block: a row's result does not depend on the batch around it. Panels
// are split over the threads.

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

constexpr int64_t kPanel = 16;
constexpr int64_t kRows = 6;

inline v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline v8 load8(const bf16_t* p) {
    v8 out;
    for (int i = 0; i < 8; ++i) out[i] = to_f32(p[i]);
    return out;
}

// A batch of fewer rows than a block (decode at 1 to 5 streams) reads each panel once: its rows' sums stay in
// registers over the whole of k, A is read as it is and C written from the registers
template <int MR, typename T>
inline void stream_block(const T* a, int64_t lda, const T* panel, int64_t k_size, const T* bias, T* c, int64_t ldc,
                         int64_t cols) {
    v8 lo[MR], hi[MR];
    for (int r = 0; r < MR; ++r) lo[r] = hi[r] = v8{};
    for (int64_t k = 0; k < k_size; ++k) {
        const v8 w0 = load8(panel + k * kPanel), w1 = load8(panel + k * kPanel + 8);
        for (int r = 0; r < MR; ++r) {
            const float x = to_f32(a[r * lda + k]);
            lo[r] += x * w0;
            hi[r] += x * w1;
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int64_t j = 0; j < cols; ++j) {
            const float v = j < 8 ? lo[r][j] : hi[r][j - 8];
            c[r * ldc + j] = from_f32<T>(bias ? v + to_f32(bias[j]) : v);
        }
}

// One block of MR rows over k .. k_end of one panel, its sums carried in `tile` (MR rows of 16 fp32, row stride
// kPanel): each sum continues where the previous chunk of k left it, so it is still one sum over k in order.
// A is fp32 here (a bf16 batch is converted once, `gemm`): a broadcast is one load. `ahead` (kAhead): the next
// panel, fetched a line per k while the first row block runs over this one, so the weights stream from memory
// under the FMAs (it paid at decode batches, not below 6 rows: off there)
template <int MR, bool kAhead, typename T>
inline void gemm_block(const float* a, int64_t lda, const T* panel, int64_t k, int64_t k_end, float* tile,
                       const T* ahead) {
    v8 lo[MR], hi[MR];
    for (int r = 0; r < MR; ++r) lo[r] = load8(tile + r * kPanel), hi[r] = load8(tile + r * kPanel + 8);
    for (; k < k_end; ++k) {
        if (kAhead) __builtin_prefetch(ahead + k * kPanel);
        const v8 w0 = load8(panel + k * kPanel), w1 = load8(panel + k * kPanel + 8);
        for (int r = 0; r < MR; ++r) {
            const float x = a[r * lda + k];
            lo[r] += x * w0;
            hi[r] += x * w1;
        }
    }
    for (int r = 0; r < MR; ++r)
        *reinterpret_cast<v8u*>(tile + r * kPanel) = lo[r], *reinterpret_cast<v8u*>(tile + r * kPanel + 8) = hi[r];
}

#if defined(__AVX512F__)
// ---- the same GEMM on AVX-512: a panel row is one 16-wide register, so a block of up to 8 rows over three panels
// (or 12 over two) holds 24 accumulators of the 32 registers; the first block over a set reads it from memory,
// later ones (a batch of 16 runs as 8 + 8 rows) from L2 (gemm_blocks). Where the CPU has
// AVX512-BF16 a bf16 panel stores its k values in pairs (k, k + 1 side by side per column: one 64-byte row per
// pair) for `vdpbf16ps`, which adds both exact products to the fp32 accumulator in turn: still one in-order
// sum per output (pair by pair), whatever the batch.
#include <immintrin.h>

constexpr int64_t kWideRows = 12;
constexpr int64_t kGroupBytes = 256 * 1024;    // panels a thread keeps in L2 while several row blocks run over them

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <typename T>
inline void store_block(const __m512* acc, int rows, const T* bias, T* c, int64_t ldc, int64_t cols) {
    if (cols == kPanel) {        // a whole panel's columns: a vector store a row (bf16 rounded lane-wise, as below)
        for (int r = 0; r < rows; ++r) {
            const vf v = reinterpret_cast<const vf&>(acc[r]);
            store_lanes(c + r * ldc, bias ? v + load_lanes(bias) : v);
        }
        return;
    }
    alignas(64) float v[16];
    for (int r = 0; r < rows; ++r) {
        _mm512_store_ps(v, acc[r]);
        for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = from_f32<T>(bias ? v[j] + to_f32(bias[j]) : v[j]);
    }
}

// Lines of the panels a block's caller runs next, fetched into L2 while the block runs: lines first .. end - 1 of
// 64 bytes from `base`, kAheadRate of them a k step from the block's first.
constexpr int64_t kAheadRate = 2;
constexpr int64_t kAheadBlocks = 6;     // row blocks of a decode batch: more (a prefill chunk) read the set from L2
constexpr int64_t kSetMajorBlocks = 3;  // row blocks of a decode batch that run over each set in turn (gemm_blocks)
struct Ahead {
    const char* base;
    int64_t first, end;

    inline void fetch(int64_t step) const {
        for (int64_t j = 0; j < kAheadRate; ++j) {
            const int64_t line = first + step * kAheadRate + j;
            if (line < end) _mm_prefetch(base + line * 64, _MM_HINT_T1);
        }
    }
};

// One block: MR rows of A over NP neighbouring panels (NP * MR accumulators); each broadcast of A feeds NP FMAs, so
// more panels need fewer loads per FMA. fp32 math: fp32 weights, or bf16 weights converted in registers where the CPU
// has no bf16 dot product. kAhead: `ahead`'s lines prefetched as the k steps go.
template <int MR, int NP, bool kAhead, typename T>
inline void wide_block(const T* a, int64_t lda, const T* panel, int64_t depth, int64_t k_size, const T* bias, T* c,
                       int64_t ldc, int64_t cols, Ahead ahead) {
    __m512 acc[NP][MR];
    for (int q = 0; q < NP; ++q)
        for (int r = 0; r < MR; ++r) acc[q][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_size; ++k) {
        __m512 w[NP];
        for (int q = 0; q < NP; ++q) w[q] = load16(panel + q * depth * kPanel + k * kPanel);
        if (kAhead) ahead.fetch(k);
        for (int r = 0; r < MR; ++r) {
            const __m512 x = _mm512_set1_ps(to_f32(a[r * lda + k]));
            for (int q = 0; q < NP; ++q) acc[q][r] = _mm512_fmadd_ps(x, w[q], acc[q][r]);
        }
    }
    for (int q = 0; q < NP; ++q)
        store_block(acc[q], MR, bias ? bias + q * kPanel : nullptr, c + q * kPanel, ldc, std::min(kPanel, cols - q * kPanel));
}

#if defined(__AVX512BF16__)
constexpr bool kPairs = true;
template <int MR, int NP, bool kAhead>
inline void wide_block(const bf16_t* a, int64_t lda, const bf16_t* panel, int64_t depth, int64_t k_size,
                       const bf16_t* bias, bf16_t* c, int64_t ldc, int64_t cols, Ahead ahead) {
    __m512 acc[NP][MR];
    for (int q = 0; q < NP; ++q)
        for (int r = 0; r < MR; ++r) acc[q][r] = _mm512_setzero_ps();
    const int64_t pairs = (k_size + 1) / 2;
    auto step = [&](int64_t kp, auto pair_of) {
        __m512bh w[NP];
        for (int q = 0; q < NP; ++q) w[q] = (__m512bh)_mm512_loadu_si512(panel + q * depth * kPanel + kp * 2 * kPanel);
        if (kAhead) ahead.fetch(kp);
        for (int r = 0; r < MR; ++r) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32(pair_of(a + r * lda + 2 * kp));
            for (int q = 0; q < NP; ++q) acc[q][r] = _mm512_dpbf16_ps(acc[q][r], x, w[q]);
        }
    };
    for (int64_t kp = 0; kp < k_size / 2; ++kp)
        step(kp, [](const bf16_t* x) { int32_t v; std::memcpy(&v, x, 4); return v; });
    if (k_size & 1)         // the last k alone: its pair's second weight is the packing's zero
        step(pairs - 1, [](const bf16_t* x) { return static_cast<int32_t>(*x); });
    for (int q = 0; q < NP; ++q)
        store_block(acc[q], MR, bias ? bias + q * kPanel : nullptr, c + q * kPanel, ldc, std::min(kPanel, cols - q * kPanel));
}
#else
constexpr bool kPairs = false;
#endif

// a block of `rows` (1 .. MR) rows over NP panels
template <int MR, int NP, bool kAhead, typename T>
inline void wide_rows(int rows, const T* a, int64_t lda, const T* panel, int64_t depth, int64_t k, const T* bias, T* c,
                      int64_t ldc, int64_t cols, Ahead ahead) {
    if constexpr (MR > 1) {
        if (rows < MR) return wide_rows<MR - 1, NP, kAhead>(rows, a, lda, panel, depth, k, bias, c, ldc, cols, ahead);
    }
    wide_block<MR, NP, kAhead>(a, lda, panel, depth, k, bias, c, ldc, cols, ahead);
}

// the depth of a packed panel: k, or k rounded up to pairs where bf16 panels hold pairs
inline int64_t panel_depth(int64_t k, bool bf16) { return bf16 && kPairs ? k + (k & 1) : k; }

// Panels p0 .. p1 - 1 (one group) for every row block of A, NP panels at a time (gemm_blocks)
template <int MR, int NP, typename T>
void run_group(const T* a, int64_t lda, const T* packed, const T* bias, T* c, int64_t ldc, int64_t m, int64_t n,
               int64_t k, int64_t p0, int64_t p1, int64_t per_block, int64_t share, int64_t set_lines, bool fetch,
               bool set_major) {
    const int64_t panels = (n + kPanel - 1) / kPanel, depth = panel_depth(k, sizeof(T) == 2);
    auto one_set = [&](int64_t p, int64_t r, int64_t i) {
        const int rows = static_cast<int>(std::min(per_block, m - r));
        const T* ar = a + r * lda;
        T* cr = c + r * ldc;
        const T* panel = packed + p * depth * kPanel;
        const int64_t col = p * kPanel, cols = std::min(NP * kPanel, n - col);
        const T* b = bias ? bias + col : nullptr;
        const Ahead ahead{reinterpret_cast<const char*>(panel + NP * depth * kPanel), i * share,
                          std::min(set_lines, (i + 1) * share)};
        if (fetch && p + 2 * NP <= panels)
            wide_rows<MR, NP, true>(rows, ar, lda, panel, depth, k, b, cr + col, ldc, cols, ahead);
        else
            wide_rows<MR, NP, false>(rows, ar, lda, panel, depth, k, b, cr + col, ldc, cols, ahead);
    };
    auto tail = [&](int64_t p, int64_t r) {
        const int rows = static_cast<int>(std::min(per_block, m - r));
        const T* panel = packed + p * depth * kPanel;
        const int64_t col = p * kPanel;
        wide_rows<MR, 1, false>(rows, a + r * lda, lda, panel, depth, k, bias ? bias + col : nullptr,
                                c + r * ldc + col, ldc, std::min(kPanel, n - col), Ahead{});
    };
    const int64_t full = p0 + (p1 - p0) / NP * NP;
    if (set_major) {
        for (int64_t p = p0; p < full; p += NP)
            for (int64_t r = 0, i = 0; r < m; r += per_block, ++i) one_set(p, r, i);
        for (int64_t p = full; p < p1; ++p)
            for (int64_t r = 0; r < m; r += per_block) tail(p, r);
        return;
    }
    for (int64_t r = 0, i = 0; r < m; r += per_block, ++i) {
        for (int64_t p = p0; p < full; p += NP) one_set(p, r, i);
        for (int64_t p = full; p < p1; ++p) tail(p, r);     // a group's last panels, one at a time
    }
}

// Each thread takes an even, contiguous share of the sets of NP panels and runs it in groups that fit L2, NP panels
// at a time; each group runs every row block of A (rows split evenly into blocks of at most MR) before the next group,
// so a prefill chunk streams each weight once and a decode batch reads it once from memory. (Whole groups dealt to the
// threads left one of 2 idle for part of a GEMM of few groups, such as SmolLM2's bf16 q/k/v and o projections.) In a
// decode batch (at most kAheadBlocks row blocks), while a set of NP panels runs, each row block fetches its share of
// the next set into L2, two lines a k step from its start (a batch of one block, up to 8 rows, so fetches the set's
// first two thirds and leaves the rest to the hardware); that beat the first block fetching the whole next set into L1
// at 8-16 rows. A batch of 2 or 3 blocks (9-36 rows) runs them over each set in turn before the next set (set_major),
// so every share of the next set is fetched before that set runs (group by group, the first block ran over
// half-fetched sets); 6 blocks (48 rows) gained nothing from it, so they keep group order. A prefill chunk's many row
// blocks read each group from L2 and leave its stream to the hardware (fetching gained nothing there). Shares fetched
// evenly over a block's steps were slower. Figures: docs/benchmark-log.md.
template <int MR, int NP, typename T>
void gemm_blocks(const T* a, int64_t lda, const T* packed, const T* bias, T* c, int64_t ldc, int64_t m, int64_t n,
                 int64_t k) {
    const int64_t panels = (n + kPanel - 1) / kPanel, depth = panel_depth(k, sizeof(T) == 2);
    const int64_t sets = (panels + NP - 1) / NP;
    const int64_t panel_bytes = depth * kPanel * static_cast<int64_t>(sizeof(T));
    const int64_t blocks = (m + MR - 1) / MR, per_block = blocks ? (m + blocks - 1) / blocks : 0;
    const int64_t group = blocks <= 1 ? NP : std::max<int64_t>(NP, kGroupBytes / panel_bytes / NP * NP);
    const int64_t set_lines = NP * panel_bytes / 64, share = blocks ? (set_lines + blocks - 1) / blocks : 0;
    const bool fetch = blocks <= kAheadBlocks, set_major = blocks >= 2 && blocks <= kSetMajorBlocks;
#pragma omp parallel if (m * n * k >= (1 << 18))
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = std::min(panels, sets * t / threads * NP);
        const int64_t last = std::min(panels, sets * (t + 1) / threads * NP);
        for (int64_t p0 = first; p0 < last; p0 += group)
            run_group<MR, NP>(a, lda, packed, bias, c, ldc, m, n, k, p0, std::min(last, p0 + group), per_block, share,
                              set_lines, fetch, set_major);
    }
}

// The block shape by the row count. Blocks of up to 8 rows over three panels (per k: three panel loads and eight
// broadcasts feed 24 FMAs) ran SmolLM2's GEMMs faster than blocks of up to 12 over two (14 loads for 24 FMAs) at
// prefill chunks and at most batch sizes; 12 x 2 stays where it needs fewer
// blocks of a small batch (9-12 rows: one block, not two; 17-36 rows). Figures: docs/benchmark-log.md.
template <typename T>
void gemm(const T* a, int64_t lda, const T* packed, const T* bias, T* c, int64_t ldc, int64_t m, int64_t n,
          int64_t k) {
    if (m <= 36 && (m + 7) / 8 > (m + kWideRows - 1) / kWideRows)
        gemm_blocks<kWideRows, 2>(a, lda, packed, bias, c, ldc, m, n, k);
    else
        gemm_blocks<8, 3>(a, lda, packed, bias, c, ldc, m, n, k);
}

template <typename T>
void pack_panels(const T* w, int64_t n, int64_t k, T* packed) {
    const int64_t panels = (n + kPanel - 1) / kPanel, depth = panel_depth(k, sizeof(T) == 2);
    const bool pairs = sizeof(T) == 2 && kPairs;
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t kk = 0; kk < depth; ++kk)
            for (int64_t j = 0; j < kPanel; ++j) {
                const int64_t col = p * kPanel + j;
                const int64_t at = pairs ? (p * depth + kk / 2 * 2) * kPanel + j * 2 + kk % 2 : (p * depth + kk) * kPanel + j;
                packed[at] = col < n && kk < k ? w[col * k + kk] : T{};
            }
}

#else  // AVX2: the 6 x 16 blocks above

inline int64_t panel_depth(int64_t k, bool) { return k; }

constexpr int64_t kDepthChunk = 256;   // k values of a panel every row block runs over while they are in L1
constexpr int64_t kRowGroup = 192;     // rows of A per pass over the panels (at most; gemm)

template <typename T>
void gemm_rows(const float* a, int64_t lda, const T* packed, const T* bias, T* c, int64_t ldc, int64_t m, int64_t n,
               int64_t k) {
    const int64_t panels = (n + kPanel - 1) / kPanel;
    const int64_t chunk = m > kRows ? kDepthChunk : k;    // one row block reads its panel once: no chunks
#pragma omp parallel for schedule(static) if (m * n * k >= (1 << 18))
    for (int64_t p = 0; p < panels; ++p) {
        alignas(32) float tile[kRowGroup * kPanel];     // the panel's sums for every row, across the chunks of k
        std::fill(tile, tile + m * kPanel, 0.f);
        const T* panel = packed + p * k * kPanel;
        const T* ahead = p + 1 < panels ? panel + k * kPanel : nullptr;
        for (int64_t k0 = 0; k0 < k; k0 += chunk) {
            const int64_t k1 = std::min(k, k0 + chunk);
            const T* w = panel;
            int64_t r = 0;
            for (; r + kRows <= m; r += kRows) {
                if (r == 0 && ahead)
                    gemm_block<kRows, true>(a, lda, w, k0, k1, tile, ahead);
                else
                    gemm_block<kRows, false>(a + r * lda, lda, w, k0, k1, tile + r * kPanel, ahead);
            }
            switch (m - r) {     // the rows left; a batch of fewer than 6 rows streams its panels unaided (faster)
#define TAIL(n) case n: gemm_block<n, false>(a + r * lda, lda, w, k0, k1, tile + r * kPanel, ahead); break;
                TAIL(5) TAIL(4) TAIL(3) TAIL(2) TAIL(1)
#undef TAIL
                default: break;
            }
        }
        const int64_t col = p * kPanel, cols = std::min(kPanel, n - col);
        for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < cols; ++j) {
                const float v = tile[r * kPanel + j];
                c[r * ldc + col + j] = from_f32<T>(bias ? v + to_f32(bias[col + j]) : v);
            }
    }
}

// A prefill-sized batch runs in groups of rows (each panel's sums for a group stay in L1). A bf16 group is
// converted to fp32 once (exactly), so the blocks broadcast it with one load per row and k; the copy stays a few MB
// whatever the prompt.

template <typename T>
void gemm(const T* a, int64_t lda, const T* packed, const T* bias, T* c, int64_t ldc, int64_t m, int64_t n,
          int64_t k) {
    if (m < kRows) {
        const int64_t panels = (n + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static) if (m * n * k >= (1 << 18))
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t col = p * kPanel, cols = std::min(kPanel, n - col);
            const T* b = bias ? bias + col : nullptr;
            switch (m) {
#define SMALL(n) case n: stream_block<n>(a, lda, packed + p * k * kPanel, k, b, c + col, ldc, cols); break;
                SMALL(5) SMALL(4) SMALL(3) SMALL(2) SMALL(1)
#undef SMALL
                default: break;
            }
        }
        return;
    }
    std::vector<float> af(sizeof(T) == sizeof(float) ? 0 : std::min(m, kRowGroup) * k);
    for (int64_t r0 = 0; r0 < m; r0 += kRowGroup) {
        const int64_t rows = std::min(kRowGroup, m - r0);
        if constexpr (sizeof(T) == sizeof(float)) {
            gemm_rows(a + r0 * lda, lda, packed, bias, c + r0 * ldc, ldc, rows, n, k);
        } else {
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t j = 0; j < k; ++j) af[r * k + j] = to_f32(a[(r0 + r) * lda + j]);
            gemm_rows(af.data(), k, packed, bias, c + r0 * ldc, ldc, rows, n, k);
        }
    }
}

template <typename T>
void pack_panels(const T* w, int64_t n, int64_t k, T* packed) {
    const int64_t panels = (n + kPanel - 1) / kPanel;
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t j = 0; j < kPanel; ++j) {
                const int64_t col = p * kPanel + j;
                packed[(p * k + kk) * kPanel + j] = col < n ? w[col * k + kk] : T{};
            }
}

#endif
