#pragma once
// A paged key/value cache for the inference engine: memory is a pool of fixed-size blocks shared
// by all sequences, handed out from a free list as sequences grow and returned when they close,
// so a sequence holds ceil(length / block) blocks, not a row of the longest length.
//
// Layout, per layer l: keys(l) and values(l) are pools of shape (N, Bk, Hkv, D) (N blocks of Bk
// positions): f32 in host memory on the CPU, bf16 in device memory on CUDA (one allocation,
// ModelArena). Sequence s's position j lives in block table(s)[j / Bk] at offset j % Bk, the
// pool's row slot(s, j) = table(s)[j / Bk] Bk + j % Bk. Bytes: 2 L N Bk Hkv D dtype_size,
// allocated once. The bookkeeping (free list, tables, lengths) is host-side on both backends; on
// CUDA the engine uploads a step's tables and slots, and the ops of ops/attention.h
// (attention_decode_paged, kv_rows_scatter, kv_rows_gather) read and write the pools.
//
// paged_attention_decode reads keys through the tables: for row b of a decode step (its new key
// and value already written at position lengths[b] - 1) and query head h (key/value head
// g = h / (H / Hkv)), over the visible keys j (j <= p = lengths[b] - 1 and p - window < j when
// window > 0):
//   s[j] = scale dot(q[b, h, :], K(j, g, :)),  out[b, h, :] = sum_j softmax(s)[j] V(j, g, :),
//   lse[b, h] = log sum_j exp(s[j])
// which is ops/attention.h's attention_decode over a contiguous cache (the same definition, its
// own summation order).

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "infer/kv_cache.h"
#include "model/model.h"
#include "ops/context.h"

namespace lathe {

struct PagedKvShape {
    int64_t layers = 0;      // L
    int64_t blocks = 0;      // N, the pool
    int64_t block_size = 0;  // Bk positions per block
    int64_t kv_heads = 0;    // Hkv
    int64_t head_dim = 0;    // D
};

class PagedKvCache {
public:
    PagedKvCache() = default;
    // Pools where `ctx` computes (f32 host vectors on the CPU, a bf16 device arena on CUDA),
    // zeroed. Errors: a non-positive dimension, a pool of more than 2^31 positions (slots are
    // i32), allocation failure.
    static Result<PagedKvCache> create(const PagedKvShape& shape, const Context& ctx = Context{});

    const PagedKvShape& shape() const { return shape_; }
    bool on_device() const { return device_; }
    size_t bytes() const {
        return device_ ? arena_.layout().total_bytes()
                       : 2 * keys_.size() * keys_[0].size() * sizeof(float);
    }
    int64_t blocks_for(int64_t length) const {
        return (length + shape_.block_size - 1) / shape_.block_size;
    }
    int64_t free_blocks() const { return int64_t(free_.size()); }

    // A new sequence; the ids of closed sequences are handed out again (the per-sequence tables
    // stay as long as the most sequences open at once).
    SeqId open();
    // Returns the sequence's blocks to the free list (an open handle, else checked).
    void close(SeqId seq);
    bool is_open(SeqId seq) const;
    int64_t open_sequences() const { return open_; }
    int64_t length(SeqId seq) const;
    void set_length(SeqId seq, int64_t length);  // within the blocks it holds (checked)
    // Makes `seq` hold blocks for `length` positions. Error (failed precondition) when the free
    // list is short; nothing is taken then.
    Status reserve(SeqId seq, int64_t length);
    const std::vector<int32_t>& table(SeqId seq) const;
    // The pool row of `seq`'s position `pos` (< the blocks it holds, checked).
    int32_t slot(SeqId seq, int64_t pos) const;
    // The (N, Bk, Hkv, D) pools of a layer, on either backend.
    TensorView keys(int layer) const;
    TensorView values(int layer) const;

    // Host pools only (the CPU engine):
    // The (Hkv, D) key / value of `seq` at position `pos` (< the blocks it holds).
    float* key(int layer, SeqId seq, int64_t pos);
    float* value(int layer, SeqId seq, int64_t pos);
    // Copies positions [0, length) of `seq` into contiguous (length, Hkv, D) buffers.
    void gather(int layer, SeqId seq, int64_t length, float* k, float* v) const;
    const std::vector<float>& keys_pool(int layer) const { return keys_[size_t(layer)]; }
    const std::vector<float>& values_pool(int layer) const { return values_[size_t(layer)]; }

private:
    float* at(std::vector<float>& pool, SeqId seq, int64_t pos);

    PagedKvShape shape_;
    bool device_ = false;                            // pools in arena_ (CUDA), else keys_/values_
    ModelArena arena_;                               // CUDA: keys, values of layer l at 2l, 2l+1
    std::vector<std::vector<float>> keys_, values_;  // CPU: per layer, (N, Bk, Hkv, D)
    std::vector<int32_t> free_;                      // free block ids (a stack)
    std::vector<std::vector<int32_t>> tables_;       // sequence -> its blocks
    std::vector<int64_t> lengths_;                   // sequence -> filled positions
    std::vector<char> open_flag_;
    std::vector<SeqId> free_ids_;  // closed sequence ids (a stack)
    int64_t open_ = 0;
};

// Decode attention over the paged cache (the definition above). q, out (n, 1, H, D) f32, lse
// (n, H, 1) f32; rows[b] the sequence of row b, lengths[b] its length including the new token.
void paged_attention_decode(TensorView out, TensorView lse, ConstTensorView q,
                            const PagedKvCache& cache, int layer, std::span<const SeqId> rows,
                            std::span<const int32_t> lengths, int64_t window, float scale);

}  // namespace lathe
