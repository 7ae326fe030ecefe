// `lathe generate`: text from a checkpoint with a KV cache (src/infer/), on the CPU or CUDA.
//
//   lathe generate --checkpoint DIR [--input F.jsonl] [--output F.jsonl] [--prompt TEXT]
//       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
//       [--repetition-penalty R] [--seed S] [--stop S]... [--chat] [--device auto|cpu|cuda]
//       [--batch-size N] [--tensor-parallel T] [--random-weights SEED]
// Input lines: {"prompt": "..."} | {"prompt_ids": [...]} | {"messages": [...]} (blank lines are
// skipped). Output lines, in input order: {"ids": [...], "text": "..."}, the new tokens only (a
// stop token included). Without --input, --prompt TEXT streams its text to stdout.
// --tensor-parallel T: T processes (`lathe launch --gpus T lathe generate ...` on GPUs, `mpirun -np
// T lathe generate --device cpu ...` on the CPU) each hold a shard (infer/tensor_parallel.h); rank
// 0 reads the input and broadcasts the prompts, every rank takes rank 0's sampled tokens, and
// rank 0 alone writes the output. --random-weights SEED: no safetensors are read; each rank's
// shard is drawn from SEED (timing a shape that has only a config.json).
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
#include "infer/prompting.h"
#include "infer/tensor_parallel.h"
#include "io/file.h"
#include "io/json.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "run/inference_processes.h"
#include "run/world.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;

struct GenerateRequest {
    std::string checkpoint, input, output = "-", prompt, device = "auto";
    int64_t max_new_tokens = 64, batch_size = 8, top_k = 0;
    int64_t prefill_chunk = 0;  // 0: 2048 on CUDA, 256 on the CPU
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    bool chat = false;
    int tensor_parallel = 1;
    int64_t random_weights = -1;  // < 0: load the checkpoint's safetensors
    std::string decode_gemv = "auto";
    std::string peer_reduce = "auto";  // tensor parallel: small sums over peer GPU memory
};

// One input line's prompt ids; errors are the caller's to place (file:line).
Result<std::vector<int32_t>> prompt_of_line(const Prompting& p, const std::string& line,
                                            bool chat) {
    nlohmann::ordered_json j = json_parse<nlohmann::ordered_json>(line);
    if (j.is_discarded())
        return invalid_argument_error("not a JSON object: {}", json_problem(line));
    if (!j.is_object()) return invalid_argument_error("not a JSON object");
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
            return p.encode_messages(m);
        }
        return p.encode_text(text, /*add_special=*/true);
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
    return p.encode_messages(j["messages"]);
}

// The prompts of --input or --prompt.
Status read_prompts(const GenerateRequest& r, const Prompting& p,
                    std::vector<std::vector<int32_t>>& prompts) {
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
            if (!r.chat) return p.encode_text(r.prompt, true);
            nlohmann::ordered_json m = nlohmann::ordered_json::array();
            m.push_back({{"role", "user"}, {"content", r.prompt}});
            return p.encode_messages(m);
        }();
        if (!ids.ok()) return ids.status().with_context("--prompt");
        if (ids->empty()) return invalid_argument_error("--prompt: the prompt has no tokens");
        prompts.push_back(std::move(*ids));
    }
    return ok_status();
}

Status run_generate(const GenerateRequest& r) {
    if (r.input.empty() == r.prompt.empty())
        return invalid_argument_error("give exactly one of --input F.jsonl and --prompt TEXT");
    const Result<fs::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const fs::path dir = *resolved;
    Result<Prompting> loaded = Prompting::load(dir);
    if (!loaded.ok()) return loaded.status().with_context("--checkpoint");
    const Prompting& p = *loaded;

    auto config = model_config_from_hf_file(dir.string());
    if (!config.ok()) return config.status().with_context("--checkpoint");
    // Tensor parallel: one process per rank, the world of this job.
    LATHE_ASSIGN_OR_RETURN(
        InferenceProcesses procs,
        inference_processes_open(*config, r.tensor_parallel, r.device, "generate"));
    const ComputeDevice& device = procs.device;
    std::optional<World>& world = procs.world;
    const bool rank0 = !world || world->rank() == 0;

    // The prompts: rank 0 reads them and sends them to the others.
    std::vector<std::vector<int32_t>> prompts;
    Status read = rank0 ? read_prompts(r, p, prompts) : ok_status();
    if (world) {
        LATHE_RETURN_IF_ERROR(
            tp_broadcast_token_lists(*world->comm, device.context(), prompts, !read.ok()));
    }
    LATHE_RETURN_IF_ERROR(read);

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
    if (r.prefill_chunk < 0)
        return invalid_argument_error("--prefill-chunk must be >= 0, got {}", r.prefill_chunk);
    o.seed = r.seed;
    o.max_new_tokens = r.max_new_tokens;
    o.stop_strings = r.stop;
    o.batch_size = std::min<int64_t>(r.batch_size, int64_t(prompts.size()));
    LATHE_ASSIGN_OR_RETURN(o.stop_ids, read_eos_ids(dir));
    if (!r.stop.empty() && !p.tokenizer)
        return failed_precondition_error("--stop needs {}/tokenizer.json to decode text", p.dir);

    size_t longest = 0;
    for (const auto& q : prompts) longest = std::max(longest, q.size());
    const int64_t max_len =
        std::min<int64_t>(config->max_position_embeddings, int64_t(longest) + r.max_new_tokens);
    if (int64_t(longest) >= config->max_position_embeddings) {
        return invalid_argument_error(
            "a prompt of {} tokens leaves no room in the model's {}-token context", longest,
            config->max_position_embeddings);
    }
    Result<Model> made = inference_model_create(*config, procs, r.random_weights, dir);
    if (!made.ok()) return made.status();
    Model model = std::move(*made);
    EngineLimits limits;
    limits.max_sequences = o.batch_size;
    limits.max_len = max_len;
    limits.prefill_chunk = inference_prefill_chunk(r.prefill_chunk, procs, max_len);
    LATHE_ASSIGN_OR_RETURN(limits.decode_gemv, decode_gemv_parse(r.decode_gemv, "--decode-gemv"));
    LATHE_ASSIGN_OR_RETURN(limits.peer_reduce, peer_reduce_parse(r.peer_reduce, "--peer-reduce"));
    LATHE_ASSIGN_OR_RETURN(
        InferenceEngine engine,
        InferenceEngine::create(model, limits, world ? world->comm.get() : nullptr));

    Detokenizer detok;
    if (p.tokenizer) {
        detok = [&p](std::span<const int32_t> ids) { return p.tokenizer->decode(ids, true); };
    }
    // --prompt streams: each time the text grows by whole characters, the new part is printed.
    size_t printed = 0;
    TokenCallback stream;
    if (!r.prompt.empty() && r.output == "-" && rank0) {
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
    if (!rank0) return ok_status();  // rank 0 writes
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
    cmd->add_option("--prefill-chunk", req->prefill_chunk,
                    "Prompt tokens of one prefill forward; 0 = 2048 on CUDA, 256 on the CPU")
        ->capture_default_str();
    cli_add_decode_gemv(cmd, req->decode_gemv);
    cli_add_peer_reduce(cmd, req->peer_reduce);
    cmd->add_option("--batch-size", req->batch_size, "Requests decoded together")
        ->capture_default_str();
    cmd->add_option("--tensor-parallel", req->tensor_parallel,
                    "Processes (GPUs) sharing the model's heads and MLP; must equal the job's "
                    "process count (docs/INFERENCE.md)")
        ->capture_default_str();
    cmd->add_option("--random-weights", req->random_weights,
                    "Draw the weights from this seed instead of reading safetensors (timing a "
                    "shape from its config.json alone; the output is noise)");
    cmd->callback([req, &action] {
        action = [req]() -> Status {
            LATHE_RETURN_IF_ERROR(
                check_output_is_not_input("--output", req->output, "--input", req->input));
            return run_generate(*req);
        };
    });
}

}  // namespace lathe
