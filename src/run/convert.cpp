#include "run/convert.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/model_config.h"
#include "model/model_io.h"
#include "model/param_table.h"
#include "model/registry.h"
#include "optim/optimizer_state.h"
#include "run/carried_files.h"
#include "run/checkpoint_dir.h"
#include "run/special_tokens.h"
#include "run/trainer_state.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

using Json = nlohmann::json;

// transformers' max_shard_size before version 5 and huggingface_hub's default: shards of at
// most 5 GB are what the Hub and every loader handle comfortably (transformers 5 raised its own
// default to 50 GB; either loads the same).
constexpr uint64_t kDefaultHfShardBytes = 5'000'000'000ull;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kGenerationConfigFile = "generation_config.json";
constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";
constexpr const char* kTokenizerFile = "tokenizer.json";
// The lathe-only files of a checkpoint (run/trainer.cpp writes them; the trainer's
// `checkpoint.init_mode: continue` reads them with exactly these keys).

// Files carried from input to output byte for byte besides the tokenizer files
// (kHfTokenizerFiles, kHfChatTemplateFolder): the model card and license that belong with the
// weights.
constexpr std::string_view kModelCardFiles[] = {
    "README.md", "LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "USE_POLICY.md",
};

// Conversions smaller than this finish too fast for a progress line to say anything.
constexpr uint64_t kProgressMinBytes = 256ull << 20;

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

SafetensorsDtype safetensors_dtype_of(ConvertDtype d) {
    switch (d) {
        case ConvertDtype::kF32:
            return SafetensorsDtype::kF32;
        case ConvertDtype::kBF16:
            return SafetensorsDtype::kBF16;
        case ConvertDtype::kF16:
            return SafetensorsDtype::kF16;
    }
    return SafetensorsDtype::kF32;
}

bool is_float_weight_dtype(SafetensorsDtype d) {
    return d == SafetensorsDtype::kF32 || d == SafetensorsDtype::kBF16 ||
           d == SafetensorsDtype::kF16;
}

// The absolute, normalized form of a path, without a trailing separator.
fs::path normalized(const std::string& path) {
    fs::path p = fs::absolute(fs::path(path)).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p;
}

// `inner` equals `outer` or lies inside it (after resolving links where the paths exist).
bool path_within(const fs::path& inner, const fs::path& outer) {
    std::error_code ec;
    const fs::path a = fs::weakly_canonical(inner, ec);
    const fs::path b = fs::weakly_canonical(outer, ec);
    auto ai = a.begin();
    for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
        if (bi->empty()) continue;  // a trailing separator
        if (ai == a.end() || *ai != *bi) return false;
    }
    return true;
}

// One parameter tensor to write: where it comes from and what it becomes.
struct PlannedTensor {
    const HfParam* param = nullptr;
    const SafetensorsTensor* src = nullptr;
    SafetensorsDtype out = SafetensorsDtype::kF32;
    uint64_t out_bytes = 0;
};

// "[64, 128]", as SafetensorsTensor::shape_string writes a stored shape.
std::string shape_list(const Shape& shape) {
    std::string out = "[";
    for (int i = 0; i < shape.rank(); ++i) out += fmt::format("{}{}", i ? ", " : "", shape[i]);
    return out + "]";
}

std::string dims_hint(const ModelConfig& c) {
    return fmt::format(
        "vocab_size {}, hidden_size {}, intermediate_size {}, num_attention_heads {}, "
        "num_key_value_heads {}, head_dim {}",
        c.vocab_size, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim);
}

// The layer number in a tensor name: its first all-digit component ("model.layers.12.mlp..." and
// "h.12.attn..." -> 12), or -1.
int64_t layer_in_name(std::string_view name) {
    for (std::string_view part : split(name, '.')) {
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
        if (!part.empty() && ec == std::errc() && end == part.data() + part.size()) return value;
    }
    return -1;
}

// Matches the checkpoint's tensors against the parameter table (see the header comment for the
// rules). `dropped` receives the input tensors that are not written.
Result<std::vector<PlannedTensor>> plan_tensors(const ModelConfig& config, const ParamTable& table,
                                                const SafetensorsCheckpoint& ck,
                                                const std::string& where, SafetensorsDtype out,
                                                std::vector<std::string>& dropped) {
    const ModelFamily& family = model_family_of(config);
    const std::string arch(family.architecture);
    std::vector<PlannedTensor> planned;
    std::unordered_set<std::string> used;
    const SafetensorsTensor* embedding = nullptr;
    std::vector<std::string> param_names;
    for (const HfParam& p : table.hf_params()) param_names.push_back(p.name);

    for (const HfParam& p : table.hf_params()) {
        const ParamEntry& entry = table.entries()[p.entry];
        std::string name = p.name;
        const std::string_view prefix = family.base_model_prefix;
        if (!ck.contains(name) && !prefix.empty() && starts_with(name, prefix) &&
            ck.contains(name.substr(prefix.size())))
            name = name.substr(prefix.size());
        if (!ck.contains(name)) {
            if (entry.role == ParamRole::kLmHead) {
                const size_t emb = table.find_entry(ParamRole::kTokenEmbedding);
                return invalid_argument_error(
                    "{}: tensor '{}' (the LM head, shape {}) is missing, but config.json says "
                    "tie_word_embeddings false (an untied head); if this model's head is its "
                    "token embedding '{}', set \"tie_word_embeddings\": true in config.json",
                    where, p.name, shape_list(p.shape),
                    emb == ParamTable::kNone ? std::string("?") : table.entries()[emb].name);
            }
            // A whole layer missing usually means config.json's depth is not the checkpoint's.
            int64_t deepest = -1;
            for (const std::string& n : ck.names()) deepest = std::max(deepest, layer_in_name(n));
            std::string hint;
            if (entry.layer > deepest)
                hint = fmt::format(
                    " (config.json's num_hidden_layers is {}, but the checkpoint's layers end "
                    "at {})",
                    config.num_layers, deepest);
            return invalid_argument_error(
                "{}: tensor '{}' is missing: a {} with this config.json needs it, shape {}{}{}",
                where, p.name, arch, shape_list(p.shape), hint,
                hint.empty() ? did_you_mean(p.name, ck.names()) : std::string());
        }
        LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* t, ck.tensor(name));
        bool shape_ok = int(t->shape.size()) == p.shape.rank();
        for (int i = 0; shape_ok && i < p.shape.rank(); ++i)
            shape_ok = t->shape[size_t(i)] == p.shape[i];
        if (!shape_ok)
            return invalid_argument_error(
                "{}: tensor '{}' has shape {}, but config.json implies {} for it ({}); the "
                "weights and config.json do not belong together",
                where, name, t->shape_string(), shape_list(p.shape), dims_hint(config));
        if (!is_float_weight_dtype(t->dtype))
            return invalid_argument_error(
                "{}: tensor '{}' is {}; lathe converts F32, BF16 and F16 weights (quantized or "
                "integer checkpoints must be dequantized first)",
                where, name, safetensors_dtype_name(t->dtype));
        used.insert(name);
        if (entry.role == ParamRole::kTokenEmbedding) embedding = t;
        PlannedTensor pt;
        pt.param = &p;
        pt.src = t;
        pt.out = out;
        pt.out_bytes = t->numel() * uint64_t(safetensors_dtype_bits(out) / 8);
        planned.push_back(pt);
    }

    // What the untied variant of this model calls its head, for tied checkpoints that carry one.
    std::string untied_head;
    if (config.tie_word_embeddings) {
        ModelConfig untied = config;
        untied.tie_word_embeddings = false;
        const ParamTable t = model_param_table(untied);
        const size_t e = t.find_entry(ParamRole::kLmHead);
        if (e != ParamTable::kNone) untied_head = t.entries()[e].name;
    }

    std::vector<std::string> extra;
    for (const std::string& name : ck.names()) {
        if (used.count(name)) continue;
        bool buffer = false;
        for (std::string_view suffix : family.ignored_suffixes) buffer |= ends_with(name, suffix);
        if (buffer) {
            dropped.push_back(name);
            continue;
        }
        if (!untied_head.empty() && name == untied_head && embedding != nullptr) {
            LATHE_ASSIGN_OR_RETURN(const SafetensorsTensor* head, ck.tensor(name));
            LATHE_RETURN_IF_ERROR(check_tied_head(*head, *embedding, where));
            dropped.push_back(name);
            continue;
        }
        extra.push_back(name);
    }
    if (!extra.empty()) {
        const std::string& name = extra.front();
        std::string hint;
        const int64_t layer = layer_in_name(name);
        if (layer >= config.num_layers)
            hint = fmt::format(" (layer {}, but config.json's num_hidden_layers is {})", layer,
                               config.num_layers);
        else if (ends_with(name, ".bias"))
            hint = " (config.json turns this bias off: see attention_bias / mlp_bias)";
        else
            hint = did_you_mean(name, param_names);
        std::string more;
        if (extra.size() > 1) {
            more = fmt::format("; {} unexpected tensors in all: ", extra.size());
            for (size_t i = 0; i < extra.size() && i < 6; ++i)
                more += fmt::format("{}{}", i ? ", " : "", extra[i]);
            if (extra.size() > 6) more += ", ...";
        }
        return invalid_argument_error(
            "{}: tensor '{}' is not a parameter of a {} with this config.json{}{}; lathe would "
            "have to drop it, so the config and weights do not match",
            where, name, arch, hint, more);
    }
    return planned;
}

// huggingface_hub's split (the rule safetensors_write_checkpoint applies; a test checks that the
// two agree byte for byte): walk in order; a tensor over the limit gets a shard of its own at
// once; otherwise the current shard closes when this tensor would tip it over the limit.
std::vector<std::vector<size_t>> plan_shards(const std::vector<PlannedTensor>& tensors,
                                             uint64_t limit) {
    std::vector<std::vector<size_t>> shards;
    std::vector<size_t> current;
    uint64_t current_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const uint64_t n = tensors[i].out_bytes;
        if (limit > 0 && n > limit) {
            shards.push_back({i});
            continue;
        }
        if (limit > 0 && current_bytes + n > limit && !current.empty()) {
            shards.push_back(std::move(current));
            current.clear();
            current_bytes = 0;
        }
        current.push_back(i);
        current_bytes += n;
    }
    if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
    return shards;
}

// Writes the planned tensors into `staging` as model.safetensors, or as shards plus the index,
// converting one shard's tensors at a time. Tensors already in the output dtype are written
// straight from the input's memory map.
Status write_weights(const StagedFolder& staging, const std::vector<PlannedTensor>& tensors,
                     uint64_t limit, ConvertResult& result) {
    const std::vector<std::vector<size_t>> shards = plan_shards(tensors, limit);
    uint64_t total = 0;
    for (const PlannedTensor& t : tensors) total += t.out_bytes;
    // A progress line only where a conversion takes a noticeable while, and not under --quiet.
    std::optional<Progress> progress;
    if (total >= kProgressMinBytes && log_level() <= LogLevel::kInfo)
        progress.emplace("convert", total, "tensors");
    Json weight_map = Json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file =
            shards.size() == 1
                ? std::string(kSafetensorsSingleFileName)
                : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
        std::vector<std::unique_ptr<uint8_t[]>> buffers;
        std::vector<SafetensorsWriteTensor> writes;
        uint64_t shard_bytes = 0;
        for (size_t i : shards[s]) {
            const PlannedTensor& t = tensors[i];
            SafetensorsWriteTensor w;
            w.name = t.param->name;
            w.dtype = t.out;
            w.shape = t.src->shape;
            w.nbytes = t.out_bytes;
            if (t.src->dtype == t.out) {
                w.data = t.src->data;
            } else {
                buffers.emplace_back(new uint8_t[std::max<uint64_t>(t.out_bytes, 1)]);
                LATHE_CHECK(safetensors_convert_elements(*t.src, 0, t.src->numel(), t.out,
                                                         buffers.back().get()),
                            "{}: {} is not a float weight", t.src->name,
                            safetensors_dtype_name(t.src->dtype));
                w.data = buffers.back().get();
            }
            writes.push_back(std::move(w));
            weight_map[t.param->name] = file;
            shard_bytes += t.out_bytes;
        }
        LATHE_RETURN_IF_ERROR(
            safetensors_write_file(staging.file(file), writes, safetensors_default_metadata()));
        result.weight_files.push_back(file);
        if (progress) progress->add(shard_bytes, writes.size());
    }
    if (progress) progress->finish();
    result.weight_bytes = total;
    if (shards.size() > 1) {
        const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
        // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
        LATHE_RETURN_IF_ERROR(file_write_atomic(staging.file(kSafetensorsIndexFileName),
                                                index.dump(2, ' ', true) + "\n"));
        result.weight_files.push_back(std::string(kSafetensorsIndexFileName));
    }
    return ok_status();
}

// generation_config.json as transformers' GenerationConfig.from_model_config makes it from the
// model config's special token ids (without the version stamp, which is transformers' own).
// Empty when config.json names no such id: there is nothing sensible to write then.
std::string generation_config_from(const HfModelConfig& hf) {
    if (!hf.bos_token_id && hf.eos_token_ids.empty() && !hf.pad_token_id) return "";
    Json j = Json::object();
    j["_from_model_config"] = true;
    if (hf.bos_token_id) j["bos_token_id"] = *hf.bos_token_id;
    if (hf.eos_token_ids.size() == 1 && !hf.eos_token_id_is_list)
        j["eos_token_id"] = hf.eos_token_ids[0];
    else if (!hf.eos_token_ids.empty())
        j["eos_token_id"] = hf.eos_token_ids;
    if (hf.pad_token_id) j["pad_token_id"] = *hf.pad_token_id;
    return j.dump(2) + "\n";
}

// The special tokens of the tokenizer in `dir`, with `hf`'s ids reconciled with them
// (SpecialIdsMode::kKeepValid: ids that name no special token of the tokenizer, such as
// transformers' class defaults written for a tokenizer that lacks them there, are replaced),
// each change logged as a warning. nullopt when there is no tokenizer.json or lathe cannot read
// it (with a warning).
std::optional<TokenizerSpecialTokens> reconcile_special_ids(const std::string& dir,
                                                            HfModelConfig& hf) {
    const std::string path = (fs::path(dir) / kTokenizerFile).string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return std::nullopt;
    // The tokenizer is carried as it is whether or not lathe reads it (lathe encodes BPE models
    // only): one it cannot read leaves the ids unchecked.
    Result<Tokenizer> tokenizer = Tokenizer::load(path);
    Result<TokenizerSpecialTokens> found =
        tokenizer.ok() ? tokenizer_special_tokens(*tokenizer, path) : tokenizer.status();
    if (!found.ok()) {
        log_warning(
            "{}: special token ids of config.json not checked against the tokenizer, and no "
            "tokenizer_config.json made for it: {}",
            dir, found.status().message());
        return std::nullopt;
    }
    TokenizerSpecialTokens specials = std::move(found).value();
    for (const std::string& change :
         special_ids_apply(hf, *tokenizer, specials, SpecialIdsMode::kKeepValid))
        log_warning("{}/config.json: {} (an id names a special token of {})", dir, change,
                    specials.source);
    return specials;
}

// Copies the carried files (kHfTokenizerFiles, kModelCardFiles, kHfChatTemplateFolder) that
// exist in `from`.
Status copy_carried_files(const std::string& from, const StagedFolder& staging,
                          std::vector<std::string>& copied) {
    std::vector<std::string_view> names(std::begin(kHfTokenizerFiles), std::end(kHfTokenizerFiles));
    names.insert(names.end(), std::begin(kModelCardFiles), std::end(kModelCardFiles));
    LATHE_ASSIGN_OR_RETURN(const std::vector<CarriedFile> files, carried_files_read(from, names));
    LATHE_RETURN_IF_ERROR(carried_files_write(files, staging.path()));
    for (std::string& name : carried_file_names(files)) copied.push_back(std::move(name));
    return ok_status();
}

// optimizer.safetensors with zero AdamW moments for `table`'s arena layout (padding included, as
// the trainer allocates them), and trainer_state.json at step 0, with the keys the trainer's
// `continue` mode reads.
Status write_fresh_training_state(const StagedFolder& staging, const ParamTable& table,
                                  const ConvertSource& source,
                                  const std::vector<std::string>& input_dtypes) {
    LATHE_RETURN_IF_ERROR(optimizer_state_write_zeros(
        staging.file(kOptimizerStateFile), table.layout().total_bytes() / sizeof(float)));
    Json j = trainer_state_to_json(TrainerState{});
    j["converted_from"] = {{"path", normalized(source.dir).string()},
                           {"format", std::string(checkpoint_format_name(source.format))},
                           {"dtypes", input_dtypes}};
    return file_write_atomic(staging.file(kTrainerStateFile), j.dump(2) + "\n");
}

}  // namespace

std::string_view checkpoint_format_name(CheckpointFormat format) {
    return format == CheckpointFormat::kHf ? "hf" : "lathe";
}

std::string_view convert_dtype_name(ConvertDtype dtype) {
    switch (dtype) {
        case ConvertDtype::kF32:
            return "fp32";
        case ConvertDtype::kBF16:
            return "bf16";
        case ConvertDtype::kF16:
            return "fp16";
    }
    return "?";
}

std::string_view convert_dtype_torch_name(ConvertDtype dtype) {
    switch (dtype) {
        case ConvertDtype::kF32:
            return "float32";
        case ConvertDtype::kBF16:
            return "bfloat16";
        case ConvertDtype::kF16:
            return "float16";
    }
    return "?";
}

Result<ConvertDtype> convert_parse_dtype(std::string_view text) {
    const std::string t = lower(text);
    if (t == "fp32" || t == "f32" || t == "float32") return ConvertDtype::kF32;
    if (t == "bf16" || t == "bfloat16") return ConvertDtype::kBF16;
    if (t == "fp16" || t == "f16" || t == "float16") return ConvertDtype::kF16;
    return invalid_argument_error("--dtype '{}': choose fp32, bf16 or fp16",
                                  escape_for_message(text));
}

Result<uint64_t> convert_parse_size(std::string_view text) {
    const std::string_view t = trim(text);
    auto bad = [&] {
        return invalid_argument_error(
            "--max-shard-size '{}': expected a byte count or a number with a unit, e.g. 5GB, "
            "500MB, 2GiB (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024; 0 = no limit)",
            escape_for_message(text));
    };
    size_t digits = 0;
    while (digits < t.size() &&
           (std::isdigit(static_cast<unsigned char>(t[digits])) || t[digits] == '.'))
        ++digits;
    if (digits == 0) return bad();
    double number = 0.0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + digits, number);
    if (ec != std::errc() || end != t.data() + digits) return bad();
    const std::string unit = lower(trim(t.substr(digits)));
    static const std::map<std::string, double> kUnits = {
        {"", 1.0},
        {"b", 1.0},
        {"kb", 1e3},
        {"mb", 1e6},
        {"gb", 1e9},
        {"tb", 1e12},
        {"kib", 1024.0},
        {"mib", 1048576.0},
        {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    const auto it = kUnits.find(unit);
    if (it == kUnits.end()) return bad();
    const double bytes = number * it->second;
    if (!std::isfinite(bytes) || bytes >= 1.8e19) return bad();
    if (unit.empty() && number != std::floor(number)) return bad();
    return uint64_t(std::llround(bytes));
}

Result<ConvertSource> convert_find_source(const std::string& input) {
    std::error_code ec;
    ConvertSource src;
    src.given = input;
    LATHE_ASSIGN_OR_RETURN(const fs::path dir, resolve_checkpoint(input));
    src.dir = dir.string();
    const bool single = fs::is_regular_file(dir / kSafetensorsSingleFileName, ec);
    const bool index = fs::is_regular_file(dir / kSafetensorsIndexFileName, ec);
    if (!single && !index) {
        for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json",
                                  "model.ckpt.index", "flax_model.msgpack"}) {
            if (fs::exists(dir / other, ec))
                return invalid_argument_error(
                    "{}: the weights are in {}, which lathe does not read; save them as "
                    "safetensors first (transformers: model.save_pretrained(dir), which writes "
                    "safetensors by default)",
                    src.dir, other);
        }
        return not_found_error("{}: config.json but no {} and no {}: no weights to convert",
                               src.dir, kSafetensorsSingleFileName, kSafetensorsIndexFileName);
    }
    src.format =
        fs::exists(dir / kTrainerStateFile, ec) || fs::exists(dir / kOptimizerStateFile, ec)
            ? CheckpointFormat::kLathe
            : CheckpointFormat::kHf;
    return src;
}

Result<ConvertResult> convert_run(const ConvertRequest& request) {
    if (request.input.empty()) return invalid_argument_error("INPUT_DIR is required");
    if (request.output.empty()) return invalid_argument_error("OUTPUT_DIR is required");
    LATHE_ASSIGN_OR_RETURN(ConvertSource source, convert_find_source(request.input));
    if (source.format == CheckpointFormat::kLathe && request.to == CheckpointFormat::kLathe)
        return invalid_argument_error(
            "{} is already a lathe checkpoint; copy the folder, or convert --to hf", source.dir);
    const ConvertDtype dtype = request.dtype.value_or(
        request.to == CheckpointFormat::kHf ? ConvertDtype::kBF16 : ConvertDtype::kF32);
    if (request.to == CheckpointFormat::kLathe && dtype != ConvertDtype::kF32)
        return invalid_argument_error(
            "--dtype {} with --to lathe: a lathe checkpoint holds the fp32 master weights the "
            "trainer updates; leave --dtype out (or use --to hf for {} weights)",
            convert_dtype_name(dtype), convert_dtype_name(dtype));
    const uint64_t limit = request.max_shard_bytes.value_or(
        request.to == CheckpointFormat::kHf ? kDefaultHfShardBytes : 0);
    const fs::path out = normalized(request.output);
    if (path_within(out, normalized(source.dir)) || path_within(normalized(source.dir), out) ||
        path_within(normalized(request.input), out))
        return invalid_argument_error(
            "OUTPUT_DIR {} overlaps the input {}; write the conversion to a folder of its own",
            out.string(), source.dir);

    // The model, from config.json through the registry: unknown architectures stop here.
    const std::string config_path = (fs::path(source.dir) / kConfigFile).string();
    LATHE_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_hf_file(config_path));
    auto ck = SafetensorsCheckpoint::open(source.dir);
    if (!ck.ok()) return ck.status();
    const std::string where =
        !ck->index_path().empty() ? ck->index_path() : ck->shard_paths().front();
    // A depth beyond the checkpoint's layers, refused before the parameter table of that depth
    // is built (ten million layers took 43 s and 5.7 GB before the missing tensor was named).
    int64_t deepest = -1;
    std::string deepest_name;
    for (const std::string& n : ck->names()) {
        if (layer_in_name(n) > deepest) {
            deepest = layer_in_name(n);
            deepest_name = n;
        }
    }
    if (deepest >= 0 && config.num_layers > deepest + 1) {
        // The next layer's names: the deepest layer's prefix with the number after it.
        const std::string number = std::to_string(deepest);
        const size_t at = deepest_name.find("." + number + ".");
        const std::string next =
            at == std::string::npos
                ? std::string()
                : fmt::format(" ('{}.{}.*')", deepest_name.substr(0, at), deepest + 1);
        return invalid_argument_error(
            "{}: the tensors of layer {}{} are missing: config.json's num_hidden_layers is {}, "
            "but the checkpoint's layers end at {}; the weights and config.json do not belong "
            "together",
            where, deepest + 1, next, config.num_layers, deepest);
    }
    const ParamTable table = model_param_table(config);

    ConvertResult result;
    result.source = source;
    result.output = out.string();
    result.to = request.to;
    result.dtype = dtype;
    result.architecture = std::string(model_family_of(config).architecture);
    LATHE_ASSIGN_OR_RETURN(
        std::vector<PlannedTensor> tensors,
        plan_tensors(config, table, *ck, where, safetensors_dtype_of(dtype), result.dropped));
    std::set<std::string> dtypes;
    for (const PlannedTensor& t : tensors) {
        dtypes.insert(std::string(safetensors_dtype_name(t.src->dtype)));
        result.parameters += int64_t(t.src->numel());
    }
    result.tensors = int64_t(tensors.size());
    result.input_dtypes.assign(dtypes.begin(), dtypes.end());
    log_info("{}: {} checkpoint, {} {} tensors ({}), {} parameters{}", source.dir,
             checkpoint_format_name(source.format), result.tensors, result.architecture,
             fmt::join(result.input_dtypes, "/"), result.parameters,
             result.dropped.empty()
                 ? std::string()
                 : fmt::format("; not carried: {}", fmt::join(result.dropped, ", ")));

    LATHE_RETURN_IF_ERROR(output_folder_check(out.string(), request.overwrite, "OUTPUT_DIR"));
    LATHE_ASSIGN_OR_RETURN(StagedFolder staging, StagedFolder::create(out.string()));
    LATHE_RETURN_IF_ERROR(write_weights(staging, tensors, limit, result));

    HfModelConfig hf = config.hf;
    hf.torch_dtype = std::string(convert_dtype_torch_name(dtype));
    const std::optional<TokenizerSpecialTokens> specials = reconcile_special_ids(source.dir, hf);
    LATHE_RETURN_IF_ERROR(hf_config_save(staging.file(kConfigFile), hf));
    result.other_files.push_back(kConfigFile);
    LATHE_RETURN_IF_ERROR(copy_carried_files(source.dir, staging, result.other_files));
    const bool has_tokenizer = std::find(result.other_files.begin(), result.other_files.end(),
                                         "tokenizer.json") != result.other_files.end();
    if (has_tokenizer && specials &&
        std::find(result.other_files.begin(), result.other_files.end(), kTokenizerConfigFile) ==
            result.other_files.end()) {
        // Without it transformers' AutoTokenizer knows no eos/bos/pad token.
        LATHE_RETURN_IF_ERROR(file_write_atomic(
            staging.file(kTokenizerConfigFile),
            special_tokens_tokenizer_config(*specials, hf.max_position_embeddings)));
        result.other_files.push_back(kTokenizerConfigFile);
    }
    if (!has_tokenizer)
        log_warning("{} has no tokenizer.json; the output has weights but no tokenizer ({})",
                    source.dir,
                    request.to == CheckpointFormat::kHf
                        ? "transformers' AutoTokenizer will not load it"
                        : "lathe train needs data.tokenizer from elsewhere");
    if (request.to == CheckpointFormat::kHf &&
        std::find(result.other_files.begin(), result.other_files.end(), kGenerationConfigFile) ==
            result.other_files.end()) {
        const std::string gen = generation_config_from(hf);
        if (!gen.empty()) {
            LATHE_RETURN_IF_ERROR(file_write_atomic(staging.file(kGenerationConfigFile), gen));
            result.other_files.push_back(kGenerationConfigFile);
        }
    }
    if (request.to == CheckpointFormat::kLathe) {
        LATHE_RETURN_IF_ERROR(
            write_fresh_training_state(staging, table, source, result.input_dtypes));
        result.other_files.push_back(kOptimizerStateFile);
        result.other_files.push_back(kTrainerStateFile);
    }
    LATHE_RETURN_IF_ERROR(staging.commit());
    log_info("wrote {} ({} checkpoint, {}, {} in {} weight file{})", result.output,
             checkpoint_format_name(request.to), convert_dtype_name(dtype),
             Progress::format_bytes(double(result.weight_bytes)), result.weight_files.size(),
             result.weight_files.size() == 1 ? "" : "s");
    return result;
}

std::string convert_result_json(const ConvertResult& r) {
    nlohmann::ordered_json j;
    j["input"] = r.source.dir;
    j["input_format"] = std::string(checkpoint_format_name(r.source.format));
    j["input_dtypes"] = r.input_dtypes;
    j["output"] = r.output;
    j["format"] = std::string(checkpoint_format_name(r.to));
    j["dtype"] = std::string(convert_dtype_name(r.dtype));
    j["architecture"] = r.architecture;
    j["tensors"] = r.tensors;
    j["parameters"] = r.parameters;
    j["weight_bytes"] = r.weight_bytes;
    j["weight_files"] = r.weight_files;
    j["other_files"] = r.other_files;
    j["dropped"] = r.dropped;
    return j.dump();
}

}  // namespace lathe
