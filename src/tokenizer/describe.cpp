#include "tokenizer/describe.h"

#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/file.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

std::string describe_component(const nlohmann::json& node);

std::string describe_list(const nlohmann::json& list) {
    std::string out = "[";
    for (size_t i = 0; i < list.size(); ++i) {
        if (i) out += ", ";
        out += describe_component(list[i]);
    }
    return out + "]";
}

// One line for a normalizer / pre-tokenizer / post-processor / decoder node: its type, the
// settings that change behaviour, and nested components for Sequence.
std::string describe_component(const nlohmann::json& node) {
    if (node.is_null()) return "none";
    if (!node.is_object() || !node.contains("type")) return node.dump();
    std::string out = node["type"].is_string() ? node["type"].get<std::string>() : "?";
    std::vector<std::string> settings;
    for (const auto& [key, value] : node.items()) {
        if (key == "type") continue;
        if (value.is_array() && !value.empty() && value[0].is_object() &&
            value[0].contains("type")) {
            out += describe_list(value);
            continue;
        }
        std::string v = value.dump();
        if (v.size() > 60) v = v.substr(0, 57) + "...";
        settings.push_back(key + "=" + v);
    }
    if (!settings.empty()) {
        out += "(";
        for (size_t i = 0; i < settings.size(); ++i) out += (i ? ", " : "") + settings[i];
        out += ")";
    }
    return out;
}

}  // namespace

Result<std::string> tokenizer_describe(const std::string& path) {
    // A file of the wrong kind (a directory, JSON Lines, YAML, a config.json...) gets the
    // tokenizer loader's message, which says what the file holds.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        LATHE_RETURN_IF_ERROR(Tokenizer::load(path).status());
        return std::string();
    }
    LATHE_ASSIGN_OR_RETURN(const std::string text, file_read_all(path));
    nlohmann::json j = json_parse<nlohmann::json>(text);
    if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_object()) {
        const Status s = Tokenizer::from_json(text, path).status();
        if (!s.ok()) return s;
        return invalid_argument_error("{}: no \"model\" object; expected a tokenizer.json", path);
    }
    std::string text_out;
    auto out = std::back_inserter(text_out);
    const nlohmann::json& model = j["model"];
    const std::string type = model.value("type", std::string("?"));
    fmt::format_to(out, "file:           {}\n", path);
    fmt::format_to(out, "model:          {}", type);
    if (model.contains("vocab") && model["vocab"].is_object())
        fmt::format_to(out, ", {} vocabulary entries", model["vocab"].size());
    if (model.contains("merges") && model["merges"].is_array())
        fmt::format_to(out, ", {} merges", model["merges"].size());
    fmt::format_to(out, "\n");
    std::vector<std::string> flags;
    for (const char* key : {"byte_fallback", "ignore_merges", "fuse_unk", "dropout", "unk_token",
                            "continuing_subword_prefix", "end_of_word_suffix"})
        if (model.contains(key) && !model[key].is_null() && model[key] != false && model[key] != "")
            flags.push_back(std::string(key) + "=" + model[key].dump());
    if (!flags.empty()) {
        fmt::format_to(out, "model options: ");
        for (const auto& f : flags) fmt::format_to(out, " {}", f);
        fmt::format_to(out, "\n");
    }
    for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"})
        fmt::format_to(out, "{:<16}{}\n", std::string(key) + ":",
                       describe_component(j.contains(key) ? j[key] : nlohmann::json()));

    const nlohmann::json added = j.contains("added_tokens") && j["added_tokens"].is_array()
                                     ? j["added_tokens"]
                                     : nlohmann::json::array();
    size_t special = 0;
    for (const auto& t : added)
        if (t.value("special", false)) ++special;
    fmt::format_to(out, "added tokens:   {} ({} special)\n", added.size(), special);
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < added.size() && i < kShown; ++i)
        fmt::format_to(out, "  {:>8}  {}{}\n", added[i].value("id", -1),
                       added[i].value("content", std::string()),
                       added[i].value("special", false) ? "  (special)" : "");
    if (added.size() > kShown) fmt::format_to(out, "  ... and {} more\n", added.size() - kShown);

    // Whether lathe's encoder takes the file, and the vocabulary size it sees (HF's
    // get_vocab_size(with_added_tokens=True)).
    Result<Tokenizer> tok = Tokenizer::from_json(text, path);
    if (tok.ok()) {
        fmt::format_to(out, "vocab size:     {} (with added tokens)\n", tok->vocab_size());
        fmt::format_to(out,
                       "lathe:          loads (lathe tokenize and lathe prepare can use it)\n");
    } else {
        fmt::format_to(out, "lathe:          does not load: {}\n", tok.status().message());
    }
    return text_out;
}

}  // namespace lathe
