#include "infer/prompting.h"

#include <fstream>

#include "io/json.h"

namespace lathe {

namespace fs = std::filesystem;

Result<std::vector<int32_t>> read_eos_ids(const fs::path& dir) {
    for (const char* name : {"generation_config.json", "config.json"}) {
        const fs::path path = dir / name;
        if (!fs::exists(path)) continue;
        std::ifstream in(path);
        nlohmann::json j = json_parse<nlohmann::json>(in);
        if (j.is_discarded()) return invalid_argument_error("{}: not valid JSON", path.string());
        if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
        const nlohmann::json& e = j["eos_token_id"];
        std::vector<int32_t> ids;
        if (e.is_number_integer()) {
            ids.push_back(e.get<int32_t>());
        } else if (e.is_array()) {
            for (const auto& x : e) {
                if (!x.is_number_integer())
                    return invalid_argument_error("{}: eos_token_id holds a non-integer",
                                                  path.string());
                ids.push_back(x.get<int32_t>());
            }
        } else {
            return invalid_argument_error("{}: eos_token_id must be an integer or a list of them",
                                          path.string());
        }
        return ids;
    }
    return std::vector<int32_t>{};
}

Result<Prompting> Prompting::load(const fs::path& dir) {
    Prompting p;
    p.dir = dir.string();
    if (fs::exists(dir / "tokenizer.json")) {
        LATHE_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::load((dir / "tokenizer.json").string()));
        p.tokenizer.emplace(std::move(t));
    }
    const fs::path tc = dir / "tokenizer_config.json";
    if (fs::exists(tc)) {
        auto c = ChatTemplate::load(tc.string());
        // A config without a chat template is fine until a chat prompt needs one.
        if (c.ok())
            p.chat.emplace(std::move(*c));
        else
            p.chat_error = c.status().with_context(tc.string());
    }
    return p;
}

Result<std::vector<int32_t>> Prompting::encode_text(const std::string& text,
                                                    bool add_special) const {
    if (!tokenizer) {
        return failed_precondition_error(
            "{} has no tokenizer.json: give token ids ({{\"prompt_ids\": [...]}})", dir);
    }
    return tokenizer->encode(text, add_special);
}

Result<std::vector<int32_t>> Prompting::encode_messages(
    const nlohmann::ordered_json& messages) const {
    if (!chat && !chat_error.ok()) return chat_error;
    if (!chat) {
        return failed_precondition_error(
            "{} has no chat template (tokenizer_config.json with chat_template)", dir);
    }
    LATHE_ASSIGN_OR_RETURN(std::string text, chat->render(messages, true));
    // The template writes BOS itself where the model wants one.
    return encode_text(text, /*add_special=*/false);
}

Result<std::string> Prompting::decode(std::span<const int32_t> ids) const {
    if (!tokenizer) return std::string();
    return tokenizer->decode(ids, /*skip_special=*/true);
}

}  // namespace lathe
