// `lathe align eval`: stage 6 of vocabulary adaptation, see align/eval.h and docs/ALIGN.md.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "align/eval.h"
#include "cli/command.h"
#include "run/compute_device.h"

namespace lathe {

void cli_add_align_eval(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand("eval",
                                         "On held-out documents: TokAlign's alignment score "
                                         "(BLEU-1), tokens per byte of tokenizers, "
                                         "bits per byte of checkpoints; prints one JSON line");
    struct Options {
        std::string documents, format = "lines", map, source_tokenizer, target_tokenizer,
                               device = "auto";
        std::vector<std::string> tokenizers, checkpoints;
        int64_t max_documents = 0, seq_len = 512, batch = 4;
    };
    auto o = std::make_shared<Options>();
    cmd->add_option("--documents", o->documents, "held-out text (plain, gzip or zstd)")->required();
    cmd->add_option("--format", o->format,
                    "lines (one document per line) or blocks (blank-line separated)")
        ->check(CLI::IsMember({"lines", "blocks"}));
    cmd->add_option("--max-documents", o->max_documents,
                    "use only the first N documents (0 = all)");
    cmd->add_option("--map", o->map,
                    "MAP.json to score (with --source-tokenizer and --target-tokenizer)");
    cmd->add_option("--source-tokenizer", o->source_tokenizer, "tokenizer.json the map maps to");
    cmd->add_option("--target-tokenizer", o->target_tokenizer, "tokenizer.json the map maps from");
    cmd->add_option("--tokenizer", o->tokenizers,
                    "tokenizer.json to measure tokens per byte of (repeatable)");
    cmd->add_option("--checkpoint", o->checkpoints,
                    "model folder to measure bits per byte of (repeatable)");
    cmd->add_option("--seq-len", o->seq_len, "window length T for bits per byte (default 512)");
    cmd->add_option("--batch", o->batch, "windows per forward pass (memory only; default 4)");
    cmd->add_option("--device", o->device,
                    "where the models run: auto (the GPU when there is one) | cpu | cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->callback([o, &action] {
        action = [o]() -> Status {
            AlignEvalRequest req;
            req.documents = o->documents;
            req.format =
                o->format == "blocks" ? TextRecordFormat::kBlocks : TextRecordFormat::kLines;
            req.max_documents = o->max_documents;
            req.map = o->map;
            req.source_tokenizer = o->source_tokenizer;
            req.target_tokenizer = o->target_tokenizer;
            req.tokenizers = o->tokenizers;
            req.checkpoints = o->checkpoints;
            req.seq_len = o->seq_len;
            req.batch = o->batch;
            // Opened only when a model is measured: the other measures need no device.
            ComputeDevice device;
            if (!req.checkpoints.empty()) {
                LATHE_ASSIGN_OR_RETURN(device, ComputeDevice::open(o->device, "--device"));
            }
            LATHE_ASSIGN_OR_RETURN(AlignEvalResult r, align_eval_run(device.context(), req));
            std::printf("%s\n", align_eval_result_json(r).c_str());
            return ok_status();
        };
    });
}

}  // namespace lathe
