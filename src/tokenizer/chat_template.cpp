#include "tokenizer/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <span>

#include "io/file.h"
#include "io/json.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

using Json = nlohmann::ordered_json;
using jinja::Value;

namespace {

// The special-token keys transformers puts into a template's variables (special_tokens_map).
constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

// A token entry of tokenizer_config.json: a string, an AddedToken dict {"content": ...}, or null.
Result<std::optional<std::string>> token_content(const Json& v, const std::string& source,
                                                 const std::string& key) {
    if (v.is_null()) return std::optional<std::string>();
    if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
    if (v.is_object() && v.contains("content") && v["content"].is_string())
        return std::optional<std::string>(v["content"].get<std::string>());
    return invalid_argument_error(
        "{}: key '{}' must be a string or an AddedToken object with a string 'content'", source,
        key);
}

void upsert(std::vector<std::pair<std::string, Value>>& vars, const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
        if (k == name) {
            old = std::move(v);
            return;
        }
    }
    vars.emplace_back(name, std::move(v));
}

// Longest suffix of `tail` that is also a prefix of `rest` (KMP failure function of
// rest + '\0' + tail; texts hold no NUL).
size_t suffix_prefix_overlap(std::string_view tail, std::string_view rest) {
    rest = rest.substr(0, tail.size());
    std::string s;
    s.reserve(rest.size() + 1 + tail.size());
    s.append(rest);
    s.push_back('\0');
    s.append(tail);
    std::vector<size_t> fail(s.size(), 0);
    for (size_t i = 1; i < s.size(); ++i) {
        size_t k = fail[i - 1];
        while (k > 0 && s[i] != s[k]) k = fail[k - 1];
        if (s[i] == s[k]) ++k;
        fail[i] = k;
    }
    return fail.back();
}

// Bytes of agreement that resynchronise a prefix rendering with the full one after text the
// full rendering dropped (long enough not to match by chance, short enough to fit a turn).
constexpr size_t kResyncAnchorBytes = 16;

// Where the rendering `prefix` of the first turns ends inside the full rendering `full`.
//  * `prefix` is a prefix of `full`: its length (the common case, and GPT-NeoX's assumption).
//  * Otherwise the template renders history differently once later turns exist. The texts are
//    aligned left to right allowing text that `prefix` has and `full` lacks (qwen3 drops an
//    earlier assistant turn's <think> block once a later user turn exists): at each
//    disagreement the next kResyncAnchorBytes of `full` are looked for further on in `prefix`
//    and matching resumes there. Near the end of `prefix` (no anchor found), the turn ends after
//    the longest rest of `prefix` that `full` continues with.
//  * When nothing of that rest continues `full`, the prefix ends with text the full rendering
//    does not have there (a template that always appends the assistant header, like the Llama-3
//    base template): the turn ends where they part, and `*trailer` is that rest of `prefix`.
size_t turn_end_in_full(std::string_view prefix, std::string_view full, std::string_view* trailer) {
    *trailer = {};
    size_t i = 0, j = 0;
    while (true) {
        while (i < prefix.size() && j < full.size() && prefix[i] == full[j]) {
            ++i;
            ++j;
        }
        if (i == prefix.size()) break;
        const std::string_view anchor = full.substr(j, kResyncAnchorBytes);
        const size_t found = anchor.size() == kResyncAnchorBytes ? prefix.find(anchor, i + 1)
                                                                 : std::string_view::npos;
        if (found != std::string_view::npos) {
            i = found;  // prefix[i, found) is text the full rendering dropped
            continue;
        }
        const size_t overlap = suffix_prefix_overlap(prefix.substr(i), full.substr(j));
        if (overlap == 0) *trailer = prefix.substr(i);
        j += overlap;
        break;
    }
    while (j > 0 && j < full.size() && (static_cast<unsigned char>(full[j]) & 0xc0) == 0x80) --j;
    return j;
}

// Whether `ids` end in a special token, tokens of whitespace after it aside: the rendering of a
// template that marks the end of a turn itself (<|im_end|>\n, <|eot_id|>, </s>), or that opens
// the next turn's header after it (the Llama-3 base template).
Result<bool> ends_in_special_token(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
    for (size_t i = ids.size(); i-- > 0;) {
        if (tokenizer.is_special(ids[i])) return true;
        LATHE_ASSIGN_OR_RETURN(const std::string text,
                               tokenizer.decode(std::span<const int32_t>(&ids[i], 1), false));
        const bool blank = std::all_of(text.begin(), text.end(), [](char c) {
            return c == ' ' || c == '\n' || c == '\t' || c == '\r';
        });
        if (!blank) return false;
    }
    return false;
}

// How many leading tokens a and b share.
size_t common_tokens(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
}

}  // namespace

struct ChatTemplate::Impl {
    std::string source_name;  // the config file, for messages
    std::string template_name;
    std::string source;
    std::optional<jinja::Template> tmpl;
    // transformers renders with a template named "tool_use" when tools are given and the config
    // has one (and the caller did not pick a template by name).
    std::optional<jinja::Template> tool_use;
    std::vector<std::pair<std::string, Value>> special_tokens;
    std::optional<std::string> bos, eos;

    Result<std::string> render(const Value& messages, bool add_generation_prompt,
                               const Value& tools, const Json& extra) const {
        std::vector<std::pair<std::string, Value>> vars;
        vars.reserve(special_tokens.size() + 4 + (extra.is_object() ? extra.size() : 0));
        vars.emplace_back("messages", messages);
        vars.emplace_back("tools", tools);
        vars.emplace_back("documents", Value::none());
        vars.emplace_back("add_generation_prompt", Value::boolean(add_generation_prompt));
        for (const auto& [k, v] : special_tokens) upsert(vars, k, v);
        if (extra.is_object()) {
            for (const auto& [k, v] : extra.items()) {
                if (k == "messages" || k == "tools" || k == "documents" ||
                    k == "add_generation_prompt")
                    return invalid_argument_error(
                        "template variable '{}' is set by lathe itself and cannot be passed as an "
                        "extra variable",
                        k);
                upsert(vars, k, Value::from_json(v));
            }
        } else if (!extra.is_null()) {
            return invalid_argument_error("extra template variables must be a JSON object, got {}",
                                          extra.type_name());
        }
        const jinja::Template& t = (tool_use && !tools.is_none()) ? *tool_use : *tmpl;
        return t.render(vars);
    }
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::source() const {
    return impl_->source;
}
const std::string& ChatTemplate::name() const {
    return impl_->template_name;
}
const std::optional<std::string>& ChatTemplate::bos_token() const {
    return impl_->bos;
}
const std::optional<std::string>& ChatTemplate::eos_token() const {
    return impl_->eos;
}

namespace {

// Reads the chat template next to a config that has none: chat_template.jinja (plain text) or
// chat_template.json ({"chat_template": "..."}), as newer transformers save them.
Result<std::optional<std::pair<std::string, std::string>>> sibling_template(
    const std::string& config_path) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(config_path).parent_path();
    const fs::path jinja_path = dir / "chat_template.jinja";
    if (file_exists(jinja_path.string())) {
        LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(jinja_path.string()));
        return std::optional<std::pair<std::string, std::string>>(
            std::make_pair(text, jinja_path.string()));
    }
    const fs::path json_path = dir / "chat_template.json";
    if (file_exists(json_path.string())) {
        LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(json_path.string()));
        Json j = json_parse<Json>(text);
        if (j.is_discarded() || !j.is_object() || !j.contains("chat_template") ||
            !j["chat_template"].is_string())
            return invalid_argument_error(
                "{}: expected a JSON object with a string 'chat_template'", json_path.string());
        return std::optional<std::pair<std::string, std::string>>(std::make_pair(
            j["chat_template"].get<std::string>(), json_path.string() + ":chat_template"));
    }
    return std::optional<std::pair<std::string, std::string>>();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::load(const std::string& tokenizer_config_path,
                                        const std::string& template_name) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(tokenizer_config_path));
    return build(text, tokenizer_config_path, template_name, &tokenizer_config_path);
}

Result<ChatTemplate> ChatTemplate::from_config(std::string_view config_json_text,
                                               const std::string& source_name,
                                               const std::string& template_name) {
    return build(config_json_text, source_name, template_name, nullptr);
}

Result<ChatTemplate> ChatTemplate::build(std::string_view config_json_text,
                                         const std::string& source_name,
                                         const std::string& template_name,
                                         const std::string* config_path) {
    Json config = json_parse<Json>(config_json_text);
    if (config.is_discarded() || !config.is_object())
        return invalid_argument_error("{}: not a JSON object (expected a tokenizer_config.json)",
                                      source_name);

    auto impl = std::make_unique<Impl>();
    impl->source_name = source_name;
    for (const char* key : kSpecialTokenKeys) {
        if (!config.contains(key)) continue;
        LATHE_ASSIGN_OR_RETURN(std::optional<std::string> tok,
                               token_content(config[key], source_name, key));
        if (!tok) continue;
        impl->special_tokens.emplace_back(key, Value::string(*tok));
        if (std::string_view(key) == "bos_token") impl->bos = *tok;
        if (std::string_view(key) == "eos_token") impl->eos = *tok;
    }
    if (config.contains("additional_special_tokens") &&
        config["additional_special_tokens"].is_array()) {
        jinja::List extra;
        for (const auto& t : config["additional_special_tokens"]) {
            LATHE_ASSIGN_OR_RETURN(std::optional<std::string> tok,
                                   token_content(t, source_name, "additional_special_tokens"));
            if (tok) extra.push_back(Value::string(*tok));
        }
        impl->special_tokens.emplace_back("additional_special_tokens",
                                          Value::list(std::move(extra)));
    }

    const Json ct = config.contains("chat_template") ? config["chat_template"] : Json();
    std::string source, name;
    std::optional<std::string> tool_use_source;
    if (ct.is_string()) {
        if (template_name != "default")
            return not_found_error(
                "{}: chat_template is a single template; there is no template named '{}'",
                source_name, template_name);
        source = ct.get<std::string>();
        name = source_name + ":chat_template";
    } else if (ct.is_array()) {
        std::vector<std::string> names;
        for (size_t i = 0; i < ct.size(); ++i) {
            const Json& e = ct[i];
            if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
                !e.contains("template") || !e["template"].is_string())
                return invalid_argument_error(
                    "{}: chat_template[{}] must be an object with string 'name' and 'template'",
                    source_name, i);
            const std::string n = e["name"].get<std::string>();
            names.push_back(n);
            if (n == template_name) {
                source = e["template"].get<std::string>();
                name = source_name + ":chat_template[" + n + "]";
            }
            if (n == "tool_use" && template_name == "default")
                tool_use_source = e["template"].get<std::string>();
        }
        if (name.empty()) {
            std::string list;
            for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
            return not_found_error("{}: no chat template named '{}'; the config has {}",
                                   source_name, template_name, list);
        }
    } else if (ct.is_null()) {
        std::optional<std::pair<std::string, std::string>> sib;
        if (config_path) {
            LATHE_ASSIGN_OR_RETURN(sib, sibling_template(*config_path));
        }
        if (!sib)
            return not_found_error(
                "{} has no chat_template (nor a chat_template.jinja beside it); give the template "
                "with "
                "--chat-template FILE",
                source_name);
        source = sib->first;
        name = sib->second;
    } else {
        return invalid_argument_error(
            "{}: chat_template must be a string or a list of named templates, got {}", source_name,
            ct.type_name());
    }

    LATHE_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source, name));
    impl->tmpl.emplace(std::move(t));
    if (tool_use_source) {
        LATHE_ASSIGN_OR_RETURN(
            jinja::Template tu,
            jinja::Template::parse(*tool_use_source, source_name + ":chat_template[tool_use]"));
        impl->tool_use.emplace(std::move(tu));
    }
    impl->source = std::move(source);
    impl->template_name = std::move(name);
    return ChatTemplate(std::move(impl));
}

Result<ChatTemplate> ChatTemplate::with_template(std::string_view template_source,
                                                 const std::string& template_name) const {
    LATHE_ASSIGN_OR_RETURN(jinja::Template t,
                           jinja::Template::parse(template_source, template_name));
    auto impl = std::make_unique<Impl>();
    impl->source_name = impl_->source_name;
    impl->template_name = template_name;
    impl->source = std::string(template_source);
    impl->tmpl.emplace(std::move(t));
    impl->special_tokens = impl_->special_tokens;
    impl->bos = impl_->bos;
    impl->eos = impl_->eos;
    return ChatTemplate(std::move(impl));
}

namespace {

Result<Value> messages_value(const Json& messages) {
    if (!messages.is_array())
        return invalid_argument_error("'messages' must be a JSON array of message objects, got {}",
                                      messages.type_name());
    return Value::from_json(messages);
}

Value tools_value(const Json& tools) {
    return tools.is_null() ? Value::none() : Value::from_json(tools);
}

}  // namespace

Result<std::string> ChatTemplate::render(const Json& messages, bool add_generation_prompt,
                                         const Json& tools, const Json& extra_variables) const {
    LATHE_ASSIGN_OR_RETURN(Value msgs, messages_value(messages));
    return impl_->render(msgs, add_generation_prompt, tools_value(tools), extra_variables);
}

Result<ChatEncoding> ChatTemplate::encode_with_labels(const Tokenizer& tokenizer,
                                                      const Json& messages,
                                                      const ChatEncodeOptions& options,
                                                      const Json& tools,
                                                      const Json& extra_variables) const {
    LATHE_ASSIGN_OR_RETURN(Value msgs, messages_value(messages));
    const size_t n = messages.size();
    if (n == 0) return invalid_argument_error("the conversation has no messages");
    std::vector<std::string> roles(n);
    for (size_t i = 0; i < n; ++i) {
        const Json& m = messages[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            return invalid_argument_error("message {} must be an object with a string 'role'", i);
        roles[i] = m["role"].get<std::string>();
    }
    const Value tool_values = tools_value(tools);

    ChatEncoding out;
    LATHE_ASSIGN_OR_RETURN(std::string full,
                           impl_->render(msgs, false, tool_values, extra_variables));
    LATHE_RETURN_IF_ERROR(tokenizer.encode(full, false, out.ids));
    if (!options.mask) {  // GPT-NeoX --no-mask: every token keeps loss, nothing appended
        out.labels = out.ids;
        return out;
    }

    // Turn i owns the tokens [end[i-1], end[i]) of the full rendering's tokens.
    std::vector<size_t> end(n, out.ids.size());
    size_t prev_byte = 0, prev_tok = 0;
    const jinja::List& all = msgs.as_list();
    std::vector<int32_t> prefix_ids;
    for (size_t i = 0; i + 1 < n; ++i) {
        const bool add_gen = roles[i + 1] == options.generation_role;
        const Value prefix = Value::list(jinja::List(all.begin(), all.begin() + long(i + 1)));
        LATHE_ASSIGN_OR_RETURN(std::string rendered,
                               impl_->render(prefix, add_gen, tool_values, extra_variables));
        std::string_view trailer;
        const size_t byte_end = std::max(prev_byte, turn_end_in_full(rendered, full, &trailer));
        prefix_ids.clear();
        LATHE_RETURN_IF_ERROR(
            tokenizer.encode(std::string_view(full).substr(0, byte_end), false, prefix_ids));
        size_t k = common_tokens(prefix_ids, out.ids);
        if (!trailer.empty() && k == prefix_ids.size() && k > prev_tok && k < out.ids.size()) {
            // The prefix's trailer and the next turn may start alike: with the Llama-3 base
            // template both are a header "<|start_header_id|>" + role. When they part on a plain
            // (role) token right after a special token, that special token opens the next
            // turn's header: it is not part of this turn.
            LATHE_RETURN_IF_ERROR(tokenizer.encode(trailer, false, prefix_ids));
            if (!prefix_ids.empty() && !tokenizer.is_special(prefix_ids[0]) &&
                tokenizer.is_special(out.ids[k - 1]) && !tokenizer.is_special(out.ids[k]))
                k -= 1;
        }
        end[i] = std::max(prev_tok, k);
        prev_byte = byte_end;
        prev_tok = end[i];
    }
    if (roles[n - 1] == options.generation_role) {
        // What the template renders after the last turn's end-of-turn (the Llama-3 base
        // template's trailing assistant header) belongs to no turn and carries no loss. The last
        // turn ends where the middle turns end: where the rendering with one more (probe) message
        // parts from the full one, found with the same alignment. A template that rejects the
        // probe leaves the last turn running to the end of the rendering.
        Json probed = messages;
        probed.push_back(
            {{"role", options.generation_role == "user" ? "assistant" : "user"}, {"content", "x"}});
        LATHE_ASSIGN_OR_RETURN(Value probe_msgs, messages_value(probed));
        Result<std::string> next = impl_->render(probe_msgs, false, tool_values, extra_variables);
        std::string_view trailer;
        if (next.ok()) turn_end_in_full(full, *next, &trailer);
        if (!trailer.empty()) {
            const size_t byte_end = size_t(trailer.data() - full.data());
            prefix_ids.clear();
            LATHE_RETURN_IF_ERROR(
                tokenizer.encode(std::string_view(full).substr(0, byte_end), false, prefix_ids));
            size_t k = common_tokens(prefix_ids, out.ids);
            if (k == prefix_ids.size() && k > prev_tok && k < out.ids.size() &&
                tokenizer.is_special(out.ids[k - 1]) && !tokenizer.is_special(out.ids[k]))
                k -= 1;  // the special token that opens the trailing header, as in the loop
            end[n - 1] = std::max(prev_tok, k);
        }
    }
    out.labels.assign(out.ids.size(), kChatIgnoreLabel);
    size_t begin = 0;
    for (size_t i = 0; i < n; ++i) {
        const bool keep =
            roles[i] == options.generation_role && (!options.only_last_turn || i + 1 == n);
        for (size_t t = begin; t < end[i]; ++t)
            if (keep) out.labels[t] = out.ids[t];
        begin = end[i];
    }
    if (!options.append_eos || !impl_->eos || roles[n - 1] != options.generation_role) return out;
    LATHE_ASSIGN_OR_RETURN(const bool ends_itself, ends_in_special_token(tokenizer, out.ids));
    if (!ends_itself) {
        const std::optional<int32_t> eos = tokenizer.token_to_id(*impl_->eos);
        if (!eos)
            return not_found_error("{}: eos_token '{}' is not in the tokenizer's vocabulary",
                                   impl_->source_name, *impl_->eos);
        const bool last_has_loss = !out.labels.empty() && out.labels.back() != kChatIgnoreLabel;
        out.ids.push_back(*eos);
        out.labels.push_back(last_has_loss ? *eos : kChatIgnoreLabel);
    }
    return out;
}

}  // namespace lathe
