// `lathe align terms`: stage 1 of vocabulary adaptation (align/terms.h, docs/ALIGN.md).
//
//   lathe align terms --tokenizer S.json --corpus DOMAIN... [--general GENERAL...] --output T.json
//                     [--top-k 2000] [--min-count 5] [--max-ngram 3] [--format auto] [--json-key
//                     text]
//
// Writes T.json (the source with the mined terms as added tokens), T.terms.tsv (id, term, count,
// pieces, score) and T.new_tokens.json (new ids, their text and source ids), then the stage
// manifest T.json.stage.json; with unchanged inputs and settings a second run does nothing.

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>

#include "align/terms.h"
#include "cli/command.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {

namespace {

std::atomic<bool>& align_terms_interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

extern "C" void align_terms_on_signal(int) {
    align_terms_interrupt_flag().store(true);
}

// SIGINT/SIGTERM stop the run cleanly (no outputs under their final names); one-shot handlers,
// so a second Ctrl-C ends the process at once.
void align_terms_install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = align_terms_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

void print_terms_report(const TermsReport& r, size_t show) {
    if (r.skipped_up_to_date) {
        std::printf("align terms: up to date: %s\n", r.outputs.front().c_str());
        return;
    }
    std::printf("align terms: wrote %s\n", r.outputs.front().c_str());
    for (size_t i = 1; i < r.outputs.size(); ++i) std::printf("  also: %s\n", r.outputs[i].c_str());
    std::printf("  terms: %zu (ids %d..%d; vocab %d -> %d)\n", r.terms.size(), r.source_vocab_size,
                r.target_vocab_size - 1, r.source_vocab_size, r.target_vocab_size);
    std::printf("  domain corpus: %llu documents, %llu pieces, %s, %llu candidates\n",
                static_cast<unsigned long long>(r.documents),
                static_cast<unsigned long long>(r.pieces),
                Progress::format_bytes(static_cast<double>(r.input_bytes)).c_str(),
                static_cast<unsigned long long>(r.candidates));
    if (r.general_documents > 0) {
        std::printf("  general corpus: %llu documents, %llu pieces\n",
                    static_cast<unsigned long long>(r.general_documents),
                    static_cast<unsigned long long>(r.general_pieces));
    }
    if (r.skipped > 0) {
        std::printf("  skipped: %llu bad documents\n", static_cast<unsigned long long>(r.skipped));
    }
    if (r.pruned > 0) {
        std::printf("  pruned: %d times (floor %llu): counts are approximate\n", r.pruned,
                    static_cast<unsigned long long>(r.prune_floor));
    }
    std::printf("  time: %.2f s (counting %.2f s, %.2f MB/s)\n", r.seconds, r.count_seconds,
                static_cast<double>(r.input_bytes) / 1e6 / std::max(r.count_seconds, 1e-9));
    for (size_t i = 0; i < std::min(show, r.terms.size()); ++i) {
        const Term& t = r.terms[i];
        std::printf("  %2zu. %-32s count %llu, %zu pieces, score %.1f\n", i + 1,
                    escape_for_message(t.text, 40).c_str(),
                    static_cast<unsigned long long>(t.count), t.source_ids.size(), t.score);
    }
    std::fflush(stdout);
}

}  // namespace

void cli_add_align_terms(CLI::App& align, CommandAction& action) {
    CLI::App* cmd = align.add_subcommand(
        "terms", "Stage 1: mine domain terms and write a target tokenizer.json that has them");
    auto opts = std::make_shared<TermsOptions>();
    auto format = std::make_shared<std::string>("auto");
    auto on_error = std::make_shared<std::string>("fail");
    auto no_progress = std::make_shared<bool>(false);
    auto show = std::make_shared<size_t>(10);

    cmd->add_option("--tokenizer,--source-tokenizer", opts->source_tokenizer,
                    "Source tokenizer.json (byte-level BPE)")
        ->required();
    cmd->add_option("--corpus", opts->corpus, "Domain corpus files (text or JSONL; gzip, zstd)")
        ->required();
    cmd->add_option("--general", opts->general_corpus,
                    "General corpus files: score x log(p_domain / p_general)");
    cmd->add_option("--output", opts->output, "Target tokenizer.json to write")->required();
    cmd->add_option("--report", opts->report, "TSV report (default <output stem>.terms.tsv)");
    cmd->add_option("--new-tokens", opts->new_tokens,
                    "JSON list of new ids (default <output stem>.new_tokens.json)");
    cmd->add_option("--top-k", opts->top_k, "Terms to keep")->capture_default_str();
    cmd->add_option("--min-count", opts->min_count, "Minimum count in the domain corpus")
        ->capture_default_str();
    cmd->add_option("--max-ngram", opts->max_ngram, "Longest word n-gram (1..3)")
        ->capture_default_str();
    cmd->add_option("--smoothing", opts->smoothing,
                    "Added to general-corpus counts (terms absent from it)")
        ->capture_default_str();
    cmd->add_option("--format", *format, "auto, text, text-blocks or jsonl")->capture_default_str();
    cmd->add_option("--json-key", opts->json_key, "JSONL field holding the document")
        ->capture_default_str();
    cmd->add_option("--on-error", *on_error,
                    "fail: stop at the first bad document; skip: count and skip it")
        ->capture_default_str();
    cmd->add_option("--max-table-entries", opts->max_table_entries,
                    "Prune the candidate table above this many entries (bounds memory)")
        ->capture_default_str();
    cmd->add_option("--threads", opts->threads, "Worker threads (default: all cores)")
        ->check(kThreadsRange);
    cmd->add_flag("--force", opts->force, "Run even when the outputs are up to date");
    cmd->add_option("--show", *show, "Top terms to print")->capture_default_str();
    cmd->add_flag("--no-progress", *no_progress, "Do not show the progress display");

    cmd->callback([=, &action] {
        action = [=]() -> Status {
            TermsOptions o = *opts;
            LATHE_RETURN_IF_ERROR(
                check_output_is_not_input("--output", o.output, "--tokenizer", o.source_tokenizer));
            for (const auto* list : {&o.corpus, &o.general_corpus})
                for (const std::string& in : *list)
                    LATHE_RETURN_IF_ERROR(
                        check_output_is_not_input("--output", o.output, "corpus", in));
            LATHE_ASSIGN_OR_RETURN(o.format, terms_format_from_name(*format));
            if (*on_error == "fail") {
                o.skip_bad_documents = false;
            } else if (*on_error == "skip") {
                o.skip_bad_documents = true;
            } else {
                return invalid_argument_error("--on-error {}: expected fail or skip", *on_error);
            }
            o.show_progress = !*no_progress && log_level() <= LogLevel::kInfo;
            align_terms_install_signal_handlers();
            o.cancel = &align_terms_interrupt_flag();
            LATHE_ASSIGN_OR_RETURN(const TermsReport report, align_terms_run(o));
            print_terms_report(report, *show);
            return ok_status();
        };
    });
}

}  // namespace lathe
