// `lathe convert INPUT_DIR OUTPUT_DIR --to hf|lathe`: see run/convert.h.
#include "run/convert.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/command.h"
#include "run/checkpoint_dir.h"

namespace lathe {

void cli_add_convert(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand(
        "convert",
        "Convert a checkpoint between a Hugging Face folder and a lathe checkpoint (the input's "
        "kind is detected; a lathe run folder or its checkpoints/ folder means its newest "
        "checkpoint, checkpoints/latest the one it names). Prints one JSON line describing what "
        "was written");
    struct Options {
        std::string input, output, to, dtype, max_shard_size;
        bool overwrite = false;
    };
    auto o = std::make_shared<Options>();
    cmd->add_option("INPUT_DIR", o->input,
                    "HF folder, lathe checkpoint, lathe run folder, RUN/checkpoints or "
                    "RUN/checkpoints/latest")
        ->required();
    cmd->add_option("OUTPUT_DIR", o->output,
                    "Folder to create (written aside, renamed when complete)")
        ->required();
    cmd->add_option("--to", o->to, "Output format: hf (transformers / vLLM) or lathe (trainable)")
        ->required()
        ->check(CLI::IsMember({"hf", "lathe"}));
    cmd->add_option("--dtype", o->dtype,
                    "Weights written: fp32, bf16 or fp16 (default bf16 for --to hf; lathe "
                    "checkpoints are fp32)");
    cmd->add_option("--max-shard-size", o->max_shard_size,
                    "Shard limit, e.g. 5GB, 500MB, 2GiB; 0 = one file (default 5GB for --to hf, "
                    "one file for --to lathe)");
    cmd->add_flag("--overwrite", o->overwrite, "Replace OUTPUT_DIR if it exists and is not empty");
    cmd->callback([o, &action] {
        action = [o]() -> Status {
            ConvertRequest req;
            // The checkpoint INPUT_DIR means, so that errors name the argument.
            const Result<std::filesystem::path> input = resolve_checkpoint(o->input);
            if (!input.ok()) return input.status().with_context("INPUT_DIR");
            req.input = input->string();
            req.output = o->output;
            req.to = o->to == "lathe" ? CheckpointFormat::kLathe : CheckpointFormat::kHf;
            if (!o->dtype.empty()) {
                LATHE_ASSIGN_OR_RETURN(req.dtype, convert_parse_dtype(o->dtype));
            }
            if (!o->max_shard_size.empty()) {
                LATHE_ASSIGN_OR_RETURN(req.max_shard_bytes, convert_parse_size(o->max_shard_size));
            }
            req.overwrite = o->overwrite;
            LATHE_ASSIGN_OR_RETURN(ConvertResult r, convert_run(req));
            std::printf("%s\n", convert_result_json(r).c_str());
            return ok_status();
        };
    });
}

}  // namespace lathe
