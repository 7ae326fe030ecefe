#include "infer/kv_cache.h"

#include <cstring>
#include <string>

#include "core/check.h"
#include "ops/cuda/memory.h"

namespace lathe {

Result<KvCache> KvCache::create(const KvCacheShape& s, const Context& ctx) {
    if (s.layers < 1 || s.rows < 1 || s.max_len < 1 || s.kv_heads < 1 || s.head_dim < 1) {
        return invalid_argument_error(
            "KV cache: layers {}, rows {}, max_len {}, kv_heads {}, head_dim {} must all be >= 1",
            s.layers, s.rows, s.max_len, s.kv_heads, s.head_dim);
    }
    ArenaLayout layout;
    for (int64_t l = 0; l < s.layers; ++l) {
        const Shape shape{s.rows, s.max_len, s.kv_heads, s.head_dim};
        LATHE_ASSIGN_OR_RETURN(size_t k, layout.add("kv.k." + std::to_string(l), s.dtype, shape));
        LATHE_ASSIGN_OR_RETURN(size_t v, layout.add("kv.v." + std::to_string(l), s.dtype, shape));
        LATHE_CHECK(k == size_t(2 * l) && v == k + 1, "KV cache layout order");
    }
    KvCache c;
    c.shape_ = s;
    c.ctx_ = ctx;
    LATHE_ASSIGN_OR_RETURN(c.arena_, ModelArena::allocate(std::move(layout), ctx));
    return c;
}

TensorView KvCache::keys(int layer, int64_t row, int64_t begin, int64_t end) const {
    LATHE_CHECK(
        row >= 0 && row < shape_.rows && 0 <= begin && begin <= end && end <= shape_.max_len,
        "KV cache row {} positions [{}, {}) of ({}, {})", row, begin, end, shape_.rows,
        shape_.max_len);
    const Shape one{shape_.max_len, shape_.kv_heads, shape_.head_dim};
    return keys(layer)
        .slice(row, row + 1)
        .reshape(one)
        .slice(begin, end)
        .reshape(Shape{1, end - begin, shape_.kv_heads, shape_.head_dim});
}

TensorView KvCache::values(int layer, int64_t row, int64_t begin, int64_t end) const {
    LATHE_CHECK(
        row >= 0 && row < shape_.rows && 0 <= begin && begin <= end && end <= shape_.max_len,
        "KV cache row {} positions [{}, {}) of ({}, {})", row, begin, end, shape_.rows,
        shape_.max_len);
    const Shape one{shape_.max_len, shape_.kv_heads, shape_.head_dim};
    return values(layer)
        .slice(row, row + 1)
        .reshape(one)
        .slice(begin, end)
        .reshape(Shape{1, end - begin, shape_.kv_heads, shape_.head_dim});
}

Result<SeqId> KvCache::open() {
    if (rows_in_use() >= shape_.rows) {
        return failed_precondition_error(
            "KV cache full: all {} rows hold open sequences (close one first)", shape_.rows);
    }
    const SeqId seq = SeqId(seq_row_.size());
    seq_row_.push_back(rows_in_use());
    seq_length_.push_back(0);
    row_seq_.push_back(seq);
    return seq;
}

bool KvCache::is_open(SeqId seq) const {
    return seq >= 0 && seq < SeqId(seq_row_.size()) && seq_row_[size_t(seq)] >= 0;
}

int64_t KvCache::row(SeqId seq) const {
    LATHE_CHECK(is_open(seq), "KV cache: sequence {} is not open", seq);
    return seq_row_[size_t(seq)];
}

SeqId KvCache::seq_at(int64_t r) const {
    LATHE_CHECK(r >= 0 && r < rows_in_use(), "KV cache: row {} of {} in use", r, rows_in_use());
    return row_seq_[size_t(r)];
}

int64_t KvCache::length(SeqId seq) const {
    LATHE_CHECK(is_open(seq), "KV cache: sequence {} is not open", seq);
    return seq_length_[size_t(seq)];
}

void KvCache::set_length(SeqId seq, int64_t length) {
    LATHE_CHECK(is_open(seq) && length >= 0 && length <= shape_.max_len,
                "KV cache: length {} of sequence {} (Tmax {})", length, seq, shape_.max_len);
    seq_length_[size_t(seq)] = length;
}

void KvCache::copy_row_prefix(int64_t from, int64_t to, int64_t length) {
    if (length == 0) return;
    for (int l = 0; l < int(shape_.layers); ++l) {
        const TensorView pairs[2][2] = {{keys(l, to, 0, length), keys(l, from, 0, length)},
                                        {values(l, to, 0, length), values(l, from, 0, length)}};
        for (const auto& p : pairs) {
            if (ctx_.backend == Backend::kCuda)
                cuda_copy_async(p[0], p[1], ctx_.stream);
            else
                std::memcpy(p[0].data(), p[1].data(), p[1].bytes());
        }
    }
}

void KvCache::close(SeqId seq) {
    const int64_t r = row(seq);
    const int64_t last = rows_in_use() - 1;
    if (r != last) {
        const SeqId moved = row_seq_[size_t(last)];
        copy_row_prefix(last, r, seq_length_[size_t(moved)]);
        row_seq_[size_t(r)] = moved;
        seq_row_[size_t(moved)] = r;
    }
    row_seq_.pop_back();
    seq_row_[size_t(seq)] = -1;
    seq_length_[size_t(seq)] = 0;
}

}  // namespace lathe
