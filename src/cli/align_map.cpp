// `lathe align map`: stage 4 of vocabulary adaptation, see align/map.h and docs/ALIGN.md.
#include <cstdio>
#include <memory>
#include <string>

#include "align/map.h"
#include "cli/command.h"
#include "io/file.h"

namespace lathe {

void cli_add_align_map(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand(
        "map",
        "Map every target-tokenizer id to a source-tokenizer id (TokAlign: gold pairs from shared "
        "tokens, relative representations over pivots, best match by GEMM + top-2). Writes "
        "TokAlign's JSON map and a per-token report; prints one JSON line");
    struct Options {
        std::string source_tokenizer, target_tokenizer, source_vectors, target_vectors, output,
            report, terms, match = "exact", similarity = "dot", device = "auto";
        int64_t pivots = 300;
        uint64_t seed = 0;
        double threshold = 0.0;
        bool force = false;
    };
    auto o = std::make_shared<Options>();
    cmd->add_option("--source-tokenizer", o->source_tokenizer, "tokenizer.json of the model")
        ->required();
    cmd->add_option("--target-tokenizer", o->target_tokenizer, "tokenizer.json to move to")
        ->required();
    cmd->add_option("--source-vectors", o->source_vectors,
                    "GloVe text vectors of the source token stream (`lathe align embed`)")
        ->required();
    cmd->add_option("--target-vectors", o->target_vectors,
                    "GloVe text vectors of the target token stream")
        ->required();
    cmd->add_option("--output", o->output, "MAP.json to write ({\"target_id\": source_id})")
        ->required();
    cmd->add_option("--report", o->report,
                    "per-token TSV (default: MAP.report.tsv next to MAP.json)");
    cmd->add_option(
        "--terms", o->terms,
        "terms TSV of `lathe align terms`: these target tokens get FVT rows in `align apply`");
    cmd->add_option("--pivots", o->pivots, "gold pairs used as pivots (default 300)");
    cmd->add_option("--seed", o->seed, "seed of the pivot draw (default 0)");
    cmd->add_option(
           "--match", o->match,
           "gold pairs: exact (TokAlign) or byte-level-aware (also Ġ / ▁ / <0xNN> spellings of the "
           "same bytes)")
        ->check(CLI::IsMember({"exact", "byte-level-aware"}));
    cmd->add_option("--similarity", o->similarity,
                    "dot (TokAlign: product of relative representations) or cosine")
        ->check(CLI::IsMember({"dot", "cosine"}));
    CLI::Option* threshold = cmd->add_option(
        "--threshold", o->threshold, "below this similarity a token is initialised by FVT instead");
    cmd->add_option("--device", o->device, "auto | cpu | cuda (auto: the GPU when there is one)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->add_flag("--force", o->force, "recompute even when the outputs are up to date");
    cmd->callback([o, threshold, &action] {
        action = [o, threshold]() -> Status {
            for (const auto& [flag, in] : {std::pair{"--source-tokenizer", o->source_tokenizer},
                                           {"--target-tokenizer", o->target_tokenizer},
                                           {"--source-vectors", o->source_vectors},
                                           {"--target-vectors", o->target_vectors},
                                           {"--terms", o->terms}})
                LATHE_RETURN_IF_ERROR(check_output_is_not_input("--output", o->output, flag, in));
            AlignMapRequest req;
            req.source_tokenizer = o->source_tokenizer;
            req.target_tokenizer = o->target_tokenizer;
            req.source_vectors = o->source_vectors;
            req.target_vectors = o->target_vectors;
            req.output = o->output;
            req.report = o->report;
            req.terms = o->terms;
            req.pivots = o->pivots;
            req.seed = o->seed;
            req.match = o->match == "exact" ? AlignMatch::kExact : AlignMatch::kByteLevelAware;
            req.similarity =
                o->similarity == "dot" ? AlignSimilarity::kDot : AlignSimilarity::kCosine;
            if (threshold->count() > 0) req.threshold = o->threshold;
            req.device = o->device == "cpu"    ? AlignDevice::kCpu
                         : o->device == "cuda" ? AlignDevice::kCuda
                                               : AlignDevice::kAuto;
            req.force = o->force;
            LATHE_ASSIGN_OR_RETURN(AlignMapResult r, align_map_run(req));
            std::printf("%s\n", align_map_result_json(r).c_str());
            return ok_status();
        };
    });
}

}  // namespace lathe
