// `lathe eval`: model evaluation. `lathe eval loss`: see run/eval_loss.h; `lathe eval bpb`:
// run/eval_bpb.h; `lathe eval tasks`: run/eval_tasks.h.
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "io/file.h"
#include "run/eval_bpb.h"
#include "run/eval_loss.h"
#include "run/eval_tasks.h"

namespace lathe {

void cli_add_eval(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand("eval", "Evaluate a checkpoint");
    cmd->require_subcommand(1);
    auto req = std::make_shared<EvalLossRequest>();
    CLI::App* loss = cmd->add_subcommand(
        "loss",
        "Mean loss over the first N non-overlapping windows of T+1 tokens of a token file read "
        "as one stream; prints one JSON line {loss, perplexity, tokens, ...}");
    loss->add_option(
            "--checkpoint", req->checkpoint,
            "Checkpoint folder (config.json + safetensors), a run folder or its checkpoints/ "
            "folder (the newest checkpoint), or RUN/checkpoints/latest")
        ->required();
    loss->add_option("--data", req->data, "Token-file prefix (PREFIX.bin/.idx)")->required();
    loss->add_option("--seq-len", req->seq_len, "T: predictions per window")->required();
    loss->add_option("--batches", req->batches, "N: windows")->required();
    loss->add_option("--micro-batch", req->micro_batch, "Windows per forward pass (memory only)")
        ->capture_default_str();
    loss->add_option("--threads", req->threads, "CPU threads (0 = all cores)")
        ->capture_default_str()
        ->check(kThreadsRange);
    loss->add_option("--device", req->device, "auto (the GPU when there is one) | cpu | cuda")
        ->capture_default_str();
    loss->callback([req, &action] {
        action = [req]() -> Status {
            LATHE_ASSIGN_OR_RETURN(EvalLossResult r, eval_loss_run(*req));
            std::printf("%s\n", eval_loss_json(*req, r).c_str());
            return ok_status();
        };
    });
    auto bpb_req = std::make_shared<EvalBpbRequest>();
    CLI::App* bpb = cmd->add_subcommand(
        "bpb",
        "Bits per byte of a corpus (.jsonl of {\"text\"} lines, or a text file); prints one "
        "JSON line {bpb, nats, bytes, tokens, ...}");
    bpb->add_option("--checkpoint", bpb_req->checkpoint,
                    "Checkpoint folder with tokenizer.json, a run folder or its checkpoints/")
        ->required();
    bpb->add_option("--data", bpb_req->data, "Corpus: FILE.jsonl ({\"text\"} lines) or a text file")
        ->required();
    bpb->add_option("--seq-len", bpb_req->seq_len, "T: predictions per window")
        ->capture_default_str();
    bpb->add_option("--device", bpb_req->device, "auto | cpu | cuda")->capture_default_str();
    bpb->callback([bpb_req, &action] {
        action = [bpb_req]() -> Status {
            LATHE_ASSIGN_OR_RETURN(EvalBpbResult r, eval_bpb_run(*bpb_req));
            std::printf("%s\n", eval_bpb_json(*bpb_req, r).c_str());
            return ok_status();
        };
    });
    auto tasks_req = std::make_shared<EvalTasksRequest>();
    CLI::App* tasks = cmd->add_subcommand(
        "tasks",
        "Multiple-choice (acc, acc_norm) and generation (exact_match) tasks from task YAML "
        "files, scored as lm-evaluation-harness scores them; prints one JSON line");
    tasks
        ->add_option("--checkpoint", tasks_req->checkpoint,
                     "Checkpoint folder with tokenizer.json, a run folder or its checkpoints/")
        ->required();
    tasks->add_option("--tasks", tasks_req->tasks, "Task YAML file (repeat for several)")
        ->required();
    tasks->add_option("--output", tasks_req->output, "Also write the summary JSON to this file");
    tasks->add_option("--samples", tasks_req->samples,
                      "Per-example JSONL: context, choices, log-likelihoods, scores");
    tasks
        ->add_option("--batch-size", tasks_req->batch_size,
                     "Log-likelihood requests per forward pass (memory; last bits of ties)")
        ->capture_default_str();
    tasks->add_option("--limit", tasks_req->limit, "First N records of each task (0 = all)")
        ->capture_default_str();
    tasks->add_option("--device", tasks_req->device, "auto | cpu | cuda")->capture_default_str();
    tasks->callback([tasks_req, &action] {
        action = [tasks_req]() -> Status {
            const EvalTasksRequest& q = *tasks_req;
            std::error_code ec;
            if (!q.output.empty() && !q.samples.empty() &&
                std::filesystem::weakly_canonical(q.output, ec) ==
                    std::filesystem::weakly_canonical(q.samples, ec))
                return invalid_argument_error(
                    "--output and --samples are both {}: give each output a file of its own",
                    q.output);
            for (const std::string& t : q.tasks)
                for (const auto& [flag, out] :
                     {std::pair{"--output", q.output}, {"--samples", q.samples}})
                    LATHE_RETURN_IF_ERROR(check_output_is_not_input(flag, out, "--tasks", t));
            LATHE_ASSIGN_OR_RETURN(EvalTasksResult r, eval_tasks_run(*tasks_req));
            std::printf("%s\n", eval_tasks_json(*tasks_req, r).c_str());
            return ok_status();
        };
    });
}

}  // namespace lathe
