// `lathe chat`: render conversations with a model's chat template, or turn them into SFT tokens
// and labels.
//
//   lathe chat render --tokenizer-config C [--chat-template F] [--template-name N]
//                     [--input F] [--add-generation-prompt] [--kwargs JSON] [--output F]
//   lathe chat encode --tokenizer T.json --tokenizer-config C [--chat-template F]
//                     [--template-name N] [--input F] [--kwargs JSON] [--output F]
//                     [--generation-role R] [--only-last] [--no-mask] [--no-eos]
//
// Each input line is a JSON object {"messages": [...], "tools": [...] (optional),
// "chat_template_kwargs": {...} (optional)}; other keys are ignored. chat_template_kwargs (and
// --kwargs, which a line's own keys override) become template variables, as **kwargs of
// transformers' apply_chat_template do (e.g. {"enable_thinking": false} for Qwen3).
//
// render writes one {"text": "..."} per line: the text apply_chat_template(messages,
// tools=tools, tokenize=False, add_generation_prompt=...) returns. encode writes one
// {"ids": [...], "labels": [...]} per line: the ids are apply_chat_template(messages,
// tokenize=True)'s, with eos_token appended only after a final assistant turn that the
// template does not end itself; labels as GPT-NeoX's preprocess_data_with_chat_template.py masks
// them (see ChatTemplate::encode_with_labels).
//
// Input and output default to stdin/stdout ("-"); gzip/zstd input is read transparently; output
// to a file is atomic. A bad line stops the run with an error naming the file and line.

#include <cstdio>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "core/log.h"
#include "io/file.h"
#include "io/input.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

using Json = nlohmann::ordered_json;

struct ChatArgs {
    std::string tokenizer_config;
    std::string chat_template;  // a template file overriding the config's
    std::string template_name = "default";
    std::string tokenizer;  // encode only
    std::string input = "-";
    std::string output = "-";
    std::string kwargs;  // JSON object of template variables for every line
    bool add_generation_prompt = false;
    ChatEncodeOptions encode;
    bool no_eos = false;
};

// Output to an atomic file or to stdout.
class Output {
public:
    static Result<Output> open(const std::string& path) {
        Output out;
        if (path != "-") {
            LATHE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
            out.file_ = std::make_unique<AtomicFile>(std::move(f));
        }
        return out;
    }
    Status write(std::string_view data) {
        if (file_) return file_->write(data);
        if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size())
            return io_error("writing to standard output failed");
        return ok_status();
    }
    Status finish() {
        if (file_) return file_->commit();
        if (std::fflush(stdout) != 0) return io_error("writing to standard output failed");
        return ok_status();
    }

private:
    std::unique_ptr<AtomicFile> file_;
};

Result<ChatTemplate> load_template(const ChatArgs& args) {
    LATHE_ASSIGN_OR_RETURN(ChatTemplate config_template, [&]() -> Result<ChatTemplate> {
        if (args.chat_template.empty())
            return ChatTemplate::load(args.tokenizer_config, args.template_name);
        // With --chat-template the config only supplies the special tokens, so a config without a
        // chat_template of its own (e.g. Llama-2 base) is fine.
        LATHE_ASSIGN_OR_RETURN(std::string config_text, file_read_all(args.tokenizer_config));
        Json config = Json::parse(config_text, nullptr, false);
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

// One parsed input line.
struct Conversation {
    Json messages;
    Json tools;
    Json kwargs;
};

Result<Conversation> parse_line(std::string_view line, const Json& default_kwargs) {
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_argument_error("not valid JSON (or not valid UTF-8)");
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

Status run_chat(const ChatArgs& args, bool encode) {
    LATHE_ASSIGN_OR_RETURN(ChatTemplate tmpl, load_template(args));
    std::optional<Tokenizer> tokenizer;
    if (encode) {
        Result<Tokenizer> loaded = Tokenizer::load(args.tokenizer);
        if (!loaded.ok()) return loaded.status().with_context("--tokenizer");
        tokenizer.emplace(std::move(loaded).value());
    }
    Json default_kwargs;
    if (!args.kwargs.empty()) {
        default_kwargs = Json::parse(args.kwargs, nullptr, false);
        if (default_kwargs.is_discarded() || !default_kwargs.is_object())
            return invalid_argument_error("--kwargs must be a JSON object, got: {}", args.kwargs);
    }
    ChatEncodeOptions options = args.encode;
    options.append_eos = !args.no_eos;

    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(args.input));
    LineReader reader(in);
    LATHE_ASSIGN_OR_RETURN(Output out, Output::open(args.output));
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
    LATHE_RETURN_IF_ERROR(out.finish());
    log_info("chat {}: {} conversation(s) with template {}", encode ? "encode" : "render", count,
             tmpl.name());
    return ok_status();
}

void add_template_options(CLI::App* cmd, ChatArgs& args) {
    cmd->add_option("--tokenizer-config", args.tokenizer_config,
                    "tokenizer_config.json: its chat_template and special tokens")
        ->required();
    cmd->add_option("--chat-template", args.chat_template,
                    "A Jinja template file used instead of the config's chat_template");
    cmd->add_option("--template-name", args.template_name,
                    "Which of the config's named chat templates to use (default: default)");
    cmd->add_option("--input", args.input,
                    "Input JSONL, one {\"messages\": [...]} per line ('-' = stdin)");
    cmd->add_option("--output", args.output, "Output JSONL, written atomically ('-' = stdout)");
    cmd->add_option("--kwargs", args.kwargs,
                    "JSON object of extra template variables for every line, e.g. "
                    "'{\"enable_thinking\": false}'");
}

}  // namespace

void cli_add_chat(CLI::App& parent, CommandAction& action) {
    CLI::App* chat = parent.add_subcommand(
        "chat", "Render conversations with a chat template, or encode them for SFT");
    chat->require_subcommand(1);
    auto args = std::make_shared<ChatArgs>();

    CLI::App* render = chat->add_subcommand(
        "render",
        "Render each conversation as transformers' apply_chat_template(tokenize=False) does");
    add_template_options(render, *args);
    render->add_flag("--add-generation-prompt", args->add_generation_prompt,
                     "End with the header that starts the assistant's reply");
    render->callback([args, &action] { action = [args] { return run_chat(*args, false); }; });

    CLI::App* encode = chat->add_subcommand(
        "encode",
        "Token ids and SFT labels per conversation (-100 = no loss), as GPT-NeoX builds them");
    add_template_options(encode, *args);
    encode->add_option("--tokenizer", args->tokenizer, "tokenizer.json")->required();
    encode->add_option("--generation-role", args->encode.generation_role,
                       "Turns of this role keep loss (default: assistant)");
    encode->add_flag("--only-last", args->encode.only_last_turn, "Only the last turn keeps loss");
    encode->add_flag(
        "--no-mask", [args](int64_t n) { args->encode.mask = n == 0; },
        "Every token keeps loss (labels = ids)");
    encode->add_flag("--no-eos", args->no_eos,
                     "Never append eos_token (by default it follows a final assistant turn "
                     "whose rendering does not end in a special token: a template that marks "
                     "no end of turn)");
    encode->callback([args, &action] { action = [args] { return run_chat(*args, true); }; });
}

}  // namespace lathe
