#include "align/apply.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "align/map.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "run/convert.h"
#include "run/special_tokens.h"

namespace lathe {

namespace fs = std::filesystem;

namespace {

using Json = nlohmann::json;

constexpr int64_t kVocabPadMultiple = 128;

// A (rows, C) f32 matrix read from a stored tensor of any float dtype lathe reads.
Result<std::vector<float>> read_f32(const SafetensorsTensor& t) {
    const uint64_t n = t.numel();
    std::vector<float> out(n);
    if (!safetensors_convert_elements(t, 0, n, SafetensorsDtype::kF32, out.data()))
        return invalid_argument_error(
            "tensor {} has dtype {}; the embedding must be F32, BF16 or F16", t.name,
            safetensors_dtype_name(t.dtype));
    return out;
}

// f32 values stored back in `dtype` (round to nearest even for the narrow ones).
std::vector<uint8_t> encode_as(const std::vector<float>& v, SafetensorsDtype dtype) {
    SafetensorsTensor f32;
    f32.dtype = SafetensorsDtype::kF32;
    f32.shape = {int64_t(v.size())};
    f32.data = reinterpret_cast<const uint8_t*>(v.data());
    std::vector<uint8_t> out(v.size() * size_t(safetensors_dtype_bits(dtype) / 8));
    LATHE_CHECK(safetensors_convert_elements(f32, 0, v.size(), dtype, out.data()),
                "encode_as: F32 source");
    return out;
}

// The stored tensor for a parameter name: under its full name, or without the family's base-model
// prefix (bare base-model checkpoints); nullptr when it is under neither. Errors: a shard that does
// not open or validate.
Result<const SafetensorsTensor*> find_tensor(const SafetensorsCheckpoint& ckpt,
                                             const std::string& name, std::string_view prefix) {
    if (ckpt.contains(name)) return ckpt.tensor(name);
    if (!prefix.empty() && starts_with(name, prefix)) {
        const std::string bare = name.substr(prefix.size());
        if (ckpt.contains(bare)) return ckpt.tensor(bare);
    }
    return static_cast<const SafetensorsTensor*>(nullptr);
}

// Weighted mean of rows `pieces` of `src` (rows of C) into `dst`. exponential: weight of piece i
// (1-based) is exp(sign * 2 i); computed relative to the largest for range safety.
void combine_rows(float* dst, const std::vector<float>& src, int64_t C,
                  const std::vector<int32_t>& pieces, FvtWeighting weighting, double sign) {
    const size_t k = pieces.size();
    std::vector<double> w(k, 1.0);
    if (weighting == FvtWeighting::kExponential) {
        const double top = sign > 0 ? 2.0 * double(k) : -2.0;  // the largest exponent, subtracted
        for (size_t i = 0; i < k; ++i) w[i] = std::exp(sign * 2.0 * double(i + 1) - top);
    }
    double total = 0.0;
    for (double x : w) total += x;
    std::vector<double> acc(size_t(C), 0.0);
    for (size_t i = 0; i < k; ++i) {
        const float* r = src.data() + int64_t(pieces[i]) * C;
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += w[i] * r[c];
    }
    for (int64_t c = 0; c < C; ++c) dst[c] = float(acc[size_t(c)] / total);
}

std::vector<float> mean_row(const std::vector<float>& m, int64_t rows, int64_t C) {
    std::vector<double> acc(size_t(C), 0.0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += m[size_t(r * C + c)];
    std::vector<float> out(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c)
        out[size_t(c)] = float(acc[size_t(c)] / double(std::max<int64_t>(rows, 1)));
    return out;
}

std::vector<float> std_row(const std::vector<float>& m, const std::vector<float>& mean,
                           int64_t rows, int64_t C) {
    std::vector<double> acc(size_t(C), 0.0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) {
            const double d = m[size_t(r * C + c)] - mean[size_t(c)];
            acc[size_t(c)] += d * d;
        }
    std::vector<float> out(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c)
        out[size_t(c)] = float(std::sqrt(acc[size_t(c)] / double(std::max<int64_t>(rows, 1))));
    return out;
}

// A special token id of the source translated to the target by its string.
std::optional<int64_t> translate_id(std::optional<int64_t> id, const AlignTokenizer& source,
                                    const AlignTokenizer& target) {
    if (!id) return std::nullopt;
    std::optional<std::string> s = source.tokenizer.id_to_token(int32_t(*id));
    if (!s) return std::nullopt;
    std::optional<int32_t> t = target.tokenizer.token_to_id(*s);
    if (!t) return std::nullopt;
    return int64_t(*t);
}

}  // namespace

std::string_view align_init_name(AlignInit init) {
    switch (init) {
        case AlignInit::kAlign:
            return "align";
        case AlignInit::kFvt:
            return "fvt";
        case AlignInit::kMean:
            return "mean";
        case AlignInit::kRandom:
            return "random";
    }
    return "?";
}

Result<AlignApplyResult> align_apply_run(const AlignApplyRequest& req) {
    if (req.output.empty()) return invalid_argument_error("--output is required");
    for (const auto& [flag, w] : {std::pair{"--align-weight", req.align_weight},
                                  std::pair{"--align-head-weight", req.align_head_weight}}) {
        if (!(w >= 0.0 && w <= 1.0))
            return invalid_argument_error(
                "{} is {}; it must be in [0, 1] (1 = the aligned source row, 0 = FVT)", flag, w);
    }
    LATHE_ASSIGN_OR_RETURN(ConvertSource src, convert_find_source(req.checkpoint));
    const std::string config_path = (fs::path(src.dir) / "config.json").string();
    LATHE_ASSIGN_OR_RETURN(HfModelConfig hf, hf_config_load(config_path));
    LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_hf(hf, config_path));
    const ModelFamily& family = model_family_of(cfg);
    const ParamTable table = model_param_table(cfg);
    LATHE_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(src.dir));

    const std::string source_tok_path = req.source_tokenizer.empty()
                                            ? (fs::path(src.dir) / "tokenizer.json").string()
                                            : req.source_tokenizer;
    if (!file_exists(source_tok_path)) {
        return invalid_argument_error(
            "{}: the checkpoint has no tokenizer.json; pass --source-tokenizer (the "
            "tokenizer the model was trained with)",
            src.dir);
    }
    LATHE_ASSIGN_OR_RETURN(AlignTokenizer source, align_load_tokenizer(source_tok_path));
    LATHE_ASSIGN_OR_RETURN(AlignTokenizer target, align_load_tokenizer(req.target_tokenizer));
    const int64_t V = cfg.vocab_size, C = cfg.hidden_size;
    const int64_t Vs_tok = source.tokenizer.vocab_size();
    if (Vs_tok > V) {
        return invalid_argument_error(
            "{} has {} ids but the model ({}) has only {} embedding rows: the model does "
            "not match its tokenizer",
            source_tok_path, Vs_tok, config_path, V);
    }
    const int64_t Vt = target.tokenizer.vocab_size();

    // The map (and its report) for --init align.
    std::vector<int32_t> map;
    std::vector<AlignDecision> decisions;
    if (req.init == AlignInit::kAlign) {
        if (req.map.empty())
            return invalid_argument_error("--init align needs --map MAP.json (`lathe align map`)");
        LATHE_ASSIGN_OR_RETURN(map, align_read_map(req.map));
        if (int64_t(map.size()) != Vt) {
            return invalid_argument_error(
                "{} maps {} target ids but {} has {}: the map was made for another target "
                "tokenizer",
                req.map, map.size(), req.target_tokenizer, Vt);
        }
        for (size_t t = 0; t < map.size(); ++t) {
            if (map[t] >= Vs_tok) {
                return invalid_argument_error(
                    "{}: target id {} maps to source id {}, outside the source tokenizer's "
                    "{} ids ({})",
                    req.map, t, map[t], Vs_tok, source_tok_path);
            }
        }
        const std::string report = req.report.empty() ? align_report_path(req.map) : req.report;
        if (file_exists(report)) {
            LATHE_ASSIGN_OR_RETURN(decisions, align_read_report(report));
            if (int64_t(decisions.size()) != Vt) {
                return invalid_argument_error("{} has {} rows but the map has {} ids", report,
                                              decisions.size(), Vt);
            }
        } else if (!req.report.empty()) {
            return not_found_error("--report {}: no such file", req.report);
        } else {
            log_info("align apply: no report beside {}: every id is gathered through the map",
                     req.map);
        }
    }

    int64_t multiple = 1;
    if (req.pad_to_multiple) {
        if (*req.pad_to_multiple < 1)
            return invalid_argument_error("--pad-to-multiple must be >= 1");
        multiple = *req.pad_to_multiple;
    } else if (family.vocab_multiple > 1) {
        multiple = family.vocab_multiple;
    } else if (V > Vs_tok && V % kVocabPadMultiple == 0) {
        multiple = kVocabPadMultiple;
    }
    const int64_t Vnew = (Vt + multiple - 1) / multiple * multiple;

    // Source embedding and head (f32).
    const size_t emb_entry = table.find_entry(ParamRole::kTokenEmbedding);
    const size_t head_entry = table.find_entry(ParamRole::kLmHead);
    const std::string emb_name = table.entries()[emb_entry].name;
    const std::string head_name =
        head_entry == ParamTable::kNone ? "" : table.entries()[head_entry].name;
    LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* emb_t,
                           find_tensor(ckpt, emb_name, family.base_model_prefix));
    if (!emb_t)
        return invalid_argument_error("{}: no tensor {} (the token embedding)", src.dir, emb_name);
    if (emb_t->shape != std::vector<int64_t>{V, C}) {
        return invalid_argument_error("{}: {} has shape {}, config.json says [{}, {}]", src.dir,
                                      emb_name, emb_t->shape_string(), V, C);
    }
    LATHE_ASSIGN_OR_RETURN(std::vector<float> E, read_f32(*emb_t));
    std::vector<float> H;
    const SafetensorsTensor* head_t = nullptr;
    if (!head_name.empty()) {
        LATHE_ASSIGN_OR_RETURN(head_t, find_tensor(ckpt, head_name, family.base_model_prefix));
        if (!head_t)
            return invalid_argument_error("{}: no tensor {} (the untied output head)", src.dir,
                                          head_name);
        if (head_t->shape != std::vector<int64_t>{V, C}) {
            return invalid_argument_error("{}: {} has shape {}, expected [{}, {}]", src.dir,
                                          head_name, head_t->shape_string(), V, C);
        }
        LATHE_ASSIGN_OR_RETURN(H, read_f32(*head_t));
    }
    const bool untied = !head_name.empty();

    AlignApplyResult result;
    result.architecture = std::string(family.architecture);
    result.source_vocab = V;
    result.target_tokens = Vt;
    result.vocab_size = Vnew;
    result.tied = !untied;

    // Statistics over the rows of real source tokens (not the padding).
    const std::vector<float> mean_e = mean_row(E, Vs_tok, C);
    const std::vector<float> mean_h = untied ? mean_row(H, Vs_tok, C) : std::vector<float>{};
    std::vector<float> E2(size_t(Vnew * C)), H2(untied ? size_t(Vnew * C) : 0);
    std::mt19937_64 rng(req.seed);

    const auto set_mean = [&](int64_t t) {
        std::copy(mean_e.begin(), mean_e.end(), E2.begin() + t * C);
        if (untied) std::copy(mean_h.begin(), mean_h.end(), H2.begin() + t * C);
        ++result.mean_rows;
    };
    const auto gather = [&](int64_t t, int32_t s) {
        std::copy(E.begin() + int64_t(s) * C, E.begin() + int64_t(s + 1) * C, E2.begin() + t * C);
        if (untied)
            std::copy(H.begin() + int64_t(s) * C, H.begin() + int64_t(s + 1) * C,
                      H2.begin() + t * C);
        ++result.gathered;
    };
    const auto fvt = [&](int64_t t) {
        std::vector<int32_t> pieces = align_fvt_pieces(target, int32_t(t), source);
        pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                                    [&](int32_t p) { return p < 0 || p >= V; }),
                     pieces.end());
        if (pieces.empty()) {
            set_mean(t);
            return;
        }
        combine_rows(E2.data() + t * C, E, C, pieces, req.fvt_weighting, +1.0);
        if (untied) combine_rows(H2.data() + t * C, H, C, pieces, req.fvt_weighting, -1.0);
        ++result.fvt;
    };

    // Aligned (not gold) ids with a weight below 1: the gathered row mixed with the id's FVT row.
    // The FVT row is built first in place, then the source row is mixed in.
    const bool blend = req.align_weight < 1.0 || (untied && req.align_head_weight < 1.0);
    const auto blend_aligned = [&](int64_t t, int32_t s) {
        const int64_t fvt_before = result.fvt, mean_before = result.mean_rows;
        fvt(t);  // FVT rows (or the mean row for a token without pieces)
        result.fvt = fvt_before;
        result.mean_rows = mean_before;
        const auto mix = [&](std::vector<float>& dst, const std::vector<float>& src, double w) {
            float* d = dst.data() + t * C;
            const float* r = src.data() + int64_t(s) * C;
            for (int64_t c = 0; c < C; ++c)
                d[c] = float(w * double(r[c]) + (1.0 - w) * double(d[c]));
        };
        mix(E2, E, req.align_weight);
        if (untied) mix(H2, H, req.align_head_weight);
        ++result.blended;
    };

    switch (req.init) {
        case AlignInit::kAlign:
            for (int64_t t = 0; t < Vt; ++t) {
                const AlignDecision d =
                    decisions.empty() ? AlignDecision::kAligned : decisions[size_t(t)];
                if (d == AlignDecision::kGold || (d == AlignDecision::kAligned && !blend)) {
                    gather(t, map[size_t(t)]);
                } else if (d == AlignDecision::kAligned) {
                    blend_aligned(t, map[size_t(t)]);
                } else {
                    fvt(t);
                }
            }
            break;
        case AlignInit::kFvt:
            for (int64_t t = 0; t < Vt; ++t) {
                std::optional<std::string> s = target.tokenizer.id_to_token(int32_t(t));
                std::optional<int32_t> same = s ? source.tokenizer.token_to_id(*s) : std::nullopt;
                if (same && *same < V) {
                    gather(t, *same);
                } else {
                    fvt(t);
                }
            }
            break;
        case AlignInit::kMean: {
            const std::vector<float> sd_e = std_row(E, mean_e, Vs_tok, C);
            const std::vector<float> sd_h =
                untied ? std_row(H, mean_h, Vs_tok, C) : std::vector<float>{};
            std::normal_distribution<float> normal(0.0f, 1.0f);
            for (int64_t t = 0; t < Vt; ++t) {
                for (int64_t c = 0; c < C; ++c) {
                    E2[size_t(t * C + c)] =
                        mean_e[size_t(c)] + 0.01f * sd_e[size_t(c)] * normal(rng);
                    if (untied)
                        H2[size_t(t * C + c)] =
                            mean_h[size_t(c)] + 0.01f * sd_h[size_t(c)] * normal(rng);
                }
                ++result.mean_rows;
            }
            break;
        }
        case AlignInit::kRandom: {
            std::normal_distribution<float> normal(0.0f, float(cfg.initializer_range));
            for (int64_t t = 0; t < Vt; ++t) {
                for (int64_t c = 0; c < C; ++c) {
                    E2[size_t(t * C + c)] = normal(rng);
                    if (untied) H2[size_t(t * C + c)] = normal(rng);
                }
                ++result.random_rows;
            }
            break;
        }
    }
    for (int64_t t = Vt; t < Vnew; ++t) set_mean(t);

    // The output folder, staged beside it.
    LATHE_RETURN_IF_ERROR(output_folder_check(req.output, req.overwrite, "--output"));
    LATHE_ASSIGN_OR_RETURN(StagedFolder staged, StagedFolder::create(req.output));
    const fs::path staging(staged.path());

    // Tensors in the parameter table's order; the two new matrices in their stored dtype.
    const std::vector<uint8_t> emb_bytes = encode_as(E2, emb_t->dtype);
    const std::vector<uint8_t> head_bytes =
        untied ? encode_as(H2, head_t->dtype) : std::vector<uint8_t>{};
    std::vector<SafetensorsWriteTensor> tensors;
    for (const HfParam& p : table.hf_params()) {
        if (p.name == emb_name) {
            tensors.push_back(
                {p.name, emb_t->dtype, {Vnew, C}, emb_bytes.data(), emb_bytes.size()});
            continue;
        }
        if (untied && p.name == head_name) {
            tensors.push_back(
                {p.name, head_t->dtype, {Vnew, C}, head_bytes.data(), head_bytes.size()});
            continue;
        }
        LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* t,
                               find_tensor(ckpt, p.name, family.base_model_prefix));
        if (!t) return invalid_argument_error("{}: no tensor {}", src.dir, p.name);
        std::vector<int64_t> want;
        for (int i = 0; i < p.shape.rank(); ++i) want.push_back(p.shape[i]);
        if (t->shape != want) {
            return invalid_argument_error("{}: {} has shape {}, the config implies another",
                                          src.dir, p.name, t->shape_string());
        }
        tensors.push_back({p.name, t->dtype, t->shape, t->data, t->nbytes()});
    }
    SafetensorsCheckpointWriteOptions options;
    options.max_shard_bytes = 5'000'000'000ull;
    LATHE_RETURN_IF_ERROR(
        safetensors_write_checkpoint(staging.string(), tensors, options).status());

    HfModelConfig out_cfg = hf;
    out_cfg.vocab_size = Vnew;
    out_cfg.bos_token_id = translate_id(hf.bos_token_id, source, target);
    out_cfg.pad_token_id = translate_id(hf.pad_token_id, source, target);
    std::vector<int64_t> eos;
    for (int64_t id : hf.eos_token_ids) {
        if (auto t = translate_id(id, source, target)) eos.push_back(*t);
    }
    out_cfg.eos_token_ids = eos;
    // The model now speaks the target tokenizer: its special tokens define the ids (a source id
    // carried over by its spelling stays only where the target defines no such token).
    LATHE_ASSIGN_OR_RETURN(const TokenizerSpecialTokens specials,
                           tokenizer_special_tokens(target.tokenizer, req.target_tokenizer));
    for (const std::string& change : special_ids_apply(out_cfg, target.tokenizer, specials,
                                                       SpecialIdsMode::kFromTokenizerElseCarried))
        log_info("config.json: {} (the target tokenizer's, {})", change, specials.source);
    LATHE_RETURN_IF_ERROR(hf_config_save((staging / "config.json").string(), out_cfg));

    LATHE_ASSIGN_OR_RETURN(std::string tok_bytes, file_read_all(req.target_tokenizer));
    LATHE_RETURN_IF_ERROR(file_write_atomic((staging / "tokenizer.json").string(), tok_bytes));
    if (!specials.config_path.empty()) {  // the target's own, as it is
        LATHE_ASSIGN_OR_RETURN(std::string tc_bytes, file_read_all(specials.config_path));
        LATHE_RETURN_IF_ERROR(
            file_write_atomic((staging / "tokenizer_config.json").string(), tc_bytes));
    } else {
        LATHE_RETURN_IF_ERROR(file_write_atomic(
            (staging / "tokenizer_config.json").string(),
            special_tokens_tokenizer_config(specials, out_cfg.max_position_embeddings)));
    }

    LATHE_RETURN_IF_ERROR(staged.commit());
    result.output = req.output;
    return result;
}

std::string align_apply_result_json(const AlignApplyResult& r) {
    return fmt::format(
        "{{\"output\": {}, \"architecture\": \"{}\", \"source_vocab\": {}, \"target_tokens\": {}, "
        "\"vocab_size\": {}, \"tied\": {}, \"gathered\": {}, \"blended\": {}, \"fvt\": {}, "
        "\"mean_rows\": {}, \"random_rows\": {}}}",
        Json(r.output).dump(), r.architecture, r.source_vocab, r.target_tokens, r.vocab_size,
        r.tied, r.gathered, r.blended, r.fvt, r.mean_rows, r.random_rows);
}

}  // namespace lathe
