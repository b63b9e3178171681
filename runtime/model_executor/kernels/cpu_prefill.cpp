// Prefill attention over the paged KV cache on CPU, a request's chunk of query rows at once, flash-style
// (runtime/model_executor/kernels/cpu.py builds it with cpu.cpp and cpu_decode.cpp into one library).
#include "cpu_lanes.h"

namespace {

using namespace mstar;

// ---- prefill: a request's chunk of n query rows (positions context .. context + n - 1) over its cached keys ----
//
// The keys 0 .. context + n - 1 of each kv head are first copied, transposed, into tiles of kKeyTile keys
// (kt: (hkv, tiles, d, kKeyTile), fp32, zero past the last key), so that scoring a tile is a small GEMM whose
// rows are query rows and whose columns are the tile's keys: per head-dim lane i, each row's q[i] broadcast
// times the tile's row i, kKeyPanels vectors. A work item is a kv head and a tile of query positions, its rows
// every query head of the group at each position (rows = positions x group). Per key tile: scores, the causal
// mask, the running max and sum, then out = out * rescale + p @ V with V's rows read from the cache's blocks.
//
// Each row's result depends only on its position and the cache: the key tiles start at multiples of kKeyTile
// from key 0, a row's sums run over them in order, and a tile past the row's position leaves its state as it
// was (rescale exp(0) = 1, p = 0 on keys that exist). So a row attended with its whole prompt, after a cached
// prefix, or beside other rows is bit-equal: what keeps answers with the prefix cache equal to answers without.

#if defined(__AVX512F__)     // 32 vector registers of 16 lanes
constexpr int kScoreRows = 6, kKeyPanels = 4, kValueRows = 6, kValueVecs = 4;
#else                        // AVX2: 16 registers of 8 lanes
constexpr int kScoreRows = 6, kKeyPanels = 2, kValueRows = 6, kValueVecs = 2;
#endif
constexpr int64_t kKeyTile = kKeyPanels * kLanes;
constexpr int64_t kItemRows = 192;           // query rows (positions x group) a work item aims at: each item
                                             // streams its head's keys and values through the cache once
constexpr int64_t kRowQuantum = 12;          // rows are padded to a multiple of both microkernels' heights

// s (kScoreRows, kKeyTile) = qs (kScoreRows, d) . tile (d, kKeyTile)
inline void score_rows(const float* qs, int64_t d, const float* tile, float* s) {
    vf acc[kScoreRows][kKeyPanels];
    for (int r = 0; r < kScoreRows; ++r)
        for (int p = 0; p < kKeyPanels; ++p) acc[r][p] = vf{};
    for (int64_t i = 0; i < d; ++i) {
        vf k[kKeyPanels];
        for (int p = 0; p < kKeyPanels; ++p) k[p] = load_lanes(tile + i * kKeyTile + p * kLanes);
        for (int r = 0; r < kScoreRows; ++r) {
            const float x = qs[r * d + i];
            for (int p = 0; p < kKeyPanels; ++p) acc[r][p] += x * k[p];
        }
    }
    for (int r = 0; r < kScoreRows; ++r)
        for (int p = 0; p < kKeyPanels; ++p) store_lanes(s + r * kKeyTile + p * kLanes, acc[r][p]);
}

// o (rows, d) = o * rescale + p (rows, keys) @ V (keys rows at `values`), VECS lane-vectors of d at a time
template <int ROWS, int VECS, typename T>
inline void value_rows(const float* p, const float* rescale, const T* const* values, int64_t keys, float* o,
                       int64_t d, int64_t c) {
    vf acc[ROWS][VECS];
    for (int r = 0; r < ROWS; ++r)
        for (int j = 0; j < VECS; ++j) acc[r][j] = load_lanes(o + r * d + c + j * kLanes) * rescale[r];
    for (int64_t t = 0; t < keys; ++t) {
        vf v[VECS];
        for (int j = 0; j < VECS; ++j) v[j] = load_lanes(values[t] + c + j * kLanes);
        for (int r = 0; r < ROWS; ++r) {
            const float x = p[r * kKeyTile + t];
            for (int j = 0; j < VECS; ++j) acc[r][j] += x * v[j];
        }
    }
    for (int r = 0; r < ROWS; ++r)
        for (int j = 0; j < VECS; ++j) store_lanes(o + r * d + c + j * kLanes, acc[r][j]);
}

// exp(x) for x <= 0 (scores less their max): fast_exp's steps (cpu_common.h); AVX-512 skips the upper clamp, and
// rounds n = x / ln 2 and scales by 2^n in one instruction each
inline vf exp_nonpositive(vf x) {
#if defined(__AVX512F__)
    x = x < -87.33654f ? vf{} - 87.33654f : x;
    const __m512 n = _mm512_roundscale_ps(reinterpret_cast<__m512>(x * 1.44269504088896341f),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf nf = reinterpret_cast<vf>(n);
    const vf y = exp_reduced(x - nf * 0.693359375f + nf * 2.12194440e-4f);
    return reinterpret_cast<vf>(_mm512_scalef_ps(reinterpret_cast<__m512>(y), n));
#else
    return exp_lanes(x);
#endif
}

// a row's scores sr of a key tile -> its p, in place; its running max m, lane-wise sums l and the rescale of its
// sums so far. MASKED: keys from `seen` on are past the row (p = 0); either way a key it sees gets the same bits.
template <bool MASKED>
inline void softmax_row(float* sr, float* l, float* m, float* rescale, int64_t seen) {
    vf sv[kKeyPanels], top = vf{} - 3.0e38f;
    vi sees[kKeyPanels];                                // per lane: the row sees this key (all ones) or not
    for (int p = 0; p < kKeyPanels; ++p) {
        sv[p] = load_lanes(sr + p * kLanes);
        if (MASKED) {
            sees[p] = kLaneIndex + static_cast<float>(p * kLanes - seen) < 0.f;
            sv[p] = sees[p] ? sv[p] : vf{} - 3.0e38f;
        }
        top = top > sv[p] ? top : sv[p];
    }
    const float mx = std::max(*m, max_lanes(top));
    *rescale = mx == *m ? 1.f : exp_nonpositive(vf{} + (*m - mx))[0];     // exp(0) is 1: the same bits
    vf sum = load_lanes(l) * *rescale;
    for (int p = 0; p < kKeyPanels; ++p) {
        vf e = exp_nonpositive(sv[p] - mx);
        if (MASKED) e = sees[p] ? e : vf{};
        store_lanes(sr + p * kLanes, e);
        sum += e;
    }
    store_lanes(l, sum);
    *m = mx;
}

template <typename T>
struct PrefillTask {
    const T* q;             // (n, hq, d)
    const T* v_cache;
    const int64_t* table;
    const float* kt;        // (hkv, tiles, d, kKeyTile)
    T* out;                 // (n, hq, d)
    int64_t context, n, hq, hkv, d, block_size, tiles;
    float scale;
};

// the rows of kv head h in a paged cache (keys or values) for tokens k0 .. k0 + count - 1, null from token `keys`
// on (one division, then block by block)
template <typename T>
void cache_rows(const T* cache, const int64_t* table, int64_t block_size, int64_t hkv, int64_t d, int64_t h,
                int64_t k0, int64_t count, int64_t keys, const T** rows) {
    int64_t b = k0 / block_size, i = k0 % block_size;
    for (int64_t j = 0; j < count; ++j) {
        rows[j] = k0 + j < keys ? cache + ((table[b] * block_size + i) * hkv + h) * d : nullptr;
        if (++i == block_size) i = 0, ++b;
    }
}

template <typename T>
void value_rows_of(const PrefillTask<T>& task, int64_t h, int64_t k0, int64_t count, const T** rows) {
    cache_rows(task.v_cache, task.table, task.block_size, task.hkv, task.d, h, k0, count, k0 + count, rows);
}

// the work item (kv head h, query positions t0 .. t1 - 1); `work` holds its rows' state
template <typename T>
void prefill_item(const PrefillTask<T>& task, int64_t h, int64_t t0, int64_t t1, float* work) {
    const int64_t d = task.d, group = task.hq / task.hkv;
    const int64_t rows = (t1 - t0) * group, padded = (rows + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
    float* qs = work;                                   // (padded, d), scaled
    float* o = qs + padded * d;                         // (padded, d)
    float* s = o + padded * d;                          // (padded, kKeyTile): scores, then p
    float* l = s + padded * kKeyTile;                   // (padded, kLanes): each row's sums of p, lane by lane
    float* m = l + padded * kLanes;
    float* rescale = m + padded;
    int64_t* last = reinterpret_cast<int64_t*>(rescale + padded);    // each row's position (its last key)
    for (int64_t r = 0; r < padded; ++r) {
        const int64_t t = std::min(r / group, t1 - t0 - 1), g = r < rows ? r % group : 0;
        const T* src = task.q + ((t0 + t) * task.hq + h * group + g) * d;
        for (int64_t i = 0; i < d; ++i) {
            qs[r * d + i] = r < rows ? to_f32(src[i]) * task.scale : 0.f;
            o[r * d + i] = 0.f;
        }
        m[r] = -3.0e38f;
        for (int64_t j = 0; j < kLanes; ++j) l[r * kLanes + j] = 0.f;
        last[r] = task.context + t0 + t;
    }
    const int64_t keys = task.context + t1;             // keys the item's last position sees
    const T* rows_of[2][kKeyTile];                      // this tile's value rows, the next one's
    value_rows_of(task, h, 0, std::min(kKeyTile, keys), rows_of[0]);
    for (int64_t k0 = 0; k0 < keys; k0 += kKeyTile) {
        const T* const* values = rows_of[k0 / kKeyTile % 2];
        const int64_t tile_keys = std::min(kKeyTile, keys - k0);
        if (k0 + kKeyTile < keys) {
            // the next tile's values on their way to the cache while this one is worked on: their rows are
            // scattered over the cache's blocks, out of the hardware prefetcher's sight
            const T** next = rows_of[(k0 / kKeyTile + 1) % 2];
            const int64_t next_keys = std::min(kKeyTile, keys - k0 - kKeyTile);
            value_rows_of(task, h, k0 + kKeyTile, next_keys, next);
            for (int64_t j = 0; j < next_keys; ++j)
                for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(T)); b += 64)
                    __builtin_prefetch(reinterpret_cast<const char*>(next[j]) + b, 0, 2);
        }
        const float* tile = task.kt + ((h * task.tiles) + k0 / kKeyTile) * d * kKeyTile;
        for (int64_t r = 0; r < padded; r += kScoreRows) score_rows(qs + r * d, d, tile, s + r * kKeyTile);
        // only a tile that reaches past the item's first position masks: below it every row sees every key
        if (k0 + kKeyTile > task.context + t0)
            for (int64_t r = 0; r < padded; ++r)
                softmax_row<true>(s + r * kKeyTile, l + r * kLanes, m + r, rescale + r, last[r] + 1 - k0);
        else
            for (int64_t r = 0; r < padded; ++r)
                softmax_row<false>(s + r * kKeyTile, l + r * kLanes, m + r, rescale + r, kKeyTile);
        for (int64_t r = 0; r < padded; r += kValueRows) {
            // keys past the block's last row leave every row as it is: not read
            const int64_t used = std::min(tile_keys, std::max<int64_t>(last[r + kValueRows - 1] + 1 - k0, 0));
            const float* pr = s + r * kKeyTile;
            int64_t c = 0;
            for (; c + kValueVecs * kLanes <= d; c += kValueVecs * kLanes)
                value_rows<kValueRows, kValueVecs>(pr, rescale + r, values, used, o + r * d, d, c);
            for (; c < d; c += kLanes) value_rows<kValueRows, 1>(pr, rescale + r, values, used, o + r * d, d, c);
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r / group, g = r % group;
        T* dst = task.out + ((t0 + t) * task.hq + h * group + g) * d;
        float sum = 0.f;
        for (int64_t j = 0; j < kLanes; ++j) sum += l[r * kLanes + j];
        const float inv = 1.f / sum;
        for (int64_t i = 0; i < d; ++i) dst[i] = from_f32<T>(o[r * d + i] * inv);
    }
}

#if defined(__AVX512F__)
// 16 vectors, rows of a 16 x 16 block -> its columns: pairs of lanes, then of pairs, of quarters, of halves
inline void transpose_lanes(vf* v) {
    __m512 a[16], b[16];
    for (int r = 0; r < 16; r += 2) {
        a[r] = _mm512_unpacklo_ps(reinterpret_cast<__m512>(v[r]), reinterpret_cast<__m512>(v[r + 1]));
        a[r + 1] = _mm512_unpackhi_ps(reinterpret_cast<__m512>(v[r]), reinterpret_cast<__m512>(v[r + 1]));
    }
    for (int r = 0; r < 16; r += 4)
        for (int k = 0; k < 2; ++k) {
            b[r + 2 * k] = _mm512_shuffle_ps(a[r + k], a[r + k + 2], 0x44);
            b[r + 2 * k + 1] = _mm512_shuffle_ps(a[r + k], a[r + k + 2], 0xee);
        }
    for (int r = 0; r < 16; r += 8)
        for (int k = 0; k < 4; ++k) {
            a[r + k] = _mm512_shuffle_f32x4(b[r + k], b[r + k + 4], 0x88);
            a[r + k + 4] = _mm512_shuffle_f32x4(b[r + k], b[r + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; ++k) {
        v[k] = reinterpret_cast<vf>(_mm512_shuffle_f32x4(a[k], a[k + 8], 0x88));
        v[k + 8] = reinterpret_cast<vf>(_mm512_shuffle_f32x4(a[k], a[k + 8], 0xdd));
    }
}
#endif

// the keys of kv head h, tile j, transposed into kt (zero past the last key)
template <typename T>
void pack_key_tile(const T* k_cache, const int64_t* table, int64_t keys, int64_t hkv, int64_t d,
                   int64_t block_size, int64_t h, int64_t j, float* tile) {
    const T* rows[kKeyTile];                            // a key's row in the cache, null past the last key
    cache_rows(k_cache, table, block_size, hkv, d, h, j * kKeyTile, kKeyTile, keys, rows);
#if defined(__AVX512F__)
    // blocks of 16 keys x 16 dims through registers (d is a multiple of 16: cpu.py's prefill_heads_fit), not
    // element by element
    for (int64_t c0 = 0; c0 < kKeyTile; c0 += kLanes)
        for (int64_t i0 = 0; i0 < d; i0 += kLanes) {
            vf v[kLanes];
            for (int64_t c = 0; c < kLanes; ++c) v[c] = rows[c0 + c] ? load_lanes(rows[c0 + c] + i0) : vf{};
            transpose_lanes(v);
            for (int64_t i = 0; i < kLanes; ++i) store_lanes(tile + (i0 + i) * kKeyTile + c0, v[i]);
        }
#else
    for (int64_t c = 0; c < kKeyTile; ++c)
        for (int64_t i = 0; i < d; ++i) tile[i * kKeyTile + c] = rows[c] ? to_f32(rows[c][i]) : 0.f;
#endif
}

template <typename T>
void paged_prefill(const T* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t context,
                   int64_t n, T* out, int64_t hq, int64_t hkv, int64_t d, int64_t block_size, float scale) {
    const int64_t keys = context + n, tiles = (keys + kKeyTile - 1) / kKeyTile, group = hq / hkv;
    thread_local std::vector<float> kt_buffer;          // the calling thread's, reused across layers
    kt_buffer.resize(static_cast<size_t>(hkv * tiles * d * kKeyTile));
    float* kt = kt_buffer.data();
    // fewer positions where the chunk is short, so that every thread has two items to balance
    const int64_t per_head = (2 * omp_get_max_threads() + hkv - 1) / hkv;
    const int64_t positions = std::max<int64_t>(1, std::min(kItemRows / group, (n + per_head - 1) / per_head));
    const int64_t blocks = (n + positions - 1) / positions, items = hkv * blocks;
    const int64_t padded = (positions * group + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
    const PrefillTask<T> task{q, v_cache, table, kt, out, context, n, hq, hkv, d, block_size, tiles, scale};
#pragma omp parallel if (n * keys * hq * d >= kParallelWork)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < hkv * tiles; ++item)
            pack_key_tile(k_cache, table, keys, hkv, d, block_size, item / tiles, item % tiles,
                          kt + item * d * kKeyTile);
        std::vector<float> work(static_cast<size_t>(padded * (2 * d + kKeyTile + kLanes + 2) + 2 * padded));
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {     // the last positions (the most keys) first
            const int64_t b = blocks - 1 - item / hkv, h = item % hkv;
            prefill_item(task, h, b * positions, std::min(n, (b + 1) * positions), work.data());
        }
    }
}

}  // namespace

extern "C" {

// Prefill attention over a paged cache: a request's n query rows q (n, hq, d), at positions context ..
// context + n - 1, attend causally to its cached keys/values 0 .. context + n - 1 (this chunk's already
// written), found through `table` (its block ids); -> out (n, hq, d). Each row bit-equal however the
// prompt is cut into chunks (see prefill_item).
void mstar_paged_prefill(const void* q, const void* k_cache, const void* v_cache, const int64_t* table,
                         int64_t context, int64_t n, void* out, int64_t hq, int64_t hkv, int64_t d,
                         int64_t block_size, float scale, int bf16) {
    DISPATCH(paged_prefill((const float*)q, (const float*)k_cache, (const float*)v_cache, table, context, n,
                           (float*)out, hq, hkv, d, block_size, scale),
             paged_prefill((const bf16_t*)q, (const bf16_t*)k_cache, (const bf16_t*)v_cache, table, context, n,
                           (bf16_t*)out, hq, hkv, d, block_size, scale));
}

}  // extern "C"
