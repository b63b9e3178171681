// A decoder's whole layer stack in one call (runtime/model_executor/layers/cpu_stack.py): the same kernels, with the same
// arguments and in the same order, as the per-layer Python path (DecoderLM._forward_fused with the `cpu`
// attention backend) calls them one by one, so the results are bit-equal; what goes is the Python between
// them (module calls, views, allocations, ~10 foreign calls a layer: a large share of a small batch's decode step).
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

extern "C" {
void mstar_rms_norm(const void* x, int64_t x_stride, const void* weight, void* out, int64_t out_stride, int64_t rows,
                    int64_t n, float eps, int bf16);
void mstar_add_rms_norm(void* residual, const void* delta, const void* weight, void* out, int64_t rows, int64_t n,
                        float eps, int bf16);
void mstar_silu_mul(const void* x, void* out, int64_t rows, int64_t n, int bf16);
void mstar_rope_cache(void* q, int64_t q_stride, int64_t hq, void* k, int64_t k_stride, int64_t hkv, const void* v,
                      int64_t v_stride, const void* cos, const void* sin, int64_t d, const int64_t* slots,
                      void* k_cache, void* v_cache, int64_t rows, int bf16);
void mstar_gemm(const void* a, int64_t lda, const void* packed, const void* bias, void* c, int64_t ldc, int64_t m,
                int64_t n, int64_t k, int bf16);
void mstar_paged_decode(const void* q, int64_t q_stride, const void* k_cache, const void* v_cache,
                        const int64_t* tables, int64_t width, const int64_t* seq_lens, void* out, int64_t batch,
                        int64_t hq, int64_t hkv, int64_t d, int64_t block_size, float scale, int bf16);
void mstar_paged_prefill(const void* q, const void* k_cache, const void* v_cache, const int64_t* table,
                         int64_t context, int64_t n, void* out, int64_t hq, int64_t hkv, int64_t d,
                         int64_t block_size, float scale, int bf16);
}

namespace {

// one layer's tensors, as addresses (cpu_stack.py's LAYER_FIELDS, in this order; 0: no bias)
enum Field { kQkv, kQkvBias, kO, kOBias, kPostNorm, kGateUp, kGateUpBias, kDown, kDownBias, kNextNorm, kKCache,
             kVCache, kFields };

// the batch's attention rows (the `cpu` backend's plan): decode rows by index, prefill chunks by row range
struct Rows {
    int64_t decode, width;             // decode rows and their block tables' width
    const int64_t *decode_rows, *tables, *lengths;
    int64_t chunks;                    // prefill chunks: first row, rows, cached tokens before, block ids
    const int64_t *starts, *sizes, *contexts, *blocks;
};

inline const void* at(const int64_t* layer, Field f) { return reinterpret_cast<const void*>(layer[f]); }

}  // namespace

extern "C" {

// residual (n, h) holds the embedded tokens and is updated in place, as the Python path does; out (n, h) gets the
// final-normed hidden states. first_norm: the first layer's input norm; each layer's kNextNorm is the next layer's
// input norm (the model's final norm for the last). cos, sin (n, d); slots (n,).
void mstar_decoder_stack(const int64_t* layers, int64_t num_layers, const void* first_norm, void* residual,
                         void* out, int64_t n, int64_t h, int64_t hq, int64_t hkv, int64_t d, int64_t inter,
                         int64_t block_size, float eps, float scale, const void* cos, const void* sin,
                         const int64_t* slots, const int64_t* rows_info, const int64_t* rows_ptrs, int bf16) {
    const Rows rows{rows_info[0], rows_info[1], reinterpret_cast<const int64_t*>(rows_ptrs[0]),
                    reinterpret_cast<const int64_t*>(rows_ptrs[1]), reinterpret_cast<const int64_t*>(rows_ptrs[2]),
                    rows_info[2], reinterpret_cast<const int64_t*>(rows_ptrs[3]),
                    reinterpret_cast<const int64_t*>(rows_ptrs[4]), reinterpret_cast<const int64_t*>(rows_ptrs[5]),
                    reinterpret_cast<const int64_t*>(rows_ptrs[6])};
    const int64_t size = bf16 ? 2 : 4, qkv_n = (hq + 2 * hkv) * d, hd = hq * d;
    const bool decode_only = rows.decode == n;
    // the Python path's tensors, reused across layers: x (n, h), qkv (n, qkv_n), attention out (n, hq, d),
    // a projection's delta (n, h), gate_up (n, 2 inter), act (n, inter), q rows gathered for a kernel
    thread_local std::vector<char> buffer;
    const int64_t gather = rows.decode * hd * 2;          // decode rows' q in, their out back
    int64_t chunk_rows = 0;
    for (int64_t c = 0; c < rows.chunks; ++c) chunk_rows = std::max(chunk_rows, rows.sizes[c]);
    const int64_t elems = n * h + n * qkv_n + n * hd + n * h + n * 2 * inter + n * inter +
                          std::max(gather, chunk_rows * hd);
    buffer.resize(static_cast<size_t>(elems * size));
    char* x = buffer.data();
    char* qkv = x + n * h * size;
    char* attn = qkv + n * qkv_n * size;
    char* delta = attn + n * hd * size;
    char* gate_up = delta + n * h * size;
    char* act = gate_up + n * 2 * inter * size;
    char* gathered = act + n * inter * size;
    mstar_rms_norm(residual, h, first_norm, x, h, n, h, eps, bf16);
    for (int64_t l = 0; l < num_layers; ++l) {
        const int64_t* w = layers + l * kFields;
        mstar_gemm(x, h, at(w, kQkv), at(w, kQkvBias), qkv, qkv_n, n, qkv_n, h, bf16);
        char* q = qkv;
        char* k = qkv + hd * size;
        char* v = k + hkv * d * size;
        void* k_cache = const_cast<void*>(at(w, kKCache));
        void* v_cache = const_cast<void*>(at(w, kVCache));
        mstar_rope_cache(q, qkv_n, hq, k, qkv_n, hkv, v, qkv_n, cos, sin, d, slots, k_cache, v_cache, n, bf16);
        if (decode_only) {
            mstar_paged_decode(q, qkv_n, k_cache, v_cache, rows.tables, rows.width, rows.lengths, attn, n, hq, hkv,
                               d, block_size, scale, bf16);
        } else {
            if (rows.decode > 0) {       // q[decode_rows] -> the kernel -> out[decode_rows]
                char* q_rows = gathered;
                char* o_rows = gathered + rows.decode * hd * size;
                for (int64_t i = 0; i < rows.decode; ++i)
                    std::memcpy(q_rows + i * hd * size, q + rows.decode_rows[i] * qkv_n * size, hd * size);
                mstar_paged_decode(q_rows, hd, k_cache, v_cache, rows.tables, rows.width, rows.lengths, o_rows,
                                   rows.decode, hq, hkv, d, block_size, scale, bf16);
                for (int64_t i = 0; i < rows.decode; ++i)
                    std::memcpy(attn + rows.decode_rows[i] * hd * size, o_rows + i * hd * size, hd * size);
            }
            for (int64_t c = 0; c < rows.chunks; ++c) {   // q[rows] made contiguous, as paged_prefill does
                const int64_t start = rows.starts[c], count = rows.sizes[c];
                for (int64_t i = 0; i < count; ++i)
                    std::memcpy(gathered + i * hd * size, q + (start + i) * qkv_n * size, hd * size);
                mstar_paged_prefill(gathered, k_cache, v_cache, reinterpret_cast<const int64_t*>(rows.blocks[c]),
                                    rows.contexts[c], count, attn + start * hd * size, hq, hkv, d, block_size,
                                    scale, bf16);
            }
        }
        mstar_gemm(attn, hd, at(w, kO), at(w, kOBias), delta, h, n, h, hd, bf16);
        mstar_add_rms_norm(residual, delta, at(w, kPostNorm), x, n, h, eps, bf16);
        mstar_gemm(x, h, at(w, kGateUp), at(w, kGateUpBias), gate_up, 2 * inter, n, 2 * inter, h, bf16);
        mstar_silu_mul(gate_up, act, n, inter, bf16);
        mstar_gemm(act, inter, at(w, kDown), at(w, kDownBias), delta, h, n, h, inter, bf16);
        mstar_add_rms_norm(residual, delta, at(w, kNextNorm), l + 1 < num_layers ? x : out, n, h, eps, bf16);
    }
}

}  // extern "C"
