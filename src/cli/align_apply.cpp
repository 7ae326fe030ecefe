// `lathe align apply`: stage 5 of vocabulary adaptation, see align/apply.h and docs/ALIGN.md.
#include <cstdio>
#include <memory>
#include <string>

#include "align/apply.h"
#include "cli/command.h"

namespace lathe {

void cli_add_align_apply(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand(
        "apply",
        "Write a checkpoint with the target tokenizer: embedding (and untied head) rows gathered "
        "through the map, FVT for unseen tokens and terms, or a baseline init; prints one JSON "
        "line");
    struct Options {
        std::string checkpoint, map, report, target_tokenizer, source_tokenizer, output,
            init = "align", fvt_weighting = "mean";
        int64_t pad_to_multiple = 0;
        double align_weight = 0.25, align_head_weight = 0.25;
        uint64_t seed = 0;
        bool overwrite = false;
    };
    auto o = std::make_shared<Options>();
    cmd->add_option("--checkpoint", o->checkpoint,
                    "source model: HF folder, lathe checkpoint or run folder")
        ->required();
    cmd->add_option("--map", o->map, "MAP.json of `lathe align map` (needed by --init align)");
    cmd->add_option("--report", o->report,
                    "the map's report TSV (default: beside MAP.json, when there)");
    cmd->add_option("--target-tokenizer", o->target_tokenizer,
                    "tokenizer.json of the new vocabulary")
        ->required();
    cmd->add_option("--source-tokenizer", o->source_tokenizer,
                    "the model's tokenizer.json (default: the checkpoint's)");
    cmd->add_option("--output", o->output, "folder to create (a Hugging Face checkpoint)")
        ->required();
    cmd->add_option("--init", o->init,
                    "align (map + FVT for unseen/terms), fvt (shared strings + FVT), mean, random")
        ->check(CLI::IsMember({"align", "fvt", "mean", "random"}));
    cmd->add_option(
           "--fvt-weighting", o->fvt_weighting,
           "mean of the pieces, or exponential (AdaptiVocab: input leans on the last piece, "
           "output on the first)")
        ->check(CLI::IsMember({"mean", "exponential"}));
    cmd->add_option(
        "--align-weight", o->align_weight,
        "--init align: an aligned id's embedding row = W x its source row + (1 - W) x its FVT "
        "row (default 0.25, chosen in docs/ALIGN.md's quality study; 1 = TokAlign's gather)");
    cmd->add_option("--align-head-weight", o->align_head_weight,
                    "the same for the untied output head's row (default 0.25)");
    CLI::Option* pad =
        cmd->add_option("--pad-to-multiple", o->pad_to_multiple,
                        "embedding rows rounded up to this multiple (default: as the family pads)");
    cmd->add_option("--seed", o->seed, "seed of the noise of --init mean / random");
    cmd->add_flag("--overwrite", o->overwrite, "replace --output if it exists and is not empty");
    cmd->callback([o, pad, &action] {
        action = [o, pad]() -> Status {
            AlignApplyRequest req;
            req.checkpoint = o->checkpoint;
            req.map = o->map;
            req.report = o->report;
            req.target_tokenizer = o->target_tokenizer;
            req.source_tokenizer = o->source_tokenizer;
            req.output = o->output;
            req.init = o->init == "align"  ? AlignInit::kAlign
                       : o->init == "fvt"  ? AlignInit::kFvt
                       : o->init == "mean" ? AlignInit::kMean
                                           : AlignInit::kRandom;
            req.fvt_weighting = o->fvt_weighting == "exponential" ? FvtWeighting::kExponential
                                                                  : FvtWeighting::kMean;
            req.align_weight = o->align_weight;
            req.align_head_weight = o->align_head_weight;
            if (pad->count() > 0) req.pad_to_multiple = o->pad_to_multiple;
            req.seed = o->seed;
            req.overwrite = o->overwrite;
            LATHE_ASSIGN_OR_RETURN(AlignApplyResult r, align_apply_run(req));
            std::printf("%s\n", align_apply_result_json(r).c_str());
            return ok_status();
        };
    });
}

}  // namespace lathe
