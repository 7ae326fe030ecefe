#include "align/embed.h"

#include <chrono>
#include <cmath>

#include "align/cooccur.h"
#include "align/glove.h"
#include "align/sgns.h"
#include "align/stage_cache.h"
#include "align/vectors.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/indexed_dataset.h"
#include "ops/cuda/cuda_state.h"
#include "ops/device_info.h"

namespace lathe {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status check_options(const EmbedOptions& o) {
    if (o.tokens.empty()) return invalid_argument_error("--tokens: a token file prefix is needed");
    if (o.output.empty()) return invalid_argument_error("--output: a vectors file is needed");
    if (o.dim < 1 || o.dim > 4096)
        return invalid_argument_error("--dim {}: must be in [1, 4096]", o.dim);
    if (o.window < 0 || o.window > 1000)
        return invalid_argument_error("--window {}: must be in [1, 1000] (0: the method's default)",
                                      o.window);
    if (o.min_count < 1)
        return invalid_argument_error("--min-count {}: must be at least 1", o.min_count);
    if (o.iters < 1) return invalid_argument_error("--iters {}: must be at least 1", o.iters);
    if (!(o.x_max > 0)) return invalid_argument_error("--x-max {}: must be > 0", o.x_max);
    if (!(o.alpha > 0)) return invalid_argument_error("--alpha {}: must be > 0", o.alpha);
    if (o.lr < 0)
        return invalid_argument_error("--lr {}: must be > 0 (or 0 for the default)", o.lr);
    if (o.negative < 1 || o.negative > 100)
        return invalid_argument_error("--negative {}: must be in [1, 100]", o.negative);
    if (!(o.subsample > 0))
        return invalid_argument_error("--subsample {}: must be > 0", o.subsample);
    if (o.threads < 0) return invalid_argument_error("--threads {}: must be >= 0", o.threads);
    return ok_status();
}

}  // namespace

std::string embed_cuda_unusable_reason(const GpuEnvironment& env) {
    if (!env.cuda_build) return "this lathe was built without CUDA";
    if (env.devices.empty()) return env.device_error.empty() ? "no CUDA device" : env.device_error;
    if (!env.devices[0].kernel_image_ok)
        return env.devices[0].name + ": " + env.devices[0].kernel_image_error;
    return "";
}

namespace {

// Whether to train on the GPU, and its name. --device cuda without a usable GPU is an error;
// auto falls back to the CPU and says why.
Result<bool> choose_cuda(EmbedDevice device, std::string& name) {
    if (device == EmbedDevice::kCpu) return false;
    const GpuEnvironment env = gpu_environment_probe(0);
    const std::string why = embed_cuda_unusable_reason(env);
    if (why.empty()) {
        name = env.devices[0].name;
        return true;
    }
    if (device == EmbedDevice::kCuda)
        return failed_precondition_error("--device cuda: {}; use --device cpu or auto", why);
    log_info("embed: training on the CPU ({})", why);
    return false;
}

StageFingerprint fingerprint_of(const EmbedOptions& o, double lr, int window) {
    StageFingerprint fp("embed");
    fp.add_setting("method", embed_method_name(o.method));
    fp.add_setting("dim", o.dim);
    fp.add_setting("window", window);
    fp.add_setting("min_count", o.min_count);
    fp.add_setting("iters", o.iters);
    fp.add_setting("lr", lr);
    fp.add_setting("seed", o.seed);
    if (o.method == EmbedMethod::kGlove) {
        fp.add_setting("x_max", o.x_max);
        fp.add_setting("alpha", o.alpha);
    } else {
        fp.add_setting("negative", int64_t{o.negative});
        fp.add_setting("subsample", o.subsample);
    }
    return fp;
}

}  // namespace

const char* embed_method_name(EmbedMethod method) {
    return method == EmbedMethod::kGlove ? "glove" : "sgns";
}

Result<EmbedMethod> embed_method_from_name(std::string_view name) {
    if (name == "glove") return EmbedMethod::kGlove;
    if (name == "sgns") return EmbedMethod::kSgns;
    return invalid_argument_error("--method '{}': expected glove or sgns", name);
}

Result<EmbedDevice> embed_device_from_name(std::string_view name) {
    if (name == "auto") return EmbedDevice::kAuto;
    if (name == "cpu") return EmbedDevice::kCpu;
    if (name == "cuda") return EmbedDevice::kCuda;
    return invalid_argument_error("--device '{}': expected auto, cpu or cuda", name);
}

Result<EmbedReport> embed_tokens(const EmbedOptions& options) {
    LATHE_RETURN_IF_ERROR(check_options(options));
    const auto t_start = std::chrono::steady_clock::now();
    if (!std::isfinite(options.lr) || options.lr < 0)
        return invalid_argument_error("--lr {}: must be a finite number > 0 (0: the default)",
                                      options.lr);
    const double lr = options.lr > 0 ? options.lr : 0.05;
    const int window =
        options.window > 0 ? options.window : (options.method == EmbedMethod::kGlove ? 15 : 5);
    EmbedReport report;

    StageFingerprint fp = fingerprint_of(options, lr, window);
    LATHE_RETURN_IF_ERROR(fp.add_input("tokens.idx", indexed_idx_path(options.tokens)));
    LATHE_RETURN_IF_ERROR(fp.add_input("tokens.bin", indexed_bin_path(options.tokens)));
    if (!options.force && stage_up_to_date(options.output, fp)) {
        report.skipped = true;
        return report;
    }

    LATHE_ASSIGN_OR_RETURN(IndexedDataset data, IndexedDataset::open(options.tokens));
    for (const std::string& w : data.warnings()) log_warning("{}", w);
    if (data.token_count() == 0)
        return invalid_argument_error("{}: the token file holds no tokens", options.tokens);
    const int threads = embed_thread_count(options.threads);
    std::string gpu_name;
    LATHE_ASSIGN_OR_RETURN(const bool use_cuda, choose_cuda(options.device, gpu_name));
    report.device =
        use_cuda ? "cuda (" + gpu_name + ")" : "cpu (" + std::to_string(threads) + " threads)";

    auto t0 = std::chrono::steady_clock::now();
    LATHE_ASSIGN_OR_RETURN(EmbedVocab vocab, embed_count_vocab(data, options.min_count, threads));
    report.documents = vocab.documents;
    report.corpus_tokens = vocab.corpus_tokens;
    report.vocab = vocab.size();
    log_info("embed: {} tokens in {} documents, {} distinct ids seen >= {} times",
             Progress::format_count(double(vocab.corpus_tokens)), vocab.documents, vocab.size(),
             options.min_count);

    TokenVectors out;
    out.dim = options.dim;
    out.ids = vocab.token_of_row;
    if (options.method == EmbedMethod::kGlove) {
        CooccurOptions co;
        co.window = window;
        co.threads = threads;
        co.memory_bytes = options.memory_bytes;
        std::vector<CooccurEntry> x = cooccur_count(data, vocab, co);
        GloveOptions go;
        go.dim = options.dim;
        go.iters = options.iters;
        go.x_max = options.x_max;
        go.alpha = options.alpha;
        go.lr = lr;
        go.seed = options.seed;
        go.threads = threads;
        const std::vector<GloveEntry> entries = glove_make_entries(x, go);
        x = {};
        report.entries = int64_t(entries.size());
        report.count_seconds = seconds_since(t0);
        log_info("embed: {} co-occurrence entries ({:.1f} s)",
                 Progress::format_count(double(entries.size())), report.count_seconds);

        t0 = std::chrono::steady_clock::now();
        GloveModel model = glove_init(vocab.size(), options.dim, options.seed);
#ifdef LATHE_HAVE_CUDA
        if (use_cuda) {
            CudaState state(0);  // GPU 0, the one choose_cuda looked at
            const Context ctx = state.context();
            GloveCuda gpu(ctx, model, entries);
            for (int it = 0; it < options.iters; ++it) {
                report.final_cost = gpu.epoch(lr, go.grad_clip);
                log_info("glove: iteration {}/{}, cost {:.6f} ({:.1f} s)", it + 1, options.iters,
                         report.final_cost, seconds_since(t0));
            }
            gpu.download(model);
        }
#endif
        if (!use_cuda) {
            for (int it = 0; it < options.iters; ++it) {
                report.final_cost =
                    glove_epoch_hogwild_cpu(model, entries, lr, go.grad_clip, threads);
                log_info("glove: iteration {}/{}, cost {:.6f} ({:.1f} s)", it + 1, options.iters,
                         report.final_cost, seconds_since(t0));
            }
        }
        out.values = glove_output_vectors(model);
        report.train_seconds = seconds_since(t0);
    } else {
        SgnsOptions so;
        so.dim = options.dim;
        so.window = window;
        so.epochs = options.iters;
        so.negative = options.negative;
        so.subsample = options.subsample;
        so.lr = lr;
        so.seed = options.seed;
        so.threads = threads;
        LATHE_ASSIGN_OR_RETURN(SgnsCorpus corpus, sgns_load_corpus(data, vocab));
        report.entries = int64_t(corpus.rows.size());
        report.count_seconds = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
        SgnsModel model = sgns_init(vocab.size(), options.dim, options.seed);
        const SgnsTables tables = sgns_make_tables(vocab, so);
#ifdef LATHE_HAVE_CUDA
        if (use_cuda) {
            CudaState state(0);  // GPU 0, the one choose_cuda looked at
            const Context ctx = state.context();
            SgnsCuda gpu(ctx, model, corpus, tables);
            for (int it = 0; it < options.iters; ++it) {
                report.final_cost = gpu.epoch(so, it);
                log_info("sgns: epoch {}/{}, loss {:.6f} ({:.1f} s)", it + 1, options.iters,
                         report.final_cost, seconds_since(t0));
            }
            gpu.download(model);
        }
#endif
        if (!use_cuda) {
            for (int it = 0; it < options.iters; ++it) {
                report.final_cost = sgns_epoch_hogwild_cpu(model, corpus, tables, so, it);
                log_info("sgns: epoch {}/{}, loss {:.6f} ({:.1f} s)", it + 1, options.iters,
                         report.final_cost, seconds_since(t0));
            }
        }
        out.values = std::move(model.in);
        report.train_seconds = seconds_since(t0);
    }

    // A learning rate too large for the data sends the vectors to inf / NaN: an error, not a file
    // that later stages would take.
    for (size_t i = 0; i < out.values.size(); ++i) {
        if (!std::isfinite(out.values[i])) {
            return invalid_argument_error(
                "{}: training diverged (token {}'s vector holds {}; final cost {}); lower --lr "
                "(it is {})",
                options.output, out.ids[i / size_t(out.dim)], out.values[i], report.final_cost, lr);
        }
    }
    t0 = std::chrono::steady_clock::now();
    LATHE_RETURN_IF_ERROR(vectors_write_text(options.output, out));
    LATHE_RETURN_IF_ERROR(stage_write_manifest(options.output, fp, {options.output}));
    report.write_seconds = seconds_since(t0);
    report.total_seconds = seconds_since(t_start);
    return report;
}

}  // namespace lathe
