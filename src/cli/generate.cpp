// `lathe generate`: text from a checkpoint with a KV cache (src/infer/), on the CPU or CUDA.
//
//   lathe generate --checkpoint DIR [--input F.jsonl] [--output F.jsonl] [--prompt TEXT]
//       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
//       [--repetition-penalty R] [--seed S] [--stop S]... [--chat] [--device auto|cpu|cuda]
//       [--batch-size N]
// Input lines: {"prompt": "..."} | {"prompt_ids": [...]} | {"messages": [...]} (blank lines are
// skipped). Output lines, in input order: {"ids": [...], "text": "..."}, the new tokens only (a
// stop token included). Without --input, --prompt TEXT streams its text to stdout.
// docs/INFERENCE.md has the definitions.
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <cstdio>

#include "cli/command.h"
#include "data/line_output.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;

struct GenerateRequest {
    std::string checkpoint, input, output = "-", prompt, device = "auto";
    int64_t max_new_tokens = 64, batch_size = 8, top_k = 0;
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    bool chat = false;
};

// The EOS ids: generation_config.json's eos_token_id (an id or a list), else config.json's.
Result<std::vector<int32_t>> read_eos_ids(const fs::path& dir) {
    for (const char* name : {"generation_config.json", "config.json"}) {
        const fs::path path = dir / name;
        if (!fs::exists(path)) continue;
        std::ifstream in(path);
        nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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

struct Prompting {
    std::optional<Tokenizer> tokenizer;
    std::optional<ChatTemplate> chat;
    Status chat_error;  // why tokenizer_config.json gave no template, for a chat prompt
    std::string dir;
};

Result<std::vector<int32_t>> encode_text(const Prompting& p, const std::string& text,
                                         bool add_special) {
    if (!p.tokenizer) {
        return failed_precondition_error(
            "{} has no tokenizer.json: give token ids ({{\"prompt_ids\": [...]}})", p.dir);
    }
    return p.tokenizer->encode(text, add_special);
}

Result<std::vector<int32_t>> encode_messages(const Prompting& p,
                                             const nlohmann::ordered_json& messages) {
    if (!p.chat && !p.chat_error.ok()) return p.chat_error;
    if (!p.chat) {
        return failed_precondition_error(
            "{} has no chat template (tokenizer_config.json with chat_template)", p.dir);
    }
    LATHE_ASSIGN_OR_RETURN(std::string text, p.chat->render(messages, true));
    // The template writes BOS itself where the model wants one.
    return encode_text(p, text, /*add_special=*/false);
}

// One input line's prompt ids; errors are the caller's to place (file:line).
Result<std::vector<int32_t>> prompt_of_line(const Prompting& p, const std::string& line,
                                            bool chat) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument_error("not a JSON object");
    const int keys =
        int(j.contains("prompt")) + int(j.contains("prompt_ids")) + int(j.contains("messages"));
    if (keys != 1) {
        return invalid_argument_error(
            "needs exactly one of \"prompt\", \"prompt_ids\", \"messages\" (found {})", keys);
    }
    if (j.contains("prompt")) {
        if (!j["prompt"].is_string()) return invalid_argument_error("\"prompt\" must be a string");
        const std::string text = j["prompt"].get<std::string>();
        if (chat) {
            nlohmann::ordered_json m = nlohmann::ordered_json::array();
            m.push_back({{"role", "user"}, {"content", text}});
            return encode_messages(p, m);
        }
        return encode_text(p, text, /*add_special=*/true);
    }
    if (j.contains("prompt_ids")) {
        const auto& a = j["prompt_ids"];
        if (!a.is_array()) return invalid_argument_error("\"prompt_ids\" must be a list of ids");
        std::vector<int32_t> ids;
        for (const auto& x : a) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
                x.get<int64_t>() > int64_t(INT32_MAX))
                return invalid_argument_error("\"prompt_ids\" holds {}, not a token id", x.dump());
            ids.push_back(x.get<int32_t>());
        }
        return ids;
    }
    if (!j["messages"].is_array())
        return invalid_argument_error("\"messages\" must be a list of {{\"role\", \"content\"}}");
    return encode_messages(p, j["messages"]);
}

Status run_generate(const GenerateRequest& r) {
    if (r.input.empty() == r.prompt.empty())
        return invalid_argument_error("give exactly one of --input F.jsonl and --prompt TEXT");
    const Result<fs::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const fs::path dir = *resolved;
    Prompting p;
    p.dir = dir.string();
    if (fs::exists(dir / "tokenizer.json")) {
        auto t = Tokenizer::load((dir / "tokenizer.json").string());
        if (!t.ok()) return t.status().with_context("--checkpoint");
        p.tokenizer.emplace(std::move(*t));
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

    // The prompts, each with where it came from.
    std::vector<std::vector<int32_t>> prompts;
    if (!r.input.empty()) {
        std::ifstream in(r.input);
        if (!in) return not_found_error("--input {}: cannot open", r.input);
        std::string line;
        for (int64_t n = 1; std::getline(in, line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            auto ids = prompt_of_line(p, line, r.chat);
            if (!ids.ok()) return ids.status().with_context(fmt::format("{}:{}", r.input, n));
            if (ids->empty())
                return invalid_argument_error("{}:{}: the prompt has no tokens", r.input, n);
            prompts.push_back(std::move(*ids));
        }
        if (prompts.empty()) return invalid_argument_error("--input {}: no prompts", r.input);
    } else {
        Result<std::vector<int32_t>> ids = [&]() -> Result<std::vector<int32_t>> {
            if (!r.chat) return encode_text(p, r.prompt, true);
            nlohmann::ordered_json m = nlohmann::ordered_json::array();
            m.push_back({{"role", "user"}, {"content", r.prompt}});
            return encode_messages(p, m);
        }();
        if (!ids.ok()) return ids.status().with_context("--prompt");
        if (ids->empty()) return invalid_argument_error("--prompt: the prompt has no tokens");
        prompts.push_back(std::move(*ids));
    }

    GenerateOptions o;
    o.sampling.temperature = r.temperature;
    o.sampling.top_k = r.top_k;
    o.sampling.top_p = r.top_p;
    o.sampling.min_p = r.min_p;
    o.sampling.repetition_penalty = r.repetition_penalty;
    LATHE_RETURN_IF_ERROR(sampling_validate(o.sampling));
    if (r.max_new_tokens < 1)
        return invalid_argument_error("--max-new-tokens must be >= 1, got {}", r.max_new_tokens);
    if (r.batch_size < 1)
        return invalid_argument_error("--batch-size must be >= 1, got {}", r.batch_size);
    o.seed = r.seed;
    o.max_new_tokens = r.max_new_tokens;
    o.stop_strings = r.stop;
    o.batch_size = std::min<int64_t>(r.batch_size, int64_t(prompts.size()));
    LATHE_ASSIGN_OR_RETURN(o.stop_ids, read_eos_ids(dir));
    if (!r.stop.empty() && !p.tokenizer)
        return failed_precondition_error("--stop needs {}/tokenizer.json to decode text", p.dir);

    auto config = model_config_from_hf_file(dir.string());
    if (!config.ok()) return config.status().with_context("--checkpoint");
    size_t longest = 0;
    for (const auto& q : prompts) longest = std::max(longest, q.size());
    const int64_t max_len =
        std::min<int64_t>(config->max_position_embeddings, int64_t(longest) + r.max_new_tokens);
    if (int64_t(longest) >= config->max_position_embeddings) {
        return invalid_argument_error(
            "a prompt of {} tokens leaves no room in the model's {}-token context", longest,
            config->max_position_embeddings);
    }
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    LATHE_ASSIGN_OR_RETURN(ComputeDevice device, ComputeDevice::open(r.device, "--device"));
    LATHE_ASSIGN_OR_RETURN(Model model,
                           model_create_loaded(*config, shape, device.context(), dir.string()));
    EngineLimits limits;
    limits.max_sequences = o.batch_size;
    limits.max_len = max_len;
    limits.prefill_chunk = std::min<int64_t>(256, max_len);
    LATHE_ASSIGN_OR_RETURN(InferenceEngine engine, InferenceEngine::create(model, limits));

    Detokenizer detok;
    if (p.tokenizer) {
        detok = [&p](std::span<const int32_t> ids) { return p.tokenizer->decode(ids, true); };
    }
    // --prompt streams: each time the text grows by whole characters, the new part is printed.
    size_t printed = 0;
    TokenCallback stream;
    if (!r.prompt.empty() && r.output == "-") {
        stream = [&printed](size_t, const GenerateResult& g) {
            static const std::string kReplacement = "\xEF\xBF\xBD";  // an unfinished character
            size_t end = g.text.size();
            if (g.stop.empty() && end >= 3 && g.text.compare(end - 3, 3, kReplacement) == 0) return;
            if (end > printed) {
                std::fwrite(g.text.data() + printed, 1, end - printed, stdout);
                std::fflush(stdout);
                printed = end;
            }
        };
    }
    LATHE_ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                           generate(engine, prompts, o, detok, stream));
    if (stream) {
        std::fputc('\n', stdout);
        return ok_status();
    }
    LATHE_ASSIGN_OR_RETURN(LineOutput out, LineOutput::open(r.output));
    for (const GenerateResult& g : results) {
        nlohmann::ordered_json j;
        j["ids"] = g.ids;
        j["text"] = g.text;
        LATHE_RETURN_IF_ERROR(
            out.write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
    }
    return out.commit();
}

}  // namespace

void cli_add_generate(CLI::App& parent, CommandAction& action) {
    auto req = std::make_shared<GenerateRequest>();
    CLI::App* cmd = parent.add_subcommand(
        "generate",
        "Generate text from a checkpoint with a KV cache: JSONL prompts in, JSONL out, or one "
        "--prompt streamed (docs/INFERENCE.md)");
    cmd->add_option("--checkpoint", req->checkpoint,
                    "A lathe checkpoint or Hugging Face folder (config.json, safetensors, "
                    "tokenizer.json for text)")
        ->required();
    cmd->add_option("--input", req->input,
                    "JSONL of {\"prompt\"}, {\"prompt_ids\"} or {\"messages\"} lines");
    cmd->add_option("--output", req->output, "JSONL of {\"ids\", \"text\"} lines (- = stdout)")
        ->capture_default_str();
    cmd->add_option("--prompt", req->prompt, "One prompt, its text streamed to stdout");
    cmd->add_option("--max-new-tokens", req->max_new_tokens, "Tokens generated at most")
        ->capture_default_str();
    cmd->add_option("--temperature", req->temperature, "0 = greedy")->capture_default_str();
    cmd->add_option("--top-k", req->top_k, "0 = off")->capture_default_str();
    cmd->add_option("--top-p", req->top_p, "1 = off")->capture_default_str();
    cmd->add_option("--min-p", req->min_p, "0 = off")->capture_default_str();
    cmd->add_option("--repetition-penalty", req->repetition_penalty, "1 = off")
        ->capture_default_str();
    cmd->add_option("--seed", req->seed, "Sampling seed")->capture_default_str();
    cmd->add_option("--stop", req->stop, "A stop string (repeatable)");
    cmd->add_flag("--chat", req->chat,
                  "Render prompts as one user message through the chat template");
    cmd->add_option("--device", req->device, "auto | cpu | cuda")->capture_default_str();
    cmd->add_option("--batch-size", req->batch_size, "Requests decoded together")
        ->capture_default_str();
    cmd->callback([req, &action] { action = [req] { return run_generate(*req); }; });
}

}  // namespace lathe
