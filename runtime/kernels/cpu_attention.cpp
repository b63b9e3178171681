// Attention over the paged KV cache on CPU (runtime/kernels/cpu.py builds it with cpu.cpp into one library):
// decode rows, one query row per request, and prefill chunks, a request's rows at once. Both read the cache's
// blocks where they lie and keep scores, softmax and sums in fp32 under a running max (flash-style: no score
// matrix beyond a tile is ever held).
#include "cpu_common.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace mstar;

constexpr int64_t kScoreChunk = 256;         // keys scored per pass of the decode attention
constexpr int64_t kAheadTokens = 8;          // how far ahead the decode attention prefetches cache rows

// ---- 16-lane vectors (GCC's vector extension: one zmm register on AVX-512, two ymm on AVX2) ----

typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
typedef uint16_t vh __attribute__((vector_size(32), aligned(2)));
typedef uint32_t vu __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline vf load_lanes(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline vf load_lanes(const bf16_t* p) {
    const vu bits = __builtin_convertvector(*reinterpret_cast<const vh*>(p), vu) << 16;
    vf out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
}
inline void store_lanes(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
const vf kLaneIndex = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline float max_lanes(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(reinterpret_cast<__m512>(v));
#else
    float top = v[0];
    for (int j = 1; j < kLanes; ++j) top = std::max(top, v[j]);
    return top;
#endif
}

// fast_exp (cpu_common.h) on 16 lanes at once, the same steps
inline vf exp_lanes(vf x) {
    typedef int32_t vi __attribute__((vector_size(64)));
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


// one work item: request b's kv heads h0 .. h1-1, each token's keys (and values) of those heads read
// together from its block row, rows ahead prefetched. kD: the head dim fixed at compile time (64 and 128, so
// the loops over it unroll into whole vectors), or 0 for any other
template <typename T, int kD>
void paged_decode_item(const T* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t len, T* out,
                       int64_t hq, int64_t hkv, int64_t h0, int64_t h1, int64_t head_dim, int64_t block_size,
                       float scale, float* work) {
    const int64_t d = kD ? kD : head_dim;
    const int64_t group = hq / hkv, rows = (h1 - h0) * group;     // query heads of this item
    float* qs = work;                                              // (rows, d)
    float* acc = qs + rows * d;                                    // (rows, d)
    float* sc = acc + rows * d;                                    // (rows, kScoreChunk)
    float* m = sc + rows * kScoreChunk;
    float* l = m + rows;
    float kv[kMaxHeadDim];
    for (int64_t r = 0; r < rows; ++r) {
        const T* qh = q + (h0 * group + r) * d;
        for (int64_t i = 0; i < d; ++i) {
            qs[r * d + i] = to_f32(qh[i]) * scale;
            acc[r * d + i] = 0.f;
        }
        m[r] = -3.0e38f;
        l[r] = 0.f;
    }
    const int64_t row_stride = hkv * d;                               // one token of one block, all kv heads
    auto token = [&](const T* cache, int64_t t) {
        return cache + (table[t / block_size] * block_size + t % block_size) * row_stride + h0 * d;
    };
    // the cache is read from memory (a step's KV of every layer is far larger than the caches): each line of
    // the row kAheadTokens tokens on is fetched now, so several rows are in flight under the dot products
    const int64_t row_bytes = (h1 - h0) * d * static_cast<int64_t>(sizeof(T));
    auto fetch = [&](const T* cache, int64_t t) {
        if (t >= len) return;
        const char* p = reinterpret_cast<const char*>(token(cache, t));
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b);
    };
    for (int64_t t0 = 0; t0 < len; t0 += kScoreChunk) {
        const int64_t t1 = std::min(len, t0 + kScoreChunk);
        for (int64_t t = t0; t < t1; ++t) {
            const T* key = token(k_cache, t);
            fetch(k_cache, t + kAheadTokens);
            for (int64_t h = 0; h < h1 - h0; ++h) {
                for (int64_t i = 0; i < d; ++i) kv[i] = to_f32(key[h * d + i]);
                for (int64_t g = 0; g < group; ++g) {
                    const float* qr = qs + (h * group + g) * d;
                    float dot = 0.f;
                    for (int64_t i = 0; i < d; ++i) dot += qr[i] * kv[i];
                    sc[(h * group + g) * kScoreChunk + t - t0] = dot;
                }
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            float* s = sc + r * kScoreChunk;
            float mx = m[r];
            for (int64_t t = 0; t < t1 - t0; ++t) mx = std::max(mx, s[t]);
            const float rescale = fast_exp(m[r] - mx);
            float sum = 0.f;
            for (int64_t t = 0; t < t1 - t0; ++t) {
                s[t] = fast_exp(s[t] - mx);
                sum += s[t];
            }
            l[r] = l[r] * rescale + sum;
            for (int64_t i = 0; i < d; ++i) acc[r * d + i] *= rescale;
            m[r] = mx;
        }
        for (int64_t t = t0; t < t1; ++t) {
            const T* value = token(v_cache, t);
            fetch(v_cache, t + kAheadTokens);
            for (int64_t h = 0; h < h1 - h0; ++h) {
                for (int64_t i = 0; i < d; ++i) kv[i] = to_f32(value[h * d + i]);
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t r = h * group + g;
                    const float p = sc[r * kScoreChunk + t - t0];
                    for (int64_t i = 0; i < d; ++i) acc[r * d + i] += p * kv[i];
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        T* o = out + (h0 * group + r) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = from_f32<T>(acc[r * d + i] * inv);
    }
}

// ---- decode, one kv head at a time: for heads of 64 or 128 lanes and groups small enough that the group's
// running sums stay in registers (kG x kD / 16 vectors: 16 at most). Per token: the head's key (or value) read
// once into registers, each query row's dot product (or p-weighted sum) straight from them — no copy of the
// row, no sums through memory (the general item above keeps both in buffers).

inline float sum_lanes(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#else
    float s = 0.f;
    for (int j = 0; j < kLanes; ++j) s += v[j];
    return s;
#endif
}

// keys t0 .. t0 + n - 1 of kv head h for its kG query rows; `state` carries each row's sums (kG x kD), max and
// sum of p (kG each) from one chunk of keys to the next, `qs` the rows' scaled queries (kG x kD)
template <typename T, int kD, int kG>
void decode_head(const float* qs, const T* k_cache, const T* v_cache, const int64_t* table, int64_t t0, int64_t n,
                 int64_t len, int64_t hkv, int64_t h, int64_t block_size, int64_t fetch_bytes, float* state,
                 float* sc) {
    constexpr int kV = kD / kLanes;
    vf qv[kG][kV], acc[kG][kV];
    float* m = state + kG * kD;
    float* l = m + kG;
    for (int g = 0; g < kG; ++g)
        for (int j = 0; j < kV; ++j) qv[g][j] = load_lanes(qs + g * kD + j * kLanes);
    const int64_t row_stride = hkv * kD;
    auto token = [&](const T* cache, int64_t t) {
        return cache + (table[t / block_size] * block_size + t % block_size) * row_stride + h * kD;
    };
    auto fetch = [&](const T* cache, int64_t t) {     // fetch_bytes: the item's heads from this one on (0: none)
        if (t >= len) return;
        const char* p = reinterpret_cast<const char*>(token(cache, t));
        for (int64_t b = 0; b < fetch_bytes; b += 64) __builtin_prefetch(p + b);
    };
    for (int64_t t = 0; t < n; ++t) {
        const T* key = token(k_cache, t0 + t);
        fetch(k_cache, t0 + t + kAheadTokens);
        vf kv[kV];
        for (int j = 0; j < kV; ++j) kv[j] = load_lanes(key + j * kLanes);
        for (int g = 0; g < kG; ++g) {
            vf s = qv[g][0] * kv[0];
            for (int j = 1; j < kV; ++j) s += qv[g][j] * kv[j];
            sc[g * kScoreChunk + t] = sum_lanes(s);
        }
    }
    for (int g = 0; g < kG; ++g) {
        float* s = sc + g * kScoreChunk;
        float mx = m[g];
        for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
        const float rescale = fast_exp(m[g] - mx);
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
            s[t] = fast_exp(s[t] - mx);
            sum += s[t];
        }
        l[g] = l[g] * rescale + sum;
        m[g] = mx;
        for (int j = 0; j < kV; ++j) acc[g][j] = load_lanes(state + g * kD + j * kLanes) * rescale;
    }
    for (int64_t t = 0; t < n; ++t) {
        const T* value = token(v_cache, t0 + t);
        fetch(v_cache, t0 + t + kAheadTokens);
        vf v[kV];
        for (int j = 0; j < kV; ++j) v[j] = load_lanes(value + j * kLanes);
        for (int g = 0; g < kG; ++g) {
            const float p = sc[g * kScoreChunk + t];
            for (int j = 0; j < kV; ++j) acc[g][j] += p * v[j];
        }
    }
    for (int g = 0; g < kG; ++g)
        for (int j = 0; j < kV; ++j) store_lanes(state + g * kD + j * kLanes, acc[g][j]);
}

// the register path's instance for (head dim, group), or null where it has none
template <typename T>
using DecodeHead = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, float*, float*);

template <typename T>
DecodeHead<T> decode_head_for(int64_t d, int64_t group) {
    if (d == 64) {
        switch (group) {
            case 1: return decode_head<T, 64, 1>;
            case 2: return decode_head<T, 64, 2>;
            case 3: return decode_head<T, 64, 3>;
            case 4: return decode_head<T, 64, 4>;
            default: return nullptr;
        }
    }
    if (d == 128) {
        switch (group) {
            case 1: return decode_head<T, 128, 1>;
            case 2: return decode_head<T, 128, 2>;
            default: return nullptr;
        }
    }
    return nullptr;
}

// request b's kv heads h0 .. h1 - 1 through `head` (chunks of keys outer, heads inner: a chunk's rows are read
// from memory by the first head, the others find them in cache)
template <typename T>
void decode_heads(DecodeHead<T> head, const T* q, const T* k_cache, const T* v_cache, const int64_t* table,
                  int64_t len, T* out, int64_t hq, int64_t hkv, int64_t h0, int64_t h1, int64_t d, int64_t block_size,
                  float scale, float* work) {
    const int64_t group = hq / hkv, rows = (h1 - h0) * group;
    float* qs = work;                                        // (rows, d)
    float* state = qs + rows * d;                            // per head: (group, d) sums, group maxima, group sums
    float* sc = state + (h1 - h0) * group * (d + 2);         // (group, kScoreChunk)
    const int64_t per_head = group * (d + 2);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < d; ++i) qs[r * d + i] = to_f32(q[(h0 * group + r) * d + i]) * scale;
        const int64_t h = r / group, g = r % group;
        float* st = state + h * per_head;
        for (int64_t i = 0; i < d; ++i) st[g * d + i] = 0.f;
        st[group * d + g] = -3.0e38f;
        st[group * d + group + g] = 0.f;
    }
    const int64_t fetch_bytes = (h1 - h0) * d * static_cast<int64_t>(sizeof(T));
    for (int64_t t0 = 0; t0 < len; t0 += kScoreChunk)
        for (int64_t h = h0; h < h1; ++h)
            head(qs + (h - h0) * group * d, k_cache, v_cache, table, t0, std::min(len - t0, kScoreChunk), len, hkv, h,
                 block_size, h == h0 ? fetch_bytes : 0, state + (h - h0) * per_head, sc);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = r / group, g = r % group;
        const float* st = state + h * per_head;
        const float sum = st[group * d + group + g], inv = sum > 0.f ? 1.f / sum : 0.f;
        T* o = out + (h0 * group + r) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = from_f32<T>(st[g * d + i] * inv);
    }
}

// a request per work item when there are enough of them for the threads, else a (request, kv head) pair
template <typename T>
void paged_decode(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int64_t* tables,
                  int64_t width, const int64_t* seq_lens, T* out, int64_t batch, int64_t hq, int64_t hkv, int64_t d,
                  int64_t block_size, float scale) {
    int64_t work = 0;
    for (int64_t b = 0; b < batch; ++b) work += seq_lens[b] * hkv * d * 2;
    const int64_t split = batch >= 2 * omp_get_max_threads() ? 1 : hkv;     // kv-head ranges per request
    const int64_t per = hkv / split;
    const DecodeHead<T> head = decode_head_for<T>(d, hq / hkv);
#pragma omp parallel if (work >= kParallelWork)
    {
        std::vector<float> scratch(static_cast<size_t>(hq * (2 * d + kScoreChunk + 2)));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < batch * split; ++item) {
            const int64_t b = item / split, h0 = (item % split) * per;
            if (head) {
                decode_heads(head, q + b * q_stride, k_cache, v_cache, tables + b * width, seq_lens[b], out + b * hq * d,
                             hq, hkv, h0, h0 + per, d, block_size, scale, scratch.data());
                continue;
            }
            auto item_fn = d == 64 ? paged_decode_item<T, 64> : d == 128 ? paged_decode_item<T, 128>
                                                                           : paged_decode_item<T, 0>;
            item_fn(q + b * q_stride, k_cache, v_cache, tables + b * width, seq_lens[b], out + b * hq * d,
                    hq, hkv, h0, h0 + per, d, block_size, scale, scratch.data());
        }
    }
}


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
constexpr int kScoreRows = 12, kKeyPanels = 2, kValueRows = 6, kValueVecs = 4;
#else                        // AVX2: 16 registers of 8 lanes (a 16-lane vector takes two)
constexpr int kScoreRows = 6, kKeyPanels = 1, kValueRows = 3, kValueVecs = 2;
#endif
constexpr int64_t kKeyTile = kKeyPanels * kLanes;
constexpr int64_t kItemRows = 48;            // query rows (positions x group) a work item aims at
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

template <typename T>
struct PrefillTask {
    const T* q;             // (n, hq, d)
    const T* v_cache;
    const int64_t* table;
    const float* kt;        // (hkv, tiles, d, kKeyTile)
    T* out;                 // (n, hq, d)
    int64_t context, n, hq, hkv, d, block_size, tiles, positions;    // positions: per work item
    float scale;
};

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
    const T* values[kKeyTile];
    for (int64_t k0 = 0; k0 < keys; k0 += kKeyTile) {
        const float* tile = task.kt + ((h * task.tiles) + k0 / kKeyTile) * d * kKeyTile;
        for (int64_t r = 0; r < padded; r += kScoreRows) score_rows(qs + r * d, d, tile, s + r * kKeyTile);
        for (int64_t r = 0; r < padded; ++r) {         // mask, running max, p, the lane-wise running sums
            float* sr = s + r * kKeyTile;
            const float seen = static_cast<float>(std::min<int64_t>(std::max<int64_t>(last[r] + 1 - k0, 0),
                                                                    kKeyTile));
            vf sv[kKeyPanels], top = vf{} - 3.0e38f;
            for (int p = 0; p < kKeyPanels; ++p) {
                sv[p] = load_lanes(sr + p * kLanes);
                sv[p] = kLaneIndex + static_cast<float>(p * kLanes) < seen ? sv[p] : vf{} - 3.0e38f;
                top = top > sv[p] ? top : sv[p];
            }
            const float mx = std::max(m[r], max_lanes(top));
            rescale[r] = fast_exp(m[r] - mx);
            vf sum = load_lanes(l + r * kLanes) * rescale[r];
            for (int p = 0; p < kKeyPanels; ++p) {
                const vf e = kLaneIndex + static_cast<float>(p * kLanes) < seen ? exp_lanes(sv[p] - mx) : vf{};
                store_lanes(sr + p * kLanes, e);
                sum += e;
            }
            store_lanes(l + r * kLanes, sum);
            m[r] = mx;
        }
        const int64_t tile_keys = std::min(kKeyTile, keys - k0);
        for (int64_t j = 0; j < tile_keys; ++j) {
            const int64_t t = k0 + j;
            values[j] = task.v_cache + ((task.table[t / task.block_size] * task.block_size + t % task.block_size) *
                                        task.hkv + h) * d;
        }
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

// the keys of kv head h, tile j, transposed into kt (zero past the last key)
template <typename T>
void pack_key_tile(const T* k_cache, const int64_t* table, int64_t keys, int64_t hkv, int64_t d,
                   int64_t block_size, int64_t h, int64_t j, float* tile) {
    for (int64_t c = 0; c < kKeyTile; ++c) {
        const int64_t t = j * kKeyTile + c;
        if (t >= keys) {
            for (int64_t i = 0; i < d; ++i) tile[i * kKeyTile + c] = 0.f;
            continue;
        }
        const T* key = k_cache + ((table[t / block_size] * block_size + t % block_size) * hkv + h) * d;
        for (int64_t i = 0; i < d; ++i) tile[i * kKeyTile + c] = to_f32(key[i]);
    }
}

template <typename T>
void paged_prefill(const T* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t context,
                   int64_t n, T* out, int64_t hq, int64_t hkv, int64_t d, int64_t block_size, float scale) {
    const int64_t keys = context + n, tiles = (keys + kKeyTile - 1) / kKeyTile, group = hq / hkv;
    thread_local std::vector<float> kt_buffer;          // the calling thread's, reused across layers
    kt_buffer.resize(static_cast<size_t>(hkv * tiles * d * kKeyTile));
    float* kt = kt_buffer.data();
    const int64_t positions = std::max<int64_t>(1, kItemRows / group);
    const int64_t blocks = (n + positions - 1) / positions, items = hkv * blocks;
    const int64_t padded = (positions * group + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
    const PrefillTask<T> task{q, v_cache, table, kt, out, context, n, hq, hkv, d, block_size, tiles, positions, scale};
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

// Decode attention over a paged cache, read where it lies: request b's single query row q + b * q_stride
// (hq heads of d, contiguous) attends to its seq_lens[b] cached keys/values, found through its row of `tables`
// (width block ids; blocks of block_size tokens, each (block_size, hkv, d)). Scores and softmax in
// fp32; keys are scored kScoreChunk at a time under a running max.
void mstar_paged_decode(const void* q, int64_t q_stride, const void* k_cache, const void* v_cache,
                        const int64_t* tables, int64_t width, const int64_t* seq_lens, void* out, int64_t batch,
                        int64_t hq, int64_t hkv, int64_t d, int64_t block_size, float scale, int bf16) {
    DISPATCH(paged_decode((const float*)q, q_stride, (const float*)k_cache, (const float*)v_cache, tables, width,
                          seq_lens, (float*)out, batch, hq, hkv, d, block_size, scale),
             paged_decode((const bf16_t*)q, q_stride, (const bf16_t*)k_cache, (const bf16_t*)v_cache, tables, width,
                          seq_lens, (bf16_t*)out, batch, hq, hkv, d, block_size, scale));
}

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
