#include "infer/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/check.h"

namespace lathe {

Result<PagedKvCache> PagedKvCache::create(const PagedKvShape& s, const Context& ctx) {
    if (s.layers < 1 || s.blocks < 1 || s.block_size < 1 || s.kv_heads < 1 || s.head_dim < 1) {
        return invalid_argument_error(
            "paged KV cache: layers {}, blocks {}, block_size {}, kv_heads {}, head_dim {} must "
            "all be >= 1",
            s.layers, s.blocks, s.block_size, s.kv_heads, s.head_dim);
    }
    if (s.blocks > std::numeric_limits<int32_t>::max() / s.block_size) {
        return invalid_argument_error(
            "paged KV cache: {} blocks of {} positions exceed 2^31 positions (fewer kv_blocks)",
            s.blocks, s.block_size);
    }
    PagedKvCache c;
    c.shape_ = s;
    if (ctx.backend == Backend::kCuda) {
        c.device_ = true;
        ArenaLayout layout;
        const Shape pool{s.blocks, s.block_size, s.kv_heads, s.head_dim};
        for (int64_t l = 0; l < s.layers; ++l) {
            LATHE_ASSIGN_OR_RETURN(size_t k,
                                   layout.add("kv.k." + std::to_string(l), DType::kBF16, pool));
            LATHE_ASSIGN_OR_RETURN(size_t v,
                                   layout.add("kv.v." + std::to_string(l), DType::kBF16, pool));
            LATHE_CHECK(k == size_t(2 * l) && v == k + 1, "paged KV cache layout order");
        }
        LATHE_ASSIGN_OR_RETURN(c.arena_, ModelArena::allocate(std::move(layout), ctx));
    } else {
        const size_t n = size_t(s.blocks * s.block_size * s.kv_heads * s.head_dim);
        c.keys_.assign(size_t(s.layers), std::vector<float>(n, 0.0f));
        c.values_.assign(size_t(s.layers), std::vector<float>(n, 0.0f));
    }
    // Block 0 is handed out first.
    for (int64_t b = s.blocks - 1; b >= 0; --b) c.free_.push_back(int32_t(b));
    return c;
}

SeqId PagedKvCache::open() {
    if (!free_ids_.empty()) {
        const SeqId seq = free_ids_.back();
        free_ids_.pop_back();
        open_flag_[size_t(seq)] = 1;
        ++open_;
        return seq;
    }
    const SeqId seq = SeqId(tables_.size());
    tables_.emplace_back();
    lengths_.push_back(0);
    open_flag_.push_back(1);
    ++open_;
    return seq;
}

bool PagedKvCache::is_open(SeqId seq) const {
    return seq >= 0 && seq < SeqId(open_flag_.size()) && open_flag_[size_t(seq)];
}

void PagedKvCache::close(SeqId seq) {
    LATHE_CHECK(is_open(seq), "paged KV cache: sequence {} is not open", seq);
    std::vector<int32_t>& t = tables_[size_t(seq)];
    for (auto it = t.rbegin(); it != t.rend(); ++it) free_.push_back(*it);
    t.clear();
    t.shrink_to_fit();
    lengths_[size_t(seq)] = 0;
    open_flag_[size_t(seq)] = 0;
    free_ids_.push_back(seq);
    --open_;
}

int64_t PagedKvCache::length(SeqId seq) const {
    LATHE_CHECK(is_open(seq), "paged KV cache: sequence {} is not open", seq);
    return lengths_[size_t(seq)];
}

void PagedKvCache::set_length(SeqId seq, int64_t length) {
    LATHE_CHECK(is_open(seq) && length >= 0 &&
                    length <= int64_t(tables_[size_t(seq)].size()) * shape_.block_size,
                "paged KV cache: length {} of sequence {} beyond its blocks", length, seq);
    lengths_[size_t(seq)] = length;
}

Status PagedKvCache::reserve(SeqId seq, int64_t length) {
    LATHE_CHECK(is_open(seq), "paged KV cache: sequence {} is not open", seq);
    std::vector<int32_t>& t = tables_[size_t(seq)];
    const int64_t need = blocks_for(length) - int64_t(t.size());
    if (need <= 0) return ok_status();
    if (need > free_blocks()) {
        return failed_precondition_error(
            "paged KV cache: {} more blocks of {} positions for sequence {}, {} of {} free", need,
            shape_.block_size, seq, free_blocks(), shape_.blocks);
    }
    for (int64_t i = 0; i < need; ++i) {
        t.push_back(free_.back());
        free_.pop_back();
    }
    return ok_status();
}

const std::vector<int32_t>& PagedKvCache::table(SeqId seq) const {
    LATHE_CHECK(is_open(seq), "paged KV cache: sequence {} is not open", seq);
    return tables_[size_t(seq)];
}

int32_t PagedKvCache::slot(SeqId seq, int64_t pos) const {
    const std::vector<int32_t>& t = table(seq);
    const int64_t Bk = shape_.block_size;
    LATHE_CHECK(pos >= 0 && pos / Bk < int64_t(t.size()),
                "paged KV cache: position {} of sequence {} beyond its {} blocks", pos, seq,
                t.size());
    return int32_t(int64_t(t[size_t(pos / Bk)]) * Bk + pos % Bk);
}

TensorView PagedKvCache::keys(int layer) const {
    if (device_) return arena_.view(size_t(2 * layer));
    const Shape pool{shape_.blocks, shape_.block_size, shape_.kv_heads, shape_.head_dim};
    return TensorView(const_cast<float*>(keys_[size_t(layer)].data()), DType::kF32, pool,
                      Device::kCpu);
}

TensorView PagedKvCache::values(int layer) const {
    if (device_) return arena_.view(size_t(2 * layer + 1));
    const Shape pool{shape_.blocks, shape_.block_size, shape_.kv_heads, shape_.head_dim};
    return TensorView(const_cast<float*>(values_[size_t(layer)].data()), DType::kF32, pool,
                      Device::kCpu);
}

float* PagedKvCache::at(std::vector<float>& pool, SeqId seq, int64_t pos) {
    LATHE_CHECK(!device_, "paged KV cache: a host pointer into the device pools");
    const std::vector<int32_t>& t = table(seq);
    const int64_t Bk = shape_.block_size, row = shape_.kv_heads * shape_.head_dim;
    LATHE_CHECK(pos >= 0 && pos / Bk < int64_t(t.size()),
                "paged KV cache: position {} of sequence {} beyond its {} blocks", pos, seq,
                t.size());
    return pool.data() + (int64_t(t[size_t(pos / Bk)]) * Bk + pos % Bk) * row;
}

float* PagedKvCache::key(int layer, SeqId seq, int64_t pos) {
    return at(keys_[size_t(layer)], seq, pos);
}

float* PagedKvCache::value(int layer, SeqId seq, int64_t pos) {
    return at(values_[size_t(layer)], seq, pos);
}

void PagedKvCache::gather(int layer, SeqId seq, int64_t length, float* k, float* v) const {
    LATHE_CHECK(!device_, "paged KV cache: a host gather of the device pools");
    const std::vector<int32_t>& t = table(seq);
    const int64_t Bk = shape_.block_size, row = shape_.kv_heads * shape_.head_dim;
    LATHE_CHECK(blocks_for(length) <= int64_t(t.size()), "paged KV cache: gather {} of {}", length,
                seq);
    for (int64_t j = 0; j < length; j += Bk) {
        const int64_t n = std::min(Bk, length - j);
        const int64_t src = int64_t(t[size_t(j / Bk)]) * Bk * row;
        std::memcpy(k + j * row, keys_[size_t(layer)].data() + src,
                    size_t(n * row) * sizeof(float));
        std::memcpy(v + j * row, values_[size_t(layer)].data() + src,
                    size_t(n * row) * sizeof(float));
    }
}

void paged_attention_decode(TensorView out, TensorView lse, ConstTensorView q,
                            const PagedKvCache& cache, int layer, std::span<const SeqId> rows,
                            std::span<const int32_t> lengths, int64_t window, float scale) {
    const int64_t n = q.dim(0), H = q.dim(2), D = q.dim(3);
    const int64_t Hkv = cache.shape().kv_heads, Bk = cache.shape().block_size;
    LATHE_CHECK(D == cache.shape().head_dim && H % Hkv == 0 && int64_t(rows.size()) == n &&
                    int64_t(lengths.size()) == n && out.numel() == q.numel() &&
                    lse.numel() == n * H,
                "paged_attention_decode: q {}, out {}, lse {}, {} rows, Hkv {}", q.to_string(),
                out.to_string(), lse.to_string(), rows.size(), Hkv);
    const float* qp = q.as<float>();
    float* op = out.as<float>();
    float* lp = lse.as<float>();
    const auto& pool_k = cache.keys_pool(layer);
    const auto& pool_v = cache.values_pool(layer);
    std::vector<float> s;
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t b = 0; b < n; ++b) {
        const std::vector<int32_t>& t = cache.table(rows[size_t(b)]);
        const int64_t len = lengths[size_t(b)], p = len - 1;
        LATHE_CHECK(len >= 1 && cache.blocks_for(len) <= int64_t(t.size()),
                    "paged_attention_decode: row {} length {} beyond its {} blocks", b, len,
                    t.size());
        const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        s.resize(size_t(len - first));
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / (H / Hkv);
            const float* qh = qp + (b * H + h) * D;
            float m = -INFINITY;
            for (int64_t j = first; j < len; ++j) {
                const float* kj =
                    pool_k.data() + ((int64_t(t[size_t(j / Bk)]) * Bk + j % Bk) * Hkv + g) * D;
                float dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
                s[size_t(j - first)] = scale * dot;
                m = std::max(m, scale * dot);
            }
            double sum = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = first; j < len; ++j) {
                const double e = std::exp(double(s[size_t(j - first)]) - double(m));
                sum += e;
                const float* vj =
                    pool_v.data() + ((int64_t(t[size_t(j / Bk)]) * Bk + j % Bk) * Hkv + g) * D;
                for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += e * double(vj[d]);
            }
            float* oh = op + (b * H + h) * D;
            for (int64_t d = 0; d < D; ++d) oh[d] = float(acc[size_t(d)] / sum);
            lp[b * H + h] = float(double(m) + std::log(sum));
        }
    }
}

}  // namespace lathe
