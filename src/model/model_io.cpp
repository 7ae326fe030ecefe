#include "model/model_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/param_staging.h"
#include "model/registry.h"

namespace lathe {

namespace {

// The HF parameter called `name` and its parameter arena entry; an unknown name is a bug.
std::pair<const HfParam*, size_t> find_hf_param(const Model& model, std::string_view name) {
    const HfParam* p = model.params().find_hf(name);
    LATHE_CHECK(p != nullptr, "no parameter called {}", name);
    return {p, model.params().entries()[p->entry].arena_index};
}

// The file an error about `ckpt` names: its index, else its one shard.
std::string checkpoint_where(const SafetensorsCheckpoint& ckpt) {
    if (!ckpt.index_path().empty()) return ckpt.index_path();
    const std::vector<std::string> shards = ckpt.shard_paths();
    return shards.empty() ? std::string("checkpoint") : shards[0];
}

// Tensors are compared a block of elements at a time, as f32.
constexpr uint64_t kCompareBlock = 1 << 20;

bool is_float_weight(SafetensorsDtype d) {
    return d == SafetensorsDtype::kF32 || d == SafetensorsDtype::kBF16 ||
           d == SafetensorsDtype::kF16;
}

// Compares two float tensors of the same shape by value (as f32 bit patterns). Returns the first
// differing element, or -1 when equal.
int64_t first_difference(const SafetensorsTensor& a, const SafetensorsTensor& b, float* va,
                         float* vb) {
    const uint64_t n = a.numel();
    std::vector<float> x(std::min(n, kCompareBlock)), y(x.size());
    for (uint64_t begin = 0; begin < n; begin += kCompareBlock) {
        const uint64_t m = std::min(kCompareBlock, n - begin);
        LATHE_CHECK(safetensors_convert_elements(a, begin, m, SafetensorsDtype::kF32, x.data()) &&
                        safetensors_convert_elements(b, begin, m, SafetensorsDtype::kF32, y.data()),
                    "tied-head comparison of {} and {}: not float weights", a.name, b.name);
        if (std::memcmp(x.data(), y.data(), m * sizeof(float)) == 0) continue;
        for (uint64_t i = 0; i < m; ++i) {
            if (std::bit_cast<uint32_t>(x[i]) != std::bit_cast<uint32_t>(y[i])) {
                *va = x[i];
                *vb = y[i];
                return int64_t(begin + i);
            }
        }
    }
    return -1;
}

}  // namespace

Status check_finite_weights(const NonFiniteCount& bad, int64_t n, const std::string& where,
                            std::string_view name) {
    if (bad.count == 0) return ok_status();
    return data_loss_error(
        "{}: tensor {}: {}: the run that wrote these weights diverged or the file is damaged, and "
        "a model computing with them gives NaN; use an earlier checkpoint",
        where, name, non_finite_phrase(bad, n, bad.first));
}

Status check_tied_head(const SafetensorsTensor& head, const SafetensorsTensor& embedding,
                       const std::string& where) {
    float a = 0, b = 0;
    const bool same_shape = head.shape == embedding.shape;
    const bool floats = is_float_weight(head.dtype) && is_float_weight(embedding.dtype);
    const int64_t diff = same_shape && floats ? first_difference(head, embedding, &a, &b) : 0;
    if (same_shape && floats && diff < 0) return ok_status();
    const std::string what =
        !same_shape ? fmt::format("has shape {} (the embedding has {})", head.shape_string(),
                                  embedding.shape_string())
        : !is_float_weight(head.dtype)
            ? fmt::format("is {}", safetensors_dtype_name(head.dtype))
            : fmt::format("differs from it (element {}: {} vs {})", diff, a, b);
    return invalid_argument_error(
        "{}: config.json says tie_word_embeddings true (the LM head is the token embedding "
        "'{}'), but the checkpoint has its own '{}', which {}; if the head is separate, set "
        "\"tie_word_embeddings\": false in config.json",
        where, embedding.name, head.name, what);
}

Result<Model> model_create_loaded(const ModelConfig& config, const ModelShape& shape,
                                  const Context& ctx, const std::string& dir) {
    LATHE_ASSIGN_OR_RETURN(Model model, Model::create(config, shape, ctx));
    auto ck = SafetensorsCheckpoint::open(dir);
    if (!ck.ok()) return ck.status().with_context("--checkpoint");
    LATHE_RETURN_IF_ERROR(model_load_hf(model, *ck));
    return model;
}

Status model_load_hf(Model& model, const SafetensorsCheckpoint& ckpt) {
    const ModelConfig& config = model.config();
    const ParamTable& table = model.params();
    const ModelFamily& family = model_family_of(config);
    const std::string where = checkpoint_where(ckpt);
    ParamStaging staging(model);
    std::unordered_set<std::string> used;
    const SafetensorsTensor* embedding = nullptr;
    for (const HfParam& p : table.hf_params()) {
        std::string name = p.name;
        if (!ckpt.contains(name) && name.starts_with(family.base_model_prefix) &&
            ckpt.contains(name.substr(family.base_model_prefix.size())))
            name = name.substr(family.base_model_prefix.size());
        Result<const SafetensorsTensor*> found = ckpt.tensor(name);
        if (!found.ok())
            return found.status().with_context(fmt::format(
                "loading {} weights ({} parameters)", config.model_type, table.hf_params().size()));
        const SafetensorsTensor& t = **found;
        used.insert(name);
        if (table.entries()[p.entry].role == ParamRole::kTokenEmbedding) embedding = &t;
        bool shape_ok = int(t.shape.size()) == p.shape.rank();
        for (int i = 0; shape_ok && i < p.shape.rank(); ++i)
            shape_ok = t.shape[size_t(i)] == p.shape[i];
        if (!shape_ok)
            return invalid_argument_error(
                "{}: tensor {} has shape {}, but config.json gives {} for it; the checkpoint and "
                "its config.json disagree",
                where, name, t.shape_string(), p.shape.to_string());
        HostTensor hf(DType::kF32, p.shape);
        if (!safetensors_convert_elements(t, 0, uint64_t(p.shape.numel()), SafetensorsDtype::kF32,
                                          hf.as<float>()))
            return unimplemented_error("{}: tensor {} is {}; lathe loads F32, BF16 and F16 weights",
                                       where, name, safetensors_dtype_name(t.dtype));
        LATHE_RETURN_IF_ERROR(check_finite_weights(
            count_non_finite(hf.as<float>(), p.shape.numel()), p.shape.numel(), where, name));
        hf_param_import(p, staging.host(table.entries()[p.entry].arena_index), hf.view());
    }
    staging.upload_all(model);
    std::string unused;
    int unused_count = 0;
    for (const std::string& name : ckpt.names()) {
        if (used.count(name)) continue;
        bool ignored = false;
        for (std::string_view suffix : family.ignored_suffixes) ignored |= name.ends_with(suffix);
        // A tied model's checkpoint may still carry the head (some exporters write it): taken
        // only when it is the embedding.
        if (config.tie_word_embeddings &&
            (name == "lm_head.weight" || name == "embed_out.weight")) {
            if (embedding != nullptr) {
                LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* head, ckpt.tensor(name));
                LATHE_RETURN_IF_ERROR(check_tied_head(*head, *embedding, where));
            }
            ignored = true;
        }
        if (ignored) continue;
        if (unused_count++ < 8) unused += fmt::format("{}{}", unused.empty() ? "" : ", ", name);
    }
    if (unused_count > 0)
        log_warning("{}: {} tensors are not parameters of this {} model and were not loaded: {}{}",
                    where, unused_count, config.model_type, unused,
                    unused_count > 8 ? ", ..." : "");
    return ok_status();
}

Status model_save_hf(const Model& model, const std::string& dir) {
    ParamStaging staging(model);
    staging.download_all();
    return model_save_hf_staged(model, staging, dir);
}

Status model_save_hf_staged(const Model& model, ParamStaging& staging, const std::string& dir) {
    const ParamTable& table = model.params();
    std::vector<HostTensor> staged;  // HF-layout copies (also for kSame: the rows of an entry)
    staged.reserve(table.hf_params().size());
    std::vector<SafetensorsWriteTensor> tensors;
    for (const HfParam& p : table.hf_params()) {
        staged.emplace_back(DType::kF32, p.shape);
        hf_param_export(p, staging.host(table.entries()[p.entry].arena_index),
                        staged.back().view());
        tensors.push_back(safetensors_write_tensor(p.name, staged.back().view()));
    }
    LATHE_RETURN_IF_ERROR(safetensors_write_checkpoint(dir, tensors).status());
    HfModelConfig hf = model.config().hf;
    hf.torch_dtype = "float32";
    return hf_config_save(dir + "/config.json", hf);
}

void model_read_param_hf(const Model& model, std::string_view name, TensorView out) {
    const auto [p, index] = find_hf_param(model, name);
    ParamStaging staging(model);
    staging.download(index);
    hf_param_export(*p, staging.host(index), out);
}

void model_read_grad_hf(const Model& model, std::string_view name, TensorView out) {
    const auto [p, index] = find_hf_param(model, name);
    const ArenaEntry& e = model.plan().params.entries()[index];
    HostTensor host(e.dtype, e.shape);
    model.read_grad_entry(index, host.view());
    hf_param_export(*p, host.view(), out);
}

void model_write_param_hf(Model& model, std::string_view name, ConstTensorView hf) {
    const auto [p, index] = find_hf_param(model, name);
    ParamStaging staging(model);
    staging.download(index);  // other HF tensors may share the entry (q, k, v)
    hf_param_import(*p, staging.host(index), hf);
    staging.upload(model, index);
}

}  // namespace lathe
