#include "data/chat_jsonl.h"

#include <optional>

#include "core/log.h"
#include "core/strings.h"
#include "data/line_output.h"
#include "io/file.h"
#include "io/input.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

using Json = nlohmann::ordered_json;

// One parsed input line.
struct Conversation {
    Json messages;
    Json tools;
    Json kwargs;
};

Result<Conversation> parse_line(std::string_view line, const Json& default_kwargs) {
    Json j = json_parse<Json>(line);
    if (j.is_discarded()) return invalid_argument_error("not valid JSON: {}", json_problem(line));
    if (!j.is_object())
        return invalid_argument_error("expected a JSON object with a 'messages' array");
    if (!j.contains("messages")) return invalid_argument_error("no 'messages' field");
    Conversation c;
    c.messages = std::move(j["messages"]);
    if (!c.messages.is_array())
        return invalid_argument_error("'messages' must be an array of message objects");
    if (j.contains("tools") && !j["tools"].is_null()) {
        c.tools = std::move(j["tools"]);
        if (!c.tools.is_array())
            return invalid_argument_error("'tools' must be an array of tool schemas");
    }
    c.kwargs = default_kwargs;
    if (j.contains("chat_template_kwargs")) {
        const Json& k = j["chat_template_kwargs"];
        if (!k.is_object())
            return invalid_argument_error("'chat_template_kwargs' must be an object");
        if (c.kwargs.is_null()) c.kwargs = Json::object();
        for (const auto& [key, value] : k.items()) c.kwargs[key] = value;
    }
    return c;
}

void append_ints(std::string& out, const std::vector<int32_t>& v) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(v[i]);
    }
    out += ']';
}

}  // namespace

Result<ChatTemplate> chat_jsonl_load_template(const ChatJsonlOptions& args) {
    LATHE_ASSIGN_OR_RETURN(ChatTemplate config_template, [&]() -> Result<ChatTemplate> {
        if (args.chat_template.empty())
            return ChatTemplate::load(args.tokenizer_config, args.template_name);
        // With --chat-template the config only supplies the special tokens, so a config without a
        // chat_template of its own (e.g. Llama-2 base) is fine.
        LATHE_ASSIGN_OR_RETURN(std::string config_text, file_read_all(args.tokenizer_config));
        Json config = json_parse<Json>(config_text);
        if (config.is_discarded() || !config.is_object())
            return invalid_argument_error(
                "{}: not a JSON object (expected a tokenizer_config.json)", args.tokenizer_config);
        config["chat_template"] = "";
        return ChatTemplate::from_config(config.dump(), args.tokenizer_config);
    }());
    if (args.chat_template.empty()) return config_template;
    LATHE_ASSIGN_OR_RETURN(std::string source, file_read_all(args.chat_template));
    return config_template.with_template(source, args.chat_template);
}

Status chat_jsonl_run(const ChatJsonlOptions& args, ChatJsonlMode mode) {
    const bool encode = mode == ChatJsonlMode::kEncode;
    LATHE_ASSIGN_OR_RETURN(ChatTemplate tmpl, chat_jsonl_load_template(args));
    std::optional<Tokenizer> tokenizer;
    if (encode) {
        Result<Tokenizer> loaded = Tokenizer::load(args.tokenizer);
        if (!loaded.ok()) return loaded.status().with_context("--tokenizer");
        tokenizer.emplace(std::move(loaded).value());
    }
    Json default_kwargs;
    if (!args.kwargs.empty()) {
        default_kwargs = json_parse<Json>(args.kwargs);
        if (default_kwargs.is_discarded() || !default_kwargs.is_object())
            return invalid_argument_error("--kwargs must be a JSON object, got: {}", args.kwargs);
    }
    ChatEncodeOptions options = args.encode;
    options.append_eos = !args.no_eos;

    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(args.input));
    LineReader reader(in);
    LATHE_ASSIGN_OR_RETURN(LineOutput out, LineOutput::open(args.output));
    std::string buf;
    uint64_t count = 0;
    while (true) {
        std::string_view line;
        LATHE_ASSIGN_OR_RETURN(bool more, reader.next(line));
        if (!more) break;
        auto where = [&](const Status& s) {
            return Status(s.code(),
                          fmt::format("{}:{}: {}", in.name(), reader.line_number(), s.message()));
        };
        Result<Conversation> conv = parse_line(strip_cr(line), default_kwargs);
        if (!conv.ok()) return where(conv.status());
        buf.clear();
        if (encode) {
            Result<ChatEncoding> enc = tmpl.encode_with_labels(*tokenizer, conv->messages, options,
                                                               conv->tools, conv->kwargs);
            if (!enc.ok()) return where(enc.status());
            buf += "{\"ids\":";
            append_ints(buf, enc->ids);
            buf += ",\"labels\":";
            append_ints(buf, enc->labels);
            buf += "}\n";
        } else {
            Result<std::string> text =
                tmpl.render(conv->messages, args.add_generation_prompt, conv->tools, conv->kwargs);
            if (!text.ok()) return where(text.status());
            buf += Json{{"text", *text}}.dump(-1, ' ', false, Json::error_handler_t::replace);
            buf += '\n';
        }
        LATHE_RETURN_IF_ERROR(out.write(buf));
        ++count;
    }
    LATHE_RETURN_IF_ERROR(out.commit());
    log_info("chat {}: {} conversation(s) with template {}", encode ? "encode" : "render", count,
             tmpl.name());
    return ok_status();
}

}  // namespace lathe
