#include "align/pipeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include "align/apply.h"
#include "align/embed.h"
#include "align/eval.h"
#include "align/map.h"
#include "align/stage_cache.h"
#include "align/terms.h"
#include "core/log.h"
#include "data/prepare.h"
#include "io/file.h"
#include "model/registry.h"
#include "ops/device_info.h"
#include "run/compute_device.h"
#include "run/convert.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string join_path(const std::string& dir, const std::string& name) {
    return (std::filesystem::path(dir) / name).string();
}

Status make_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return io_error("{}: cannot create the folder: {}", dir, ec.message());
    return ok_status();
}

// A value chosen from a fixed set of names; an error names the key, where it was set and the
// choices.
Result<std::string> choice(const Config& c, std::string_view key,
                           std::initializer_list<std::string_view> allowed) {
    const std::string v = c.get_string(key);
    for (std::string_view a : allowed) {
        if (v == a) return v;
    }
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    return invalid_argument_error("{} ({}): '{}' is not one of {}", key, c.source_of(key), v, list);
}

std::string optional_string(const Config& c, std::string_view key) {
    return c.has(key) ? c.get_string(key) : std::string();
}

// "key (file:line)": where an error message says the value came from.
std::string where(const Config& c, std::string_view key) {
    return fmt::format("{} ({})", key, c.source_of(key));
}

// An input file named by `key`: it exists, is a file (not a folder) and can be opened for reading.
Status check_input_file(const Config& c, std::string_view key, const std::string& path,
                        std::string_view expected) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st))
        return not_found_error("{}: {} does not exist; expected {}", where(c, key), path, expected);
    if (fs::is_directory(st))
        return invalid_argument_error("{}: {} is a folder; expected {}", where(c, key), path,
                                      expected);
    if (!fs::is_regular_file(st))
        return invalid_argument_error("{}: {} is not a regular file; expected {}", where(c, key),
                                      path, expected);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return io_error("{}: {} cannot be read: {}", where(c, key), path, std::strerror(errno));
    }
    ::close(fd);
    return ok_status();
}

// A tokenizer.json named by `key`: readable, and loads as a tokenizer. Returns its size.
Result<int64_t> check_tokenizer(const Config& c, std::string_view key, const std::string& path) {
    LATHE_RETURN_IF_ERROR(check_input_file(c, key, path, "a Hugging Face tokenizer.json"));
    auto tok = Tokenizer::load(path);
    if (!tok.ok()) {
        return tok.status().with_context(
            fmt::format("{}: expected a Hugging Face tokenizer.json", where(c, key)));
    }
    return tok->vocab_size();
}

// An integer setting within [lo, hi].
Status check_range(const Config& c, std::string_view key, int64_t lo, int64_t hi) {
    const int64_t v = c.get_int(key);
    if (v < lo || v > hi) {
        if (hi == std::numeric_limits<int64_t>::max())
            return invalid_argument_error("{}: {} must be at least {}", where(c, key), v, lo);
        if (hi >= std::numeric_limits<int>::max()) {
            return invalid_argument_error("{}: {} must be at least {} (and at most {})",
                                          where(c, key), v, lo, hi);
        }
        return invalid_argument_error("{}: {} must be in [{}, {}]", where(c, key), v, lo, hi);
    }
    return ok_status();
}

// The folder every output goes under: an existing folder, or one that can be made inside the
// nearest existing folder above it; writable either way.
Status check_work_dir(const Config& c, const std::string& work) {
    std::error_code ec;
    fs::path p = fs::absolute(work, ec);
    if (ec)
        return invalid_argument_error("{}: '{}': {}", where(c, "align.work_dir"), work,
                                      ec.message());
    if (fs::exists(p, ec) && !fs::is_directory(p, ec))
        return invalid_argument_error("{}: {} exists and is not a folder",
                                      where(c, "align.work_dir"), work);
    while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
    if (!fs::is_directory(p, ec)) {
        return invalid_argument_error("{}: {} cannot be made: {} is not a folder",
                                      where(c, "align.work_dir"), work, p.string());
    }
    if (::access(p.c_str(), W_OK | X_OK) != 0) {
        return io_error("{}: {} cannot be written: {}: {}", where(c, "align.work_dir"), work,
                        p.string(), std::strerror(errno));
    }
    return ok_status();
}

// Every path and setting of the run, checked before stage 1 writes anything: each input file
// exists and is readable, the tokenizers load, the source checkpoint resolves and matches its
// tokenizer and the eval window, numbers are in range, the devices asked for exist. Errors name
// the key and the file and line that set it.
Status check_run_config(const Config& c, const AlignRunOptions& options) {
    LATHE_RETURN_IF_ERROR(check_work_dir(c, c.get_string("align.work_dir")));
    if (options.threads <= 0) {
        LATHE_RETURN_IF_ERROR(check_range(c, "align.threads", 0, std::numeric_limits<int>::max()));
    }
    // ---- input files ----
    const std::vector<std::string> corpus = c.get_string_list("corpus.inputs");
    if (corpus.empty()) return invalid_argument_error("{}: no files", where(c, "corpus.inputs"));
    for (const std::string& f : corpus) {
        LATHE_RETURN_IF_ERROR(
            check_input_file(c, "corpus.inputs", f, "a corpus file (text or JSONL, gzip/zstd)"));
    }
    for (const char* key : {"terms.corpus", "terms.general"}) {
        for (const std::string& f : c.get_string_list(key)) {
            LATHE_RETURN_IF_ERROR(
                check_input_file(c, key, f, "a corpus file (text or JSONL, gzip/zstd)"));
        }
    }
    LATHE_ASSIGN_OR_RETURN(
        const int64_t source_vocab,
        check_tokenizer(c, "source.tokenizer", c.get_string("source.tokenizer")));
    const std::string given_target = optional_string(c, "target.tokenizer");
    if (!given_target.empty())
        LATHE_RETURN_IF_ERROR(check_tokenizer(c, "target.tokenizer", given_target).status());
    if (c.get_bool("terms.enabled")) {
        // Stage 1 adds terms to the target tokenizer when given, else to the source's.
        const char* key = given_target.empty() ? "source.tokenizer" : "target.tokenizer";
        const Status ok = align_terms_check_tokenizer(c.get_string(key));
        if (!ok.ok()) {
            return ok.with_context(
                fmt::format("{} (terms are added to it; terms.enabled: false uses it as it is)",
                            where(c, key)));
        }
    }
    const std::string documents = optional_string(c, "eval.documents");
    if (!documents.empty()) {
        LATHE_RETURN_IF_ERROR(check_input_file(c, "eval.documents", documents,
                                               "held-out text, one document per line or block"));
    }
    // ---- the source model ----
    const std::string checkpoint = optional_string(c, "source.checkpoint");
    if (!checkpoint.empty()) {
        auto src = convert_find_source(checkpoint);
        if (!src.ok()) return src.status().with_context(where(c, "source.checkpoint"));
        const std::string config_path = (fs::path(src->dir) / "config.json").string();
        auto model = model_config_from_hf_file(config_path);
        if (!model.ok()) return model.status().with_context(where(c, "source.checkpoint"));
        if (source_vocab > model->vocab_size) {
            return invalid_argument_error(
                "{}: {} has {} embedding rows but {} ({}) has {} ids: the model was not trained "
                "with this tokenizer",
                where(c, "source.checkpoint"), checkpoint, model->vocab_size,
                c.get_string("source.tokenizer"), where(c, "source.tokenizer"), source_vocab);
        }
        if (!documents.empty()) {
            const std::string own = (fs::path(src->dir) / "tokenizer.json").string();
            if (!file_exists(own)) {
                return invalid_argument_error(
                    "{}: {} has no tokenizer.json, which eval's bits per byte of the source model "
                    "reads (copy the model's tokenizer.json there)",
                    where(c, "source.checkpoint"), src->dir);
            }
            if (c.get_int("eval.seq_len") > model->max_position_embeddings) {
                return invalid_argument_error(
                    "{}: {} exceeds the source model's max_position_embeddings {} ({})",
                    where(c, "eval.seq_len"), c.get_int("eval.seq_len"),
                    model->max_position_embeddings, config_path);
            }
        }
    }
    // ---- settings ----
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    LATHE_RETURN_IF_ERROR(check_range(c, "terms.top_k", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "terms.min_count", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "terms.max_ngram", 1, 3));
    LATHE_RETURN_IF_ERROR(check_range(c, "terms.max_table_entries", 1, kMax));
    if (!(c.get_float("terms.smoothing") > 0.0)) {
        return invalid_argument_error("{}: {} must be positive", where(c, "terms.smoothing"),
                                      c.get_float("terms.smoothing"));
    }
    LATHE_RETURN_IF_ERROR(check_range(c, "embed.dim", 1, 4096));
    LATHE_RETURN_IF_ERROR(check_range(c, "embed.window", 0, 1000));
    LATHE_RETURN_IF_ERROR(check_range(c, "embed.min_count", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "embed.iters", 1, std::numeric_limits<int>::max()));
    LATHE_RETURN_IF_ERROR(check_range(c, "embed.seed", 0, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "map.pivots", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "map.seed", 0, kMax));
    if (c.has("map.threshold") && !std::isfinite(c.get_float("map.threshold"))) {
        return invalid_argument_error("{}: {} is not a finite number", where(c, "map.threshold"),
                                      c.get_float("map.threshold"));
    }
    for (const char* key : {"apply.align_weight", "apply.align_head_weight"}) {
        const double w = c.get_float(key);
        if (!(w >= 0.0 && w <= 1.0)) {
            return invalid_argument_error(
                "{}: {} must be in [0, 1] (1 = the aligned source row, 0 = the FVT row)",
                where(c, key), w);
        }
    }
    if (c.has("apply.pad_to_multiple"))
        LATHE_RETURN_IF_ERROR(check_range(c, "apply.pad_to_multiple", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "apply.seed", 0, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "eval.max_documents", 0, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "eval.seq_len", 1, kMax));
    LATHE_RETURN_IF_ERROR(check_range(c, "eval.batch", 1, kMax));
    // ---- devices ----
    for (const char* key : {"embed.device", "map.device"}) {
        if (c.get_string(key) != "cuda") continue;
        const std::string why = embed_cuda_unusable_reason(gpu_environment_probe(0));
        if (!why.empty())
            return failed_precondition_error("{}: cuda: {}; use cpu or auto", where(c, key), why);
    }
    return ok_status();
}

}  // namespace

ConfigSchema align_run_config_schema() {
    ConfigSchema s;
    // ---- the run ----
    s.add({"align.work_dir", ConfigType::kString, "", "folder for every stage's outputs", true});
    s.add({"align.threads", ConfigType::kInt, "0", "CPU threads for every stage; 0 = all cores"});
    s.add({"align.force", ConfigType::kBool, "false",
           "rerun every stage even when its outputs are up to date"});
    // ---- the source model ----
    s.add({"source.tokenizer", ConfigType::kString, "", "the source model's tokenizer.json", true});
    s.add({"source.checkpoint", ConfigType::kString, "",
           "the source model (HF folder or lathe checkpoint): enables apply and bits/byte"});
    // ---- the target ----
    s.add({"target.tokenizer", ConfigType::kString, "",
           "target tokenizer.json; stage 1 adds terms to it (default: to source.tokenizer)"});
    // ---- the corpus (stages 1-3) ----
    s.add({"corpus.inputs", ConfigType::kStringList, "",
           "domain corpus files: text or JSONL, gzip/zstd", true});
    s.add({"corpus.format", ConfigType::kString, "auto", "auto | text | text-blocks | jsonl"});
    s.add({"corpus.json_key", ConfigType::kString, "text", "JSONL field holding the document"});
    s.add({"corpus.on_error", ConfigType::kString, "fail",
           "fail | skip: what a bad document (domain or general corpus) does"});
    // ---- stage 1: terms ----
    s.add({"terms.enabled", ConfigType::kBool, "true",
           "mine domain terms into the target tokenizer"});
    s.add({"terms.corpus", ConfigType::kStringList, "[]",
           "domain corpus files to mine terms from; default: corpus.inputs"});
    s.add({"terms.general", ConfigType::kStringList, "[]",
           "general corpus files: score x log(p_domain / p_general)"});
    s.add({"terms.top_k", ConfigType::kInt, "2000", "terms to add"});
    s.add({"terms.min_count", ConfigType::kInt, "5", "minimum count in the domain corpus"});
    s.add({"terms.max_ngram", ConfigType::kInt, "3", "longest word n-gram (1..3)"});
    s.add({"terms.smoothing", ConfigType::kFloat, "0.5", "added to general-corpus counts"});
    s.add({"terms.max_table_entries", ConfigType::kInt, "16777216",
           "candidate table size before pruning"});
    // ---- stage 3: embed ----
    s.add({"embed.method", ConfigType::kString, "glove", "glove | sgns"});
    s.add({"embed.dim", ConfigType::kInt, "300", "vector dimensions"});
    s.add({"embed.window", ConfigType::kInt, "0",
           "context window; 0 = the method's default (GloVe 15, SGNS 5)"});
    s.add({"embed.min_count", ConfigType::kInt, "5", "tokens seen fewer times get no vector"});
    s.add({"embed.iters", ConfigType::kInt, "15", "GloVe iterations / SGNS epochs"});
    s.add({"embed.device", ConfigType::kString, "auto", "auto | cpu | cuda"});
    s.add({"embed.seed", ConfigType::kInt, "1", "random seed"});
    // ---- stage 4: map ----
    s.add({"map.pivots", ConfigType::kInt, "300", "gold pairs used as pivots"});
    s.add({"map.seed", ConfigType::kInt, "0", "seed of the pivot choice"});
    s.add({"map.match", ConfigType::kString, "exact",
           "exact | byte-level-aware (gold pairs across Ġ / ▁ spellings)"});
    s.add({"map.similarity", ConfigType::kString, "dot", "dot (TokAlign) | cosine"});
    s.add({"map.threshold", ConfigType::kFloat, "",
           "similarity below which a token gets FVT instead"});
    s.add({"map.device", ConfigType::kString, "auto", "auto | cpu | cuda"});
    // ---- stage 5: apply ----
    s.add({"apply.init", ConfigType::kString, "align", "align | fvt | mean | random"});
    s.add({"apply.fvt_weighting", ConfigType::kString, "mean", "mean | exponential (AdaptiVocab)"});
    s.add({"apply.align_weight", ConfigType::kFloat, "0.25",
           "aligned ids: embedding row = w x source row + (1 - w) x FVT row (1 = TokAlign)"});
    s.add({"apply.align_head_weight", ConfigType::kFloat, "0.25",
           "the same for the untied output head"});
    s.add({"apply.pad_to_multiple", ConfigType::kInt, "",
           "vocabulary padding; default: the family's"});
    s.add({"apply.seed", ConfigType::kInt, "0", "seed of the mean/random rows' noise"});
    // ---- stage 6: eval ----
    s.add({"eval.documents", ConfigType::kString, "",
           "held-out text file (one document per line or block): enables eval"});
    s.add({"eval.format", ConfigType::kString, "lines", "lines | blocks"});
    s.add({"eval.max_documents", ConfigType::kInt, "0", "first N documents only; 0 = all"});
    s.add({"eval.seq_len", ConfigType::kInt, "512", "window of the bits/byte forward (T)"});
    s.add({"eval.batch", ConfigType::kInt, "4", "windows per forward"});
    s.add({"eval.device", ConfigType::kString, "auto",
           "auto | cpu | cuda: where the bits-per-byte forward runs (numbers compare only within "
           "one device)"});
    return s;
}

Result<AlignRunReport> align_run_pipeline(const Config& c, const AlignRunOptions& options) {
    const auto t_start = Clock::now();
    AlignRunReport report;
    const std::string work = c.get_string("align.work_dir");
    const int threads =
        options.threads > 0 ? options.threads : static_cast<int>(c.get_int("align.threads"));
    const bool force = options.force || c.get_bool("align.force");
    const std::string source_tokenizer = c.get_string("source.tokenizer");
    const std::string checkpoint = optional_string(c, "source.checkpoint");
    const std::vector<std::string> corpus = c.get_string_list("corpus.inputs");
    LATHE_ASSIGN_OR_RETURN(const std::string format_name,
                           choice(c, "corpus.format", {"auto", "text", "text-blocks", "jsonl"}));
    LATHE_ASSIGN_OR_RETURN(const std::string on_error,
                           choice(c, "corpus.on_error", {"fail", "skip"}));
    const bool terms_enabled = c.get_bool("terms.enabled");
    const std::string given_target = optional_string(c, "target.tokenizer");
    if (!terms_enabled && given_target.empty()) {
        return invalid_argument_error(
            "target.tokenizer is not set and terms.enabled is false: there is "
            "no target vocabulary (set one, or enable terms)");
    }
    // Settings checked up front so a typo fails before hours of work.
    LATHE_ASSIGN_OR_RETURN(const std::string embed_method,
                           choice(c, "embed.method", {"glove", "sgns"}));
    LATHE_ASSIGN_OR_RETURN(const std::string embed_device,
                           choice(c, "embed.device", {"auto", "cpu", "cuda"}));
    LATHE_ASSIGN_OR_RETURN(const std::string map_match,
                           choice(c, "map.match", {"exact", "byte-level-aware"}));
    LATHE_ASSIGN_OR_RETURN(const std::string map_similarity,
                           choice(c, "map.similarity", {"dot", "cosine"}));
    LATHE_ASSIGN_OR_RETURN(const std::string map_device,
                           choice(c, "map.device", {"auto", "cpu", "cuda"}));
    LATHE_ASSIGN_OR_RETURN(const std::string eval_device,
                           choice(c, "eval.device", {"auto", "cpu", "cuda"}));
    LATHE_ASSIGN_OR_RETURN(const std::string apply_init,
                           choice(c, "apply.init", {"align", "fvt", "mean", "random"}));
    LATHE_ASSIGN_OR_RETURN(const std::string fvt_weighting,
                           choice(c, "apply.fvt_weighting", {"mean", "exponential"}));
    LATHE_ASSIGN_OR_RETURN(const std::string eval_format,
                           choice(c, "eval.format", {"lines", "blocks"}));
    LATHE_RETURN_IF_ERROR(check_run_config(c, options));
    // The device of stage 6's forward passes, opened now so that a missing GPU stops the run
    // before stage 1.
    const std::string documents = optional_string(c, "eval.documents");
    std::optional<ComputeDevice> eval_compute;
    if (!documents.empty()) {
        LATHE_ASSIGN_OR_RETURN(ComputeDevice d,
                               ComputeDevice::open(eval_device, where(c, "eval.device")));
        eval_compute.emplace(std::move(d));
    }
    LATHE_RETURN_IF_ERROR(make_dir(work));

    auto add = [&](std::string stage, bool skipped, std::string detail, Clock::time_point t0) {
        report.stages.push_back({std::move(stage), skipped ? "up to date" : "ran",
                                 std::move(detail), seconds_since(t0)});
    };
    auto not_configured = [&](std::string stage, std::string why) {
        report.stages.push_back({std::move(stage), "not configured", std::move(why), 0.0});
    };
    auto in_stage = [](const char* stage, const Status& s) { return s.with_context(stage); };

    // Stage 1 may mine a narrower corpus than stages 2-3 read: the embeddings want all the text
    // (general and domain), the terms only the domain part, whose counts the general corpus's
    // are set against (mining general + domain text would count general phrases as domain ones).
    std::vector<std::string> terms_corpus = c.get_string_list("terms.corpus");
    if (terms_corpus.empty()) terms_corpus = corpus;

    // ---- 1 terms ----
    std::string target_tokenizer = given_target;
    std::string terms_tsv;
    if (terms_enabled) {
        const auto t0 = Clock::now();
        log_info("align run: stage 1/6 terms");
        TermsOptions o;
        o.source_tokenizer = given_target.empty() ? source_tokenizer : given_target;
        o.corpus = terms_corpus;
        o.general_corpus = c.get_string_list("terms.general");
        o.output = join_path(work, "target/tokenizer.json");
        LATHE_ASSIGN_OR_RETURN(o.format, terms_format_from_name(format_name));
        o.json_key = c.get_string("corpus.json_key");
        o.top_k = c.get_int("terms.top_k");
        o.min_count = c.get_int("terms.min_count");
        o.max_ngram = static_cast<int>(c.get_int("terms.max_ngram"));
        o.smoothing = c.get_float("terms.smoothing");
        o.max_table_entries = static_cast<uint64_t>(c.get_int("terms.max_table_entries"));
        o.skip_bad_documents = on_error == "skip";
        o.threads = threads;
        o.force = force;
        o.show_progress = options.show_progress;
        o.cancel = options.cancel;
        auto r = align_terms_run(o);
        if (!r.ok()) return in_stage("terms", r.status());
        target_tokenizer = o.output;
        terms_tsv = align_terms_default_report(o.output);
        add("terms", r->skipped_up_to_date,
            r->skipped_up_to_date ? o.output
                                  : fmt::format("{} terms, vocab {} -> {}", r->terms.size(),
                                                r->source_vocab_size, r->target_vocab_size),
            t0);
    } else {
        not_configured("terms", "terms.enabled is false; target.tokenizer used as given");
    }

    // ---- 2 prepare: the corpus under each tokenizer ----
    const std::string tokens_dir = join_path(work, "tokens");
    LATHE_RETURN_IF_ERROR(make_dir(tokens_dir));
    const std::pair<const char*, std::string> sides[] = {{"source", source_tokenizer},
                                                         {"target", target_tokenizer}};
    for (const auto& [side, tokenizer] : sides) {
        const auto t0 = Clock::now();
        log_info("align run: stage 2/6 prepare ({})", side);
        PrepareOptions o;
        o.tokenizer_path = tokenizer;
        o.inputs = corpus;
        o.output_prefix = join_path(tokens_dir, side);
        LATHE_ASSIGN_OR_RETURN(o.format, prepare_format_from_name(format_name));
        o.json_key = c.get_string("corpus.json_key");
        o.on_error = on_error == "skip" ? OnError::kSkip : OnError::kFail;
        o.threads = threads;
        o.show_progress = options.show_progress;
        o.cancel = options.cancel;
        // prepare has no stage cache of its own: the manifest sits beside the .bin.
        const std::string primary = o.output_prefix + ".bin";
        StageFingerprint fp("prepare");
        fp.add_setting("format", format_name);
        fp.add_setting("json_key", o.json_key.value_or(""));
        fp.add_setting("on_error", on_error);
        fp.add_setting("append_eod", o.append_eod);
        LATHE_RETURN_IF_ERROR(fp.add_input("tokenizer", tokenizer));
        for (size_t i = 0; i < corpus.size(); ++i) {
            LATHE_RETURN_IF_ERROR(fp.add_input(fmt::format("corpus[{}]", i), corpus[i]));
        }
        if (!force && stage_up_to_date(primary, fp)) {
            add(fmt::format("prepare {}", side), true, o.output_prefix, t0);
            continue;
        }
        auto r = prepare_run(o);
        if (!r.ok()) return in_stage("prepare", r.status());
        LATHE_RETURN_IF_ERROR(stage_write_manifest(primary, fp, r->outputs));
        add(fmt::format("prepare {}", side), false,
            fmt::format("{} documents, {} tokens", r->documents, r->tokens), t0);
    }

    // ---- 3 embed ----
    const std::string vectors_dir = join_path(work, "vectors");
    LATHE_RETURN_IF_ERROR(make_dir(vectors_dir));
    for (const char* side : {"source", "target"}) {
        const auto t0 = Clock::now();
        log_info("align run: stage 3/6 embed ({})", side);
        EmbedOptions o;
        o.tokens = join_path(tokens_dir, side);
        o.output = join_path(vectors_dir, fmt::format("{}.txt", side));
        LATHE_ASSIGN_OR_RETURN(o.method, embed_method_from_name(embed_method));
        LATHE_ASSIGN_OR_RETURN(o.device, embed_device_from_name(embed_device));
        o.dim = c.get_int("embed.dim");
        o.window = static_cast<int>(c.get_int("embed.window"));
        o.min_count = c.get_int("embed.min_count");
        o.iters = static_cast<int>(c.get_int("embed.iters"));
        o.seed = static_cast<uint64_t>(c.get_int("embed.seed"));
        o.threads = threads;
        o.force = force;
        auto r = embed_tokens(o);
        if (!r.ok()) return in_stage("embed", r.status());
        add(fmt::format("embed {}", side), r->skipped,
            r->skipped ? o.output
                       : fmt::format("{} tokens with vectors, {} ({:.1f} s training)", r->vocab,
                                     r->device, r->train_seconds),
            t0);
    }

    // ---- 4 map ----
    const std::string map_path = join_path(work, "map/map.json");
    {
        const auto t0 = Clock::now();
        log_info("align run: stage 4/6 map");
        AlignMapRequest q;
        q.source_tokenizer = source_tokenizer;
        q.target_tokenizer = target_tokenizer;
        q.source_vectors = join_path(vectors_dir, "source.txt");
        q.target_vectors = join_path(vectors_dir, "target.txt");
        q.output = map_path;
        q.terms = terms_tsv;
        q.pivots = c.get_int("map.pivots");
        q.seed = static_cast<uint64_t>(c.get_int("map.seed"));
        q.match = map_match == "exact" ? AlignMatch::kExact : AlignMatch::kByteLevelAware;
        q.similarity = map_similarity == "dot" ? AlignSimilarity::kDot : AlignSimilarity::kCosine;
        if (c.has("map.threshold")) q.threshold = c.get_float("map.threshold");
        q.device = map_device == "cpu"    ? AlignDevice::kCpu
                   : map_device == "cuda" ? AlignDevice::kCuda
                                          : AlignDevice::kAuto;
        q.force = force;
        auto r = align_map_run(q);
        if (!r.ok()) return in_stage("map", r.status());
        add("map", r->skipped,
            r->skipped ? map_path
                       : fmt::format(
                             "{} gold, {} aligned, {} terms, {} fvt, {} below threshold; {} pivots",
                             r->gold, r->aligned, r->terms, r->fvt, r->below_threshold, r->pivots),
            t0);
    }

    // ---- 5 apply ----
    const std::string model_dir = join_path(work, "model");
    if (checkpoint.empty()) {
        not_configured("apply", "source.checkpoint is not set");
    } else {
        const auto t0 = Clock::now();
        log_info("align run: stage 5/6 apply");
        AlignApplyRequest q;
        q.checkpoint = checkpoint;
        q.map = map_path;
        q.target_tokenizer = target_tokenizer;
        q.source_tokenizer = source_tokenizer;
        q.output = model_dir;
        for (AlignInit init :
             {AlignInit::kAlign, AlignInit::kFvt, AlignInit::kMean, AlignInit::kRandom}) {
            if (align_init_name(init) == apply_init) q.init = init;
        }
        q.fvt_weighting =
            fvt_weighting == "mean" ? FvtWeighting::kMean : FvtWeighting::kExponential;
        if (c.has("apply.pad_to_multiple")) q.pad_to_multiple = c.get_int("apply.pad_to_multiple");
        q.seed = static_cast<uint64_t>(c.get_int("apply.seed"));
        q.align_weight = c.get_float("apply.align_weight");
        q.align_head_weight = c.get_float("apply.align_head_weight");
        q.overwrite = true;  // the stage cache decided it must run
        // apply has no stage cache of its own: the manifest is model/config.json.stage.json,
        // written after the folder is complete.
        const std::string primary = join_path(model_dir, "config.json");
        StageFingerprint fp("apply");
        fp.add_setting("init", apply_init);
        fp.add_setting("fvt_weighting", fvt_weighting);
        fp.add_setting("pad_to_multiple", c.has("apply.pad_to_multiple")
                                              ? c.get_int("apply.pad_to_multiple")
                                              : int64_t{-1});
        fp.add_setting("seed", c.get_int("apply.seed"));
        fp.add_setting("align_weight", c.get_float("apply.align_weight"));
        fp.add_setting("align_head_weight", c.get_float("apply.align_head_weight"));
        LATHE_RETURN_IF_ERROR(fp.add_input("checkpoint", checkpoint));
        LATHE_RETURN_IF_ERROR(fp.add_input("map", map_path));
        const std::string map_report = align_report_path(map_path);
        if (file_exists(map_report)) LATHE_RETURN_IF_ERROR(fp.add_input("map_report", map_report));
        LATHE_RETURN_IF_ERROR(fp.add_input("target_tokenizer", target_tokenizer));
        LATHE_RETURN_IF_ERROR(fp.add_input("source_tokenizer", source_tokenizer));
        if (!force && stage_up_to_date(primary, fp)) {
            add("apply", true, model_dir, t0);
        } else {
            auto r = align_apply_run(q);
            if (!r.ok()) return in_stage("apply", r.status());
            std::vector<std::string> outputs = {primary};
            for (const char* f : {"tokenizer.json"}) {
                if (file_exists(join_path(model_dir, f)))
                    outputs.push_back(join_path(model_dir, f));
            }
            LATHE_RETURN_IF_ERROR(stage_write_manifest(primary, fp, outputs));
            add("apply", false,
                fmt::format("{} ({}): {} rows: {} gathered, {} FVT, {} mean, {} random", model_dir,
                            r->architecture, r->vocab_size, r->gathered, r->fvt, r->mean_rows,
                            r->random_rows),
                t0);
        }
    }

    // ---- 6 eval ----
    if (documents.empty()) {
        not_configured("eval", "eval.documents is not set");
    } else {
        const auto t0 = Clock::now();
        log_info("align run: stage 6/6 eval");
        AlignEvalRequest q;
        q.documents = documents;
        q.format = eval_format == "blocks" ? TextRecordFormat::kBlocks : TextRecordFormat::kLines;
        q.max_documents = c.get_int("eval.max_documents");
        q.map = map_path;
        q.source_tokenizer = source_tokenizer;
        q.target_tokenizer = target_tokenizer;
        q.tokenizers = {source_tokenizer, target_tokenizer};
        if (!checkpoint.empty()) q.checkpoints = {checkpoint, model_dir};
        q.seq_len = c.get_int("eval.seq_len");
        q.batch = c.get_int("eval.batch");
        const std::string out = join_path(work, "eval.json");
        StageFingerprint fp("eval");
        fp.add_setting("format", eval_format);
        fp.add_setting("max_documents", q.max_documents);
        fp.add_setting("seq_len", q.seq_len);
        fp.add_setting("device", eval_device);
        LATHE_RETURN_IF_ERROR(fp.add_input("documents", documents));
        LATHE_RETURN_IF_ERROR(fp.add_input("map", map_path));
        LATHE_RETURN_IF_ERROR(fp.add_input("source_tokenizer", source_tokenizer));
        LATHE_RETURN_IF_ERROR(fp.add_input("target_tokenizer", target_tokenizer));
        for (size_t i = 0; i < q.checkpoints.size(); ++i) {
            LATHE_RETURN_IF_ERROR(fp.add_input(fmt::format("checkpoint[{}]", i), q.checkpoints[i]));
        }
        if (!force && stage_up_to_date(out, fp)) {
            add("eval", true, out, t0);
        } else {
            auto r = align_eval_run(eval_compute->context(), q);
            if (!r.ok()) return in_stage("eval", r.status());
            LATHE_RETURN_IF_ERROR(file_write_atomic(out, align_eval_result_json(*r) + "\n"));
            LATHE_RETURN_IF_ERROR(stage_write_manifest(out, fp, {out}));
            std::string detail = fmt::format("alignment BLEU-1 {:.4f}", r->alignment_bleu1);
            for (const AlignEvalModel& m : r->models) {
                detail += fmt::format("; {} {:.4f} bits/byte", m.checkpoint, m.bits_per_byte);
            }
            add("eval", false, detail, t0);
        }
    }
    report.seconds = seconds_since(t_start);
    return report;
}

}  // namespace lathe
