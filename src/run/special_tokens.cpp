#include "run/special_tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/strings.h"
#include "data/prepare.h"
#include "io/file.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

using Json = nlohmann::json;

// GPT-NeoX's (and GPT-2's) document-end token; see prepare_resolve_eod.
constexpr const char* kEndOfText = "<|endoftext|>";

// A token entry of tokenizer_config.json: a string, an AddedToken object {"content": ...}, or
// null / absent (nullopt). Errors: another kind of value, naming the file and key.
Result<std::optional<std::string>> config_token(const Json& config, const char* key,
                                                const std::string& path) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return std::optional<std::string>();
    if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
    if (it->is_object()) {
        const auto c = it->find("content");
        if (c != it->end() && c->is_string())
            return std::optional<std::string>(c->get<std::string>());
    }
    return invalid_argument_error(
        "{}: '{}' must be a token (a string or an AddedToken object with a string 'content'), "
        "null, or left out",
        path, key);
}

std::optional<SpecialToken> lookup(const Tokenizer& tokenizer, const std::string& content) {
    const std::optional<int32_t> id = tokenizer.token_to_id(content);
    if (!id) return std::nullopt;
    return SpecialToken{content, *id};
}

std::optional<SpecialToken> token_of_id(const Tokenizer& tokenizer, int32_t id) {
    std::optional<std::string> content = tokenizer.id_to_token(id);
    if (!content) return std::nullopt;
    return SpecialToken{std::move(*content), id};
}

// The special tokens the post-processor puts before and after a text (a BOS / EOS template).
Status post_processor_tokens(const Tokenizer& tokenizer, std::optional<SpecialToken>* before,
                             std::optional<SpecialToken>* after) {
    constexpr std::string_view kProbe = "a";
    LATHE_ASSIGN_OR_RETURN(const std::vector<int32_t> plain, tokenizer.encode(kProbe, false));
    LATHE_ASSIGN_OR_RETURN(const std::vector<int32_t> with, tokenizer.encode(kProbe, true));
    if (with.size() <= plain.size() || plain.empty()) return ok_status();
    const auto at = std::search(with.begin(), with.end(), plain.begin(), plain.end());
    if (at == with.end()) return ok_status();
    if (at != with.begin() && tokenizer.is_special(with.front()))
        *before = token_of_id(tokenizer, with.front());
    const auto tail = at + std::ptrdiff_t(plain.size());
    if (tail != with.end() && tokenizer.is_special(with.back()))
        *after = token_of_id(tokenizer, with.back());
    return ok_status();
}

// tokenizer.json's model.unk_token, when set and in the vocabulary.
Result<std::optional<SpecialToken>> model_unk_token(const Tokenizer& tokenizer,
                                                    const std::string& tokenizer_path) {
    LATHE_ASSIGN_OR_RETURN(const std::string text, file_read_all(tokenizer_path));
    const Json j = json_parse<Json>(text);
    if (j.is_discarded() || !j.is_object())
        return invalid_argument_error("{}: not a JSON object (expected a tokenizer.json)",
                                      tokenizer_path);
    const auto model = j.find("model");
    if (model == j.end() || !model->is_object()) return std::optional<SpecialToken>();
    const auto unk = model->find("unk_token");
    if (unk == model->end() || !unk->is_string()) return std::optional<SpecialToken>();
    return lookup(tokenizer, unk->get<std::string>());
}

std::string describe(const Tokenizer& tokenizer, int64_t id) {
    std::optional<std::string> t;
    if (id >= 0 && id < tokenizer.vocab_size()) t = tokenizer.id_to_token(int32_t(id));
    return t ? fmt::format("{} ('{}')", id, escape_for_message(*t))
             : fmt::format("{} (no token)", id);
}

// `id` names a special (added, special) token of the tokenizer, or one of the tokens its
// tokenizer_config.json names (which need not be added tokens).
bool names_special(const Tokenizer& tokenizer, const TokenizerSpecialTokens& specials, int64_t id) {
    for (const auto* t : {&specials.bos, &specials.eos, &specials.pad, &specials.unk})
        if (*t && (*t)->id == id) return true;
    return id >= 0 && id < tokenizer.vocab_size() && tokenizer.is_special(int32_t(id)) &&
           tokenizer.id_to_token(int32_t(id)).has_value();
}

std::string ids_text(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
    if (ids.empty()) return "none";
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) out += ", ";
        out += describe(tokenizer, ids[i]);
    }
    return ids.size() == 1 ? out : "[" + out + "]";
}

// One id key (bos or pad) of the config, set as `mode` says.
void apply_one(const char* key, std::optional<int64_t>& id, const std::optional<SpecialToken>& tok,
               const Tokenizer& tokenizer, const TokenizerSpecialTokens& specials,
               SpecialIdsMode mode, std::vector<std::string>& changes) {
    std::optional<int64_t> want = id;
    const bool valid = id && names_special(tokenizer, specials, *id);
    if (mode == SpecialIdsMode::kFromTokenizer) {
        want = tok ? std::optional<int64_t>(tok->id) : (valid ? id : std::nullopt);
    } else if (mode == SpecialIdsMode::kFromTokenizerElseCarried) {
        if (tok) want = tok->id;
    } else if (id && !valid) {
        want = tok ? std::optional<int64_t>(tok->id) : std::nullopt;
    }
    if (want == id) return;
    changes.push_back(fmt::format("{} {} -> {}", key, id ? describe(tokenizer, *id) : "none",
                                  want ? describe(tokenizer, *want) : "none"));
    id = want;
}

}  // namespace

Result<TokenizerSpecialTokens> tokenizer_special_tokens(const Tokenizer& tokenizer,
                                                        const std::string& tokenizer_path) {
    TokenizerSpecialTokens out;
    const std::optional<std::string> config_path = prepare_find_tokenizer_config(tokenizer_path);
    if (config_path) {
        LATHE_ASSIGN_OR_RETURN(const std::string text, file_read_all(*config_path));
        const Json config = json_parse<Json>(text);
        if (config.is_discarded() || !config.is_object())
            return invalid_argument_error(
                "{}: not a JSON object (expected the tokenizer_config.json of {})", *config_path,
                tokenizer_path);
        out.config_path = *config_path;
        out.source = *config_path;
        const std::pair<const char*, std::optional<SpecialToken>*> keys[] = {
            {"bos_token", &out.bos},
            {"eos_token", &out.eos},
            {"pad_token", &out.pad},
            {"unk_token", &out.unk}};
        for (const auto& [key, slot] : keys) {
            LATHE_ASSIGN_OR_RETURN(const std::optional<std::string> content,
                                   config_token(config, key, *config_path));
            if (!content) continue;
            *slot = lookup(tokenizer, *content);
            if (!*slot)
                log_warning("{}: {} '{}' is not in the vocabulary of {}; it is left out",
                            *config_path, key, escape_for_message(*content), tokenizer_path);
        }
        return out;
    }
    out.source = tokenizer_path;
    std::optional<SpecialToken> before, after;
    LATHE_RETURN_IF_ERROR(post_processor_tokens(tokenizer, &before, &after));
    const std::optional<SpecialToken> end_of_text = lookup(tokenizer, kEndOfText);
    out.eos = end_of_text ? end_of_text : after;
    out.bos = before ? before : end_of_text;
    LATHE_ASSIGN_OR_RETURN(out.unk, model_unk_token(tokenizer, tokenizer_path));
    return out;
}

std::vector<std::string> special_ids_apply(HfModelConfig& hf, const Tokenizer& tokenizer,
                                           const TokenizerSpecialTokens& specials,
                                           SpecialIdsMode mode) {
    std::vector<std::string> changes;
    apply_one("bos_token_id", hf.bos_token_id, specials.bos, tokenizer, specials, mode, changes);
    apply_one("pad_token_id", hf.pad_token_id, specials.pad, tokenizer, specials, mode, changes);

    const std::vector<int64_t>& eos = hf.eos_token_ids;
    const bool all_valid = !eos.empty() && std::all_of(eos.begin(), eos.end(), [&](int64_t id) {
        return names_special(tokenizer, specials, id);
    });
    std::vector<int64_t> want = eos;
    if (mode == SpecialIdsMode::kFromTokenizer) {
        if (specials.eos)
            want = {specials.eos->id};
        else if (!all_valid)
            want.clear();
    } else if (mode == SpecialIdsMode::kFromTokenizerElseCarried) {
        if (specials.eos) want = {specials.eos->id};
    } else if (!eos.empty() && !all_valid) {
        want.clear();
        if (specials.eos) want = {specials.eos->id};
    }
    if (want != eos) {
        changes.push_back(fmt::format("eos_token_id {} -> {}", ids_text(tokenizer, eos),
                                      ids_text(tokenizer, want)));
        hf.eos_token_ids = want;
        hf.eos_token_id_is_list = false;
    }
    return changes;
}

std::string special_tokens_tokenizer_config(const TokenizerSpecialTokens& specials,
                                            int64_t model_max_length) {
    Json j = Json::object();
    j["tokenizer_class"] = "PreTrainedTokenizerFast";
    j["clean_up_tokenization_spaces"] = false;
    j["model_max_length"] = model_max_length;
    const std::pair<const char*, const std::optional<SpecialToken>*> keys[] = {
        {"bos_token", &specials.bos},
        {"eos_token", &specials.eos},
        {"pad_token", &specials.pad},
        {"unk_token", &specials.unk}};
    for (const auto& [key, tok] : keys) j[key] = *tok ? Json((*tok)->content) : Json(nullptr);
    return j.dump(2) + "\n";  // nlohmann::json sorts keys
}

Result<bool> special_tokens_write_tokenizer_config(const std::string& dir) {
    const fs::path folder(dir);
    const std::string tokenizer_path = (folder / "tokenizer.json").string();
    if (file_exists((folder / "tokenizer_config.json").string()) || !file_exists(tokenizer_path))
        return false;
    LATHE_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
    LATHE_ASSIGN_OR_RETURN(const TokenizerSpecialTokens specials,
                           tokenizer_special_tokens(tokenizer, tokenizer_path));
    LATHE_ASSIGN_OR_RETURN(const HfModelConfig hf, hf_config_load(dir));
    LATHE_RETURN_IF_ERROR(
        file_write_atomic((folder / "tokenizer_config.json").string(),
                          special_tokens_tokenizer_config(specials, hf.max_position_embeddings)));
    return true;
}

}  // namespace lathe
