#include "model/param_table.h"

#include <cstring>

#include "core/check.h"

namespace lathe {

namespace {

uint32_t role_key(ParamRole role, int layer) {
    return uint32_t(layer + 1) * uint32_t(kParamRoleCount) + uint32_t(role);
}

// Rows and columns of a shape seen as (rows, cols): rank 1 is one column per row.
std::pair<int64_t, int64_t> rows_cols(const Shape& s) {
    if (s.rank() == 1) return {s[0], 1};
    LATHE_CHECK(s.rank() == 2, "parameter shape {} is neither 1-D nor 2-D", s.to_string());
    return {s[0], s[1]};
}

// The arena shape of an HF tensor.
Shape arena_shape(const Shape& hf, HfLayout layout) {
    if (layout == HfLayout::kTransposed) {
        LATHE_CHECK(hf.rank() == 2, "a transposed parameter must be 2-D, got {}", hf.to_string());
        return Shape{hf[1], hf[0]};
    }
    return hf;
}

// Arena row of HF row `r` for kQkvInterleavedPerHead with H heads of D dims.
int64_t qkv_arena_row(int64_t r, int64_t H, int64_t D) {
    const int64_t h = r / (3 * D), p = (r % (3 * D)) / D, d = r % D;
    return p * H * D + h * D + d;
}

}  // namespace

std::string_view param_role_name(ParamRole role) {
    switch (role) {
        case ParamRole::kTokenEmbedding:
            return "token_embedding";
        case ParamRole::kPositionEmbedding:
            return "position_embedding";
        case ParamRole::kFinalNormWeight:
            return "final_norm_weight";
        case ParamRole::kFinalNormBias:
            return "final_norm_bias";
        case ParamRole::kLmHead:
            return "lm_head";
        case ParamRole::kNorm1Weight:
            return "norm1_weight";
        case ParamRole::kNorm1Bias:
            return "norm1_bias";
        case ParamRole::kQkvWeight:
            return "qkv_weight";
        case ParamRole::kQkvBias:
            return "qkv_bias";
        case ParamRole::kOutWeight:
            return "out_weight";
        case ParamRole::kOutBias:
            return "out_bias";
        case ParamRole::kNorm2Weight:
            return "norm2_weight";
        case ParamRole::kNorm2Bias:
            return "norm2_bias";
        case ParamRole::kUpWeight:
            return "up_weight";
        case ParamRole::kUpBias:
            return "up_bias";
        case ParamRole::kDownWeight:
            return "down_weight";
        case ParamRole::kDownBias:
            return "down_bias";
    }
    return "?";
}

bool param_role_decays(ParamRole role) {
    switch (role) {
        case ParamRole::kTokenEmbedding:
        case ParamRole::kPositionEmbedding:
        case ParamRole::kLmHead:
        case ParamRole::kQkvWeight:
        case ParamRole::kOutWeight:
        case ParamRole::kUpWeight:
        case ParamRole::kDownWeight:
            return true;
        default:
            return false;  // norms and biases
    }
}

const HfParam* ParamTable::find_hf(std::string_view name) const {
    const auto it = hf_index_.find(std::string(name));
    return it == hf_index_.end() ? nullptr : &hf_params_[it->second];
}

size_t ParamTable::find_entry(ParamRole role, int layer) const {
    const auto it = role_index_.find(role_key(role, layer));
    return it == role_index_.end() ? kNone : it->second;
}

int64_t ParamTable::num_elements() const {
    int64_t n = 0;
    for (const ParamEntry& e : entries_) n += e.shape.numel();
    return n;
}

void ParamTableBuilder::add_entry(ParamRole role, int layer, std::string name, Shape shape) {
    const uint32_t key = role_key(role, layer);
    LATHE_CHECK(!table_.role_index_.count(key), "parameter role {} of layer {} added twice",
                param_role_name(role), layer);
    Result<size_t> index = table_.layout_.add(name, DType::kF32, shape);
    LATHE_CHECK(index.ok(), "parameter table: {}", index.status().to_string());
    table_.role_index_[key] = table_.entries_.size();
    table_.entries_.push_back(
        ParamEntry{std::move(name), role, layer, shape, *index, param_role_decays(role)});
}

void ParamTableBuilder::add(ParamRole role, int layer, std::string name, Shape hf_shape,
                            InitKind init, HfLayout layout, int64_t heads) {
    const Shape shape = arena_shape(hf_shape, layout);
    if (layout == HfLayout::kQkvInterleavedPerHead)
        LATHE_CHECK(heads > 0 && shape[0] % (3 * heads) == 0, "{}: {} rows for {} heads", name,
                    shape[0], heads);
    const size_t entry = table_.entries_.size();
    add_entry(role, layer, name, shape);
    LATHE_CHECK(!table_.hf_index_.count(name), "parameter {} added twice", name);
    table_.hf_index_[name] = table_.hf_params_.size();
    table_.hf_params_.push_back(
        HfParam{std::move(name), hf_shape, entry, 0, shape[0], layout, heads, init});
}

void ParamTableBuilder::add_stacked(ParamRole role, int layer, std::string entry_name,
                                    std::vector<StackedPart> parts) {
    LATHE_CHECK(!parts.empty(), "stacked entry {} without parts", entry_name);
    int64_t rows = 0;
    for (const StackedPart& p : parts) {
        LATHE_CHECK(p.shape.rank() == parts[0].shape.rank() &&
                        (p.shape.rank() == 1 || p.shape[1] == parts[0].shape[1]),
                    "stacked entry {}: part {} is {}, the first part {}", entry_name, p.name,
                    p.shape.to_string(), parts[0].shape.to_string());
        rows += p.shape[0];
    }
    const Shape shape = parts[0].shape.with_dim(0, rows);
    const size_t entry = table_.entries_.size();
    add_entry(role, layer, std::move(entry_name), shape);
    int64_t row = 0;
    for (StackedPart& p : parts) {
        LATHE_CHECK(!table_.hf_index_.count(p.name), "parameter {} added twice", p.name);
        table_.hf_index_[p.name] = table_.hf_params_.size();
        const int64_t n = p.shape[0];
        table_.hf_params_.push_back(
            HfParam{std::move(p.name), p.shape, entry, row, n, HfLayout::kSame, 0, p.init});
        row += n;
    }
}

ParamTable ParamTableBuilder::finish() && {
    return std::move(table_);
}

void hf_param_import(const HfParam& p, TensorView entry, ConstTensorView hf) {
    LATHE_CHECK(hf.shape() == p.shape && hf.dtype() == DType::kF32 && entry.dtype() == DType::kF32,
                "{}: import of {} into {}", p.name, hf.to_string(), entry.to_string());
    LATHE_CHECK(hf.device() == Device::kCpu && entry.device() == Device::kCpu,
                "{}: layout changes run on host memory", p.name);
    float* dst = entry.slice(p.row_begin, p.row_begin + p.rows).as<float>();
    const float* src = hf.as<float>();
    const auto [rows, cols] = rows_cols(p.shape);
    switch (p.layout) {
        case HfLayout::kSame:
            std::memcpy(dst, src, size_t(hf.numel()) * sizeof(float));
            return;
        case HfLayout::kTransposed:  // hf (I, O) -> arena (O, I)
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t o = 0; o < cols; ++o) dst[o * rows + i] = src[i * cols + o];
            return;
        case HfLayout::kQkvInterleavedPerHead: {
            const int64_t D = rows / (3 * p.heads);
            for (int64_t r = 0; r < rows; ++r)
                std::memcpy(dst + qkv_arena_row(r, p.heads, D) * cols, src + r * cols,
                            size_t(cols) * sizeof(float));
            return;
        }
    }
}

void hf_param_export(const HfParam& p, ConstTensorView entry, TensorView hf) {
    LATHE_CHECK(hf.shape() == p.shape && hf.dtype() == DType::kF32 && entry.dtype() == DType::kF32,
                "{}: export of {} into {}", p.name, entry.to_string(), hf.to_string());
    LATHE_CHECK(hf.device() == Device::kCpu && entry.device() == Device::kCpu,
                "{}: layout changes run on host memory", p.name);
    const float* src = entry.slice(p.row_begin, p.row_begin + p.rows).as<float>();
    float* dst = hf.as<float>();
    const auto [rows, cols] = rows_cols(p.shape);
    switch (p.layout) {
        case HfLayout::kSame:
            std::memcpy(dst, src, size_t(hf.numel()) * sizeof(float));
            return;
        case HfLayout::kTransposed:
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t o = 0; o < cols; ++o) dst[i * cols + o] = src[o * rows + i];
            return;
        case HfLayout::kQkvInterleavedPerHead: {
            const int64_t D = rows / (3 * p.heads);
            for (int64_t r = 0; r < rows; ++r)
                std::memcpy(dst + r * cols, src + qkv_arena_row(r, p.heads, D) * cols,
                            size_t(cols) * sizeof(float));
            return;
        }
    }
}

}  // namespace lathe
