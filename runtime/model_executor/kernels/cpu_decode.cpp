// Decode attention over the paged KV cache on CPU, one query row per request (runtime/model_executor/kernels/cpu.py builds
// it with cpu.cpp and cpu_prefill.cpp into one library): each request's blocks read where they lie, scores,
// softmax and sums in fp32 under a running max.
#include "cpu_lanes.h"

namespace {

using namespace mstar;

constexpr int64_t kScoreChunk = 256;         // keys scored per pass of the decode attention
constexpr int64_t kAheadTokens = 8;          // how far ahead the decode attention prefetches cache rows

// a chunk's n scores of one query row turned into exp(score - max) in place, under the row's running max `m`
// and sum of p `l` (both updated); returns the factor the row's earlier sums are rescaled by
inline float chunk_softmax(float* s, int64_t n, float& m, float& l) {
    float mx = m;
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
    const float rescale = fast_exp(m - mx);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
        s[t] = fast_exp(s[t] - mx);
        sum += s[t];
    }
    l = l * rescale + sum;
    m = mx;
    return rescale;
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
            const float rescale = chunk_softmax(sc + r * kScoreChunk, t1 - t0, m[r], l[r]);
            for (int64_t i = 0; i < d; ++i) acc[r * d + i] *= rescale;
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

// where a decode head finds token t's row of kv head h in a cache (`rows`: each token's offset), and the rows it
// prefetches ahead: `fetch_bytes` of the item's heads from this one on (0: none), for tokens before `ahead`
template <typename T, int kD>
struct HeadRows {
    const int64_t* rows;
    int64_t ahead, h, fetch_bytes;
    const T* at(const T* cache, int64_t t) const { return cache + rows[t] + h * kD; }
    void fetch(const T* cache, int64_t t) const {
        if (t >= ahead) return;
        const char* p = reinterpret_cast<const char*>(at(cache, t));
        for (int64_t b = 0; b < fetch_bytes; b += 64) __builtin_prefetch(p + b);
    }
};

#if !defined(__AVX512F__)
// 16 registers of 8 lanes (AVX2): a group's sums (kG x kD / 8 vectors) do not fit beside the queries, so per
// token the key's vectors meet each query row's (read from the item's buffer) in two sums, and then each row's
// p-weighted sums stay in registers, 64 lanes at a time, while it runs over the chunk's values.
template <typename T, int kD, int kG>
void decode_head(const float* qs, const T* k_cache, const T* v_cache, const int64_t* rows, int64_t n, int64_t ahead,
                 int64_t h, int64_t fetch_bytes, float* state, float* sc) {
    constexpr int kV = kD / kLanes;
    float* m = state + kG * kD;
    float* l = m + kG;
    const HeadRows<T, kD> head{rows, ahead, h, fetch_bytes};
    for (int64_t t = 0; t < n; ++t) {
        const T* key = head.at(k_cache, t);
        head.fetch(k_cache, t + kAheadTokens);
        for (int g = 0; g < kG; ++g) {
            const float* qg = qs + g * kD;
            vf s0 = load_lanes(qg) * load_lanes(key), s1 = load_lanes(qg + kLanes) * load_lanes(key + kLanes);
            for (int j = 2; j < kV; j += 2) {
                s0 += load_lanes(qg + j * kLanes) * load_lanes(key + j * kLanes);
                s1 += load_lanes(qg + (j + 1) * kLanes) * load_lanes(key + (j + 1) * kLanes);
            }
            sc[g * kScoreChunk + t] = sum_lanes(s0 + s1);
        }
    }
    for (int g = 0; g < kG; ++g) {
        const float rescale = chunk_softmax(sc + g * kScoreChunk, n, m[g], l[g]);
        const float* p = sc + g * kScoreChunk;
        for (int half = 0; half < kV; half += 8) {       // 8 vectors (64 lanes) of sums in registers at a time
            vf acc[8];
            for (int j = 0; j < 8; ++j) acc[j] = load_lanes(state + g * kD + (half + j) * kLanes) * rescale;
            for (int64_t t = 0; t < n; ++t) {
                const T* value = head.at(v_cache, t) + half * kLanes;
                if (g == 0 && half == 0) head.fetch(v_cache, t + kAheadTokens);
                for (int j = 0; j < 8; ++j) acc[j] += p[t] * load_lanes(value + j * kLanes);
            }
            for (int j = 0; j < 8; ++j) store_lanes(state + g * kD + (half + j) * kLanes, acc[j]);
        }
    }
}
#else
// keys t0 .. t0 + n - 1 of kv head h for its kG query rows; `state` carries each row's sums (kG x kD), max and
// sum of p (kG each) from one chunk of keys to the next, `qs` the rows' scaled queries (kG x kD)
template <typename T, int kD, int kG>
void decode_head(const float* qs, const T* k_cache, const T* v_cache, const int64_t* rows, int64_t n, int64_t ahead,
                 int64_t h, int64_t fetch_bytes, float* state, float* sc) {
    constexpr int kV = kD / kLanes;
    vf qv[kG][kV], acc[kG][kV];
    float* m = state + kG * kD;
    float* l = m + kG;
    for (int g = 0; g < kG; ++g)
        for (int j = 0; j < kV; ++j) qv[g][j] = load_lanes(qs + g * kD + j * kLanes);
    const HeadRows<T, kD> head{rows, ahead, h, fetch_bytes};
    for (int64_t t = 0; t < n; ++t) {
        const T* key = head.at(k_cache, t);
        head.fetch(k_cache, t + kAheadTokens);
        vf kv[kV];
        for (int j = 0; j < kV; ++j) kv[j] = load_lanes(key + j * kLanes);
        for (int g = 0; g < kG; ++g) {
            vf s = qv[g][0] * kv[0];
            for (int j = 1; j < kV; ++j) s += qv[g][j] * kv[j];
            sc[g * kScoreChunk + t] = sum_lanes(s);
        }
    }
    for (int g = 0; g < kG; ++g) {
        const float rescale = chunk_softmax(sc + g * kScoreChunk, n, m[g], l[g]);
        for (int j = 0; j < kV; ++j) acc[g][j] = load_lanes(state + g * kD + j * kLanes) * rescale;
    }
    for (int64_t t = 0; t < n; ++t) {
        const T* value = head.at(v_cache, t);
        head.fetch(v_cache, t + kAheadTokens);
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
#endif

// the register path's instance for (head dim, group), or null where it has none
template <typename T>
using DecodeHead = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                            float*, float*);

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
    // (kScoreChunk + kAheadTokens): where each token of a chunk (and the ones prefetched after it) starts in
    // the caches, found once per chunk for every head, keys and values (no division per token and head)
    int64_t* rows_at = reinterpret_cast<int64_t*>(sc + group * kScoreChunk);
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
    for (int64_t t0 = 0; t0 < len; t0 += kScoreChunk) {
        const int64_t n = std::min(len - t0, kScoreChunk), ahead = std::min(len - t0, kScoreChunk + kAheadTokens);
        int64_t block = t0 / block_size, in_block = t0 % block_size;
        for (int64_t t = 0; t < ahead; ++t) {
            rows_at[t] = (table[block] * block_size + in_block) * hkv * d;
            if (++in_block == block_size) in_block = 0, ++block;
        }
        for (int64_t h = h0; h < h1; ++h)
            head(qs + (h - h0) * group * d, k_cache, v_cache, rows_at, n, ahead, h, h == h0 ? fetch_bytes : 0,
                 state + (h - h0) * per_head, sc);
    }
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
        std::vector<float> scratch(static_cast<size_t>(hq * (2 * d + kScoreChunk + 2) +
                                                       2 * (kScoreChunk + kAheadTokens)));  // + decode_heads' rows_at
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

}  // extern "C"
