// FP8 settings, policy and delayed-scaling state (model/fp8_state.h).

#include "model/fp8_state.h"
#include "io/json.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "ops/fp8_cast.h"

namespace lathe {

namespace {

constexpr std::string_view kFormat = "lathe-fp8-scaling";
constexpr int kVersion = 1;

// The four block roles an FP8 recipe puts in FP8.
constexpr LinearRole kBlockRoles[] = {LinearRole::kQkv, LinearRole::kAttnOut, LinearRole::kMlpUp,
                                      LinearRole::kMlpDown};

}  // namespace

std::string_view fp8_recipe_name(Fp8Recipe r) {
    switch (r) {
        case Fp8Recipe::kTensorwise:
            return "tensorwise";
        case Fp8Recipe::kDelayed:
            return "delayed";
        case Fp8Recipe::kBlockwise:
            return "blockwise";
    }
    return "?";
}

std::string_view fp8_amax_reduction_name(Fp8AmaxReduction r) {
    return r == Fp8AmaxReduction::kMax ? "max" : "most_recent";
}

Result<Fp8Settings> fp8_settings_parse(std::string_view recipe, std::string_view grad_format,
                                       bool lm_head, int64_t amax_history,
                                       std::string_view amax_reduction,
                                       const std::function<std::string(std::string_view)>& source) {
    Fp8Settings s;
    if (recipe == "tensorwise")
        s.recipe = Fp8Recipe::kTensorwise;
    else if (recipe == "delayed")
        s.recipe = Fp8Recipe::kDelayed;
    else if (recipe == "blockwise")
        s.recipe = Fp8Recipe::kBlockwise;
    else
        return invalid_argument_error(
            "{}: 'fp8.recipe' is '{}'; choose tensorwise, delayed or blockwise",
            source("fp8.recipe"), recipe);
    if (grad_format == "auto")
        s.grad_dtype = s.recipe == Fp8Recipe::kBlockwise ? DType::kE4M3 : DType::kE5M2;
    else if (grad_format == "e4m3")
        s.grad_dtype = DType::kE4M3;
    else if (grad_format == "e5m2")
        s.grad_dtype = DType::kE5M2;
    else
        return invalid_argument_error("{}: 'fp8.grad_format' is '{}'; choose auto, e4m3 or e5m2",
                                      source("fp8.grad_format"), grad_format);
    if (s.recipe == Fp8Recipe::kBlockwise && s.grad_dtype != DType::kE4M3)
        return invalid_argument_error(
            "{}: 'fp8.recipe: blockwise' casts gradients to e4m3 (DeepSeek-V3's scheme), but "
            "'fp8.grad_format' is '{}'; set fp8.grad_format: e4m3",
            source("fp8.grad_format"), grad_format);
    if (amax_history < 1 || amax_history > kFp8MaxAmaxHistory)
        return invalid_argument_error("{}: 'fp8.amax_history' is {}; choose 1 to {}",
                                      source("fp8.amax_history"), amax_history, kFp8MaxAmaxHistory);
    s.amax_history = int(amax_history);
    if (amax_reduction == "max")
        s.amax_reduction = Fp8AmaxReduction::kMax;
    else if (amax_reduction == "most_recent")
        s.amax_reduction = Fp8AmaxReduction::kMostRecent;
    else
        return invalid_argument_error("{}: 'fp8.amax_reduction' is '{}'; choose max or most_recent",
                                      source("fp8.amax_reduction"), amax_reduction);
    s.lm_head = lm_head;
    return s;
}

PrecisionPolicy fp8_precision_policy(const Fp8Settings& s) {
    const LinearPrecision p = s.recipe == Fp8Recipe::kBlockwise ? LinearPrecision::kFp8Blockwise
                                                                : LinearPrecision::kFp8PerTensor;
    PrecisionPolicy policy;
    for (LinearRole r : kBlockRoles) policy.set(r, p);
    if (s.lm_head) policy.set(LinearRole::kLmHead, p);
    return policy;
}

int64_t fp8_tensor_index(int64_t layers, int64_t layer, Fp8Linear linear, Fp8Tensor t) {
    LATHE_CHECK(layer >= 0 && layer < layers, "fp8_tensor_index: layer {} of {}", layer, layers);
    return (layer * kFp8LinearsPerLayer + int64_t(linear)) * 3 + int64_t(t);
}

int64_t fp8_head_tensor_index(int64_t layers, Fp8Tensor t) {
    return layers * kFp8LinearsPerLayer * 3 + int64_t(t);
}

int64_t fp8_tensor_count(int64_t layers, const Fp8Settings& s) {
    return layers * kFp8LinearsPerLayer * 3 + (s.lm_head ? 3 : 0);
}

int64_t fp8_gemms_per_step(int64_t layers, const Fp8Settings& s, int64_t micro_batches) {
    return (layers * kFp8LinearsPerLayer + (s.lm_head ? 1 : 0)) * 3 * micro_batches;
}

int64_t fp8_gemms_per_step(int64_t layers, const Fp8Settings& s, int64_t micro_batches,
                           bool full_recompute) {
    return fp8_gemms_per_step(layers, s, micro_batches) +
           (full_recompute ? layers * kFp8LinearsPerLayer * micro_batches : 0);
}

Fp8ScalingState::Fp8ScalingState(std::vector<DType> dtypes, int history, Fp8AmaxReduction reduction)
    : dtypes_(std::move(dtypes)),
      history_(history),
      reduction_(reduction),
      amax_(dtypes_.size() * size_t(history), 0.0f),
      scale_(dtypes_.size(), 1.0f) {
    LATHE_CHECK(history >= 1, "Fp8ScalingState: history {}", history);
    for (DType t : dtypes_)
        LATHE_CHECK(is_fp8(t), "Fp8ScalingState: {} is not an fp8 dtype", dtype_name(t));
}

float Fp8ScalingState::newest_amax(int64_t t) const {
    return amax_[size_t(t) * size_t(history_) + size_t(position_)];
}

void Fp8ScalingState::record(int64_t t, float amax) {
    LATHE_CHECK(t >= 0 && t < tensors(), "Fp8ScalingState::record: tensor {} of {}", t, tensors());
    float& slot = amax_[size_t(t) * size_t(history_) + size_t(position_)];
    // NaN wins, as in the casts' amax (a NaN step is seen, never hidden).
    if (std::isnan(amax) || amax > slot) slot = amax;
}

void Fp8ScalingState::update() {
    for (int64_t t = 0; t < tensors(); ++t) {
        const float* h = &amax_[size_t(t) * size_t(history_)];
        float r = h[position_];
        if (reduction_ == Fp8AmaxReduction::kMax)
            for (int i = 0; i < history_; ++i) r = std::isnan(h[i]) || h[i] > r ? h[i] : r;
        if (std::isfinite(r) && r > 0.0f)
            scale_[size_t(t)] = fp8_scale_from_amax(r, dtypes_[size_t(t)]);
    }
    position_ = (position_ + 1) % history_;
    for (int64_t t = 0; t < tensors(); ++t)
        amax_[size_t(t) * size_t(history_) + size_t(position_)] = 0.0f;
}

Status Fp8ScalingState::save(const std::string& path) const {
    nlohmann::json j;
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["history"] = history_;
    j["reduction"] = fp8_amax_reduction_name(reduction_);
    j["position"] = position_;
    std::vector<std::string> dtypes;
    for (DType t : dtypes_) dtypes.emplace_back(dtype_name(t));
    j["dtypes"] = dtypes;
    std::vector<uint32_t> scale_bits, amax_bits;
    for (float v : scale_) scale_bits.push_back(std::bit_cast<uint32_t>(v));
    for (float v : amax_) amax_bits.push_back(std::bit_cast<uint32_t>(v));
    j["scale_bits"] = scale_bits;
    j["amax_history_bits"] = amax_bits;
    const Status st = file_write_atomic(path, j.dump() + "\n");
    if (!st.ok()) return st.with_context("the fp8 scaling state");
    return {};
}

Status Fp8ScalingState::load(const std::string& path) {
    auto text = file_read_all(path);
    if (!text.ok()) return text.status().with_context("the fp8 scaling state");
    const nlohmann::json j = json_parse<nlohmann::json>(text.value());
    if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat)
        return data_loss_error("{}: not a lathe fp8 scaling state (format '{}')", path, kFormat);
    if (j.value("version", 0) != kVersion)
        return data_loss_error("{}: fp8 scaling state version {}; this lathe reads version {}",
                               path, j.value("version", 0), kVersion);
    try {
        std::vector<std::string> want;
        for (DType t : dtypes_) want.emplace_back(dtype_name(t));
        const auto dtypes = j.at("dtypes").get<std::vector<std::string>>();
        if (dtypes != want)
            return failed_precondition_error(
                "{}: the fp8 scaling state holds {} tensors, this run scales {} (or their fp8 "
                "formats differ: fp8.grad_format, fp8.lm_head or the layer count changed); "
                "resume with the run's settings, or start the fp8 state afresh by removing the "
                "file",
                path, dtypes.size(), want.size());
        const int history = j.at("history").get<int>();
        const std::string reduction = j.at("reduction").get<std::string>();
        if (history != history_ || reduction != fp8_amax_reduction_name(reduction_))
            return failed_precondition_error(
                "{}: the fp8 scaling state has fp8.amax_history {} and fp8.amax_reduction {}; "
                "this run has {} and {}",
                path, history, reduction, history_, fp8_amax_reduction_name(reduction_));
        const int64_t position = j.at("position").get<int64_t>();
        const auto scale_bits = j.at("scale_bits").get<std::vector<uint32_t>>();
        const auto amax_bits = j.at("amax_history_bits").get<std::vector<uint32_t>>();
        if (position < 0 || position >= history_ || scale_bits.size() != scale_.size() ||
            amax_bits.size() != amax_.size())
            return data_loss_error(
                "{}: the fp8 scaling state is malformed (position {}, {} scales, {} amaxes)", path,
                position, scale_bits.size(), amax_bits.size());
        position_ = position;
        for (size_t i = 0; i < scale_.size(); ++i) scale_[i] = std::bit_cast<float>(scale_bits[i]);
        for (size_t i = 0; i < amax_.size(); ++i) amax_[i] = std::bit_cast<float>(amax_bits[i]);
    } catch (const nlohmann::json::exception& e) {
        return data_loss_error("{}: the fp8 scaling state is malformed ({})", path, e.what());
    }
    return {};
}

}  // namespace lathe
