#pragma once
// The key/value cache of inference: for every layer, the keys and values of every token a
// sequence has seen, so that a new token attends to them without recomputing them.
//
// Layout, per layer l: keys(l) and values(l) are (S, Tmax, Hkv, D) tensors (S rows, one sequence
// per row; Hkv key/value heads, so a grouped-query model stores Hkv, not H, heads) in the
// activation dtype of the backend: f32 in host memory on the CPU, bf16 in device memory on CUDA
// (one allocation, ModelArena). Row r's positions 0..length(r)-1 are filled; the rest is never
// read (attention_decode reads up to each row's length, the prefill's attention a row's filled
// prefix). Bytes: 2 L S Tmax Hkv D dtype_size, reserved once.
//
// Sequences are named by SeqId handles, stable while the sequence is open. The open sequences
// always occupy rows 0..rows_in_use()-1, so that one decode step reads the leading rows of every
// layer as one contiguous (n, Tmax, Hkv, D) batch: close() moves the last row's filled prefix into
// the freed row (a device copy on CUDA) and updates that sequence's row. A continuous-batching
// server opens a sequence when a request joins and closes it when it leaves, between steps.

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/model.h"
#include "ops/context.h"

namespace lathe {

struct KvCacheShape {
    int64_t layers = 0;    // L
    int64_t rows = 0;      // S, the most sequences open at once
    int64_t max_len = 0;   // Tmax, the most tokens (prompt and generated) of one sequence
    int64_t kv_heads = 0;  // Hkv
    int64_t head_dim = 0;  // D
    DType dtype = DType::kF32;
};

using SeqId = int64_t;

class KvCache {
public:
    KvCache() = default;
    // Allocates (zeroed) where `ctx` computes. Errors: a non-positive dimension, allocation
    // failure.
    static Result<KvCache> create(const KvCacheShape& shape, const Context& ctx);

    const KvCacheShape& shape() const { return shape_; }
    size_t bytes() const { return arena_.layout().total_bytes(); }

    TensorView keys(int layer) const { return arena_.view(size_t(2 * layer)); }  // (S,Tmax,Hkv,D)
    TensorView values(int layer) const { return arena_.view(size_t(2 * layer + 1)); }  // same
    // Row `row`'s positions [begin, end) of keys(layer) / values(layer), as (1, end-begin, Hkv, D).
    TensorView keys(int layer, int64_t row, int64_t begin, int64_t end) const;
    TensorView values(int layer, int64_t row, int64_t begin, int64_t end) const;

    // Opens a sequence of length 0 in row rows_in_use(). Error (resource exhausted, naming S)
    // when every row is taken.
    Result<SeqId> open();
    // Closes `seq` (an open handle, else a caller bug: checked); the last row moves into its row.
    void close(SeqId seq);
    bool is_open(SeqId seq) const;
    int64_t rows_in_use() const { return int64_t(row_seq_.size()); }
    int64_t row(SeqId seq) const;     // the row of an open sequence (checked)
    SeqId seq_at(int64_t row) const;  // the sequence in a row < rows_in_use() (checked)
    int64_t length(SeqId seq) const;  // positions filled
    // Sets the filled length (0 <= length <= Tmax, checked): the engine calls it after writing.
    void set_length(SeqId seq, int64_t length);

private:
    void copy_row_prefix(int64_t from, int64_t to, int64_t length);

    KvCacheShape shape_;
    Context ctx_;
    ModelArena arena_;
    std::vector<SeqId> row_seq_;       // row -> sequence, rows 0..n-1
    std::vector<int64_t> seq_row_;     // sequence -> row, -1 when closed
    std::vector<int64_t> seq_length_;  // sequence -> filled positions
};

}  // namespace lathe
