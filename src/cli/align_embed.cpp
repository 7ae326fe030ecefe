// `lathe align embed`: stage 3 of vocabulary adaptation (align/embed.h, docs/ALIGN.md).
//
//   lathe align embed --tokens PREFIX --output VEC.txt [--method glove|sgns] [--dim 300]
//                     [--window 15|5] [--min-count 5] [--iters 15] [--x-max 10] [--alpha 0.75]
//                     [--lr 0.05] [--negative 5] [--subsample 1e-4] [--threads N]
//                     [--device auto|cpu|cuda] [--seed 1] [--memory-gb 8] [--force]
//
// Writes VEC.txt (GloVe text: "<token id> v1 ... vD" per token seen >= min-count times) and its
// stage manifest VEC.txt.stage.json; with unchanged inputs and settings a second run does nothing.

#include <cstdio>
#include <memory>

#include "align/embed.h"
#include "cli/command.h"
#include "core/progress.h"
#include "io/file.h"

namespace lathe {

namespace {

void print_embed_report(const EmbedOptions& o, const EmbedReport& r) {
    if (r.skipped) {
        std::printf("align embed: up to date: %s\n", o.output.c_str());
        std::fflush(stdout);
        return;
    }
    std::printf("align embed: wrote %s\n", o.output.c_str());
    std::printf("  method: %s on %s\n", embed_method_name(o.method), r.device.c_str());
    std::printf("  corpus: %lld tokens in %lld documents\n",
                static_cast<long long>(r.corpus_tokens), static_cast<long long>(r.documents));
    std::printf("  vectors: %lld tokens x %lld dimensions\n", static_cast<long long>(r.vocab),
                static_cast<long long>(o.dim));
    if (o.method == EmbedMethod::kGlove) {
        std::printf("  co-occurrence entries: %lld\n", static_cast<long long>(r.entries));
        std::printf("  final cost: %.6f\n", r.final_cost);
    } else {
        std::printf("  tokens per epoch: %lld\n", static_cast<long long>(r.entries));
        std::printf("  final loss: %.6f\n", r.final_cost);
    }
    std::printf("  time: %.2f s (counting %.2f s, training %.2f s, writing %.2f s)\n",
                r.total_seconds, r.count_seconds, r.train_seconds, r.write_seconds);
    std::fflush(stdout);
}

}  // namespace

void cli_add_align_embed(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand(
        "embed", "Stage 3: token embeddings (GloVe or skip-gram) of a token file, GloVe text out");
    auto opts = std::make_shared<EmbedOptions>();
    auto method = std::make_shared<std::string>("glove");
    auto device = std::make_shared<std::string>("auto");
    auto memory_gb = std::make_shared<double>(8.0);

    cmd->add_option("--tokens", opts->tokens, "Token file prefix (PREFIX.bin / PREFIX.idx)")
        ->required();
    cmd->add_option("--output", opts->output, "Vectors to write (GloVe text format)")->required();
    cmd->add_option("--method", *method, "glove (TokAlign's) or sgns (fastText skip-gram)")
        ->capture_default_str();
    cmd->add_option("--dim", opts->dim, "Vector dimensions")->capture_default_str();
    cmd->add_option("--window", opts->window,
                    "Context tokens on each side (default: glove 15, sgns 5)");
    cmd->add_option("--min-count", opts->min_count, "Keep token ids seen at least this often")
        ->capture_default_str();
    cmd->add_option("--iters,--epochs", opts->iters, "GloVe iterations / skip-gram epochs")
        ->capture_default_str();
    cmd->add_option("--x-max", opts->x_max, "GloVe: weighting cutoff")->capture_default_str();
    cmd->add_option("--alpha", opts->alpha, "GloVe: weighting exponent")->capture_default_str();
    cmd->add_option("--lr", opts->lr, "Initial learning rate (default 0.05 for both)");
    cmd->add_option("--negative", opts->negative, "Skip-gram: negatives per context")
        ->capture_default_str();
    cmd->add_option("--subsample", opts->subsample, "Skip-gram: subsampling threshold t")
        ->capture_default_str();
    cmd->add_option("--threads", opts->threads, "CPU threads (default: all cores)")
        ->check(kThreadsRange);
    cmd->add_option("--device", *device, "auto (the GPU when there is one), cpu or cuda")
        ->capture_default_str();
    cmd->add_option("--seed", opts->seed, "Seed of initialisation, shuffling and sampling")
        ->capture_default_str();
    cmd->add_option("--memory-gb", *memory_gb,
                    "GloVe: memory for the co-occurrence tables (soft limit)")
        ->capture_default_str();
    cmd->add_flag("--force", opts->force, "Run even when the output is up to date");

    cmd->callback([=, &action] {
        action = [=]() -> Status {
            EmbedOptions o = *opts;
            for (const char* ext : {".bin", ".idx"})
                LATHE_RETURN_IF_ERROR(
                    check_output_is_not_input("--output", o.output, "--tokens", o.tokens + ext));
            LATHE_ASSIGN_OR_RETURN(o.method, embed_method_from_name(*method));
            LATHE_ASSIGN_OR_RETURN(o.device, embed_device_from_name(*device));
            if (!(*memory_gb > 0))
                return invalid_argument_error("--memory-gb {}: must be > 0", *memory_gb);
            o.memory_bytes = uint64_t(*memory_gb * double(uint64_t{1} << 30));
            LATHE_ASSIGN_OR_RETURN(EmbedReport report, embed_tokens(o));
            print_embed_report(o, report);
            return ok_status();
        };
    });
}

}  // namespace lathe
