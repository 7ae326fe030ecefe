#pragma once
// A paged key/value cache for the CPU engine: memory is a pool of fixed-size blocks shared by all
// sequences, handed out from a free list as sequences grow and returned when they close, so a
// sequence holds ceil(length / block) blocks, not a row of the longest length.
//
// Layout, per layer l: keys(l) and values(l) are pools of shape (N, Bk, Hkv, D) f32 in host
// memory (N blocks of Bk positions). Sequence s's position j lives in block table(s)[j / Bk] at
// offset j % Bk. Bytes: 2 L N Bk Hkv D 4, allocated once.
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
    // Errors: a non-positive dimension.
    static Result<PagedKvCache> create(const PagedKvShape& shape);

    const PagedKvShape& shape() const { return shape_; }
    size_t bytes() const { return 2 * keys_.size() * keys_[0].size() * sizeof(float); }
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
    std::vector<std::vector<float>> keys_, values_;  // per layer, (N, Bk, Hkv, D)
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
