#include "run/eval_loss.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "data/gpt2_dataset.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"

namespace lathe {

Result<EvalLossResult> eval_loss_run(const EvalLossRequest& r) {
    if (r.seq_len < 1) return invalid_argument_error("--seq-len must be >= 1, got {}", r.seq_len);
    if (r.batches < 1) return invalid_argument_error("--batches must be >= 1, got {}", r.batches);
    if (r.micro_batch < 1)
        return invalid_argument_error("--micro-batch must be >= 1, got {}", r.micro_batch);
#ifdef _OPENMP
    if (r.threads > 0) omp_set_num_threads(r.threads);
#endif
    const Result<std::filesystem::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const std::string checkpoint = resolved->string();
    auto config = model_config_from_hf_file(checkpoint);
    if (!config.ok()) return config.status().with_context("--checkpoint");
    if (r.seq_len > config->max_position_embeddings) {
        return invalid_argument_error(
            "--seq-len {} exceeds the model's max_position_embeddings {} ({})", r.seq_len,
            config->max_position_embeddings, checkpoint);
    }
    const int64_t T = r.seq_len;
    const int64_t B = std::min(r.micro_batch, r.batches);
    ModelShape shape;
    shape.batch = B;
    shape.seq_len = T;
    shape.training = false;  // forward only: no gradients
    LATHE_ASSIGN_OR_RETURN(ComputeDevice device, ComputeDevice::open(r.device, "--device"));
    LATHE_ASSIGN_OR_RETURN(Model model,
                           model_create_loaded(*config, shape, device.context(), checkpoint));
    auto docs = open_indexed_token_documents(r.data);
    if (!docs.ok()) return docs.status().with_context("--data");
    const TokenDocuments& file = **docs;

    // The stream, read document by document, only as far as N (T + 1) tokens.
    const int64_t need = r.batches * (T + 1);
    int64_t total_tokens = 0;
    for (int32_t n : file.sizes()) total_tokens += n;
    if (total_tokens < need) {
        return invalid_argument_error(
            "--data {}: {} tokens hold {} windows of {} + 1, fewer than --batches {}", r.data,
            total_tokens, total_tokens / (T + 1), T, r.batches);
    }
    std::vector<int32_t> stream(static_cast<size_t>(need));
    int64_t have = 0;
    const auto sizes = file.sizes();
    for (size_t d = 0; d < sizes.size() && have < need; ++d) {
        const int64_t take = std::min<int64_t>(sizes[d], need - have);
        if (take == 0) continue;
        LATHE_RETURN_IF_ERROR(
            file.read(int64_t(d), 0, std::span<int32_t>(stream.data() + have, size_t(take))));
        have += take;
    }
    if (have < need) {
        return invalid_argument_error(
            "--data {}: {} tokens hold {} windows of {} + 1, fewer than --batches {}", r.data, have,
            have / (T + 1), T, r.batches);
    }
    for (int32_t id : stream) {
        if (id < 0 || id >= config->vocab_size) {
            return invalid_argument_error(
                "--data {}: token id {} is outside the model's vocabulary ({}); was it "
                "prepared with another tokenizer?",
                r.data, id, config->vocab_size);
        }
    }

    std::vector<int32_t> tokens(size_t(B * T)), targets(size_t(B * T));
    double total = 0.0;  // sum of per-token losses
    for (int64_t w0 = 0; w0 < r.batches; w0 += B) {
        const int64_t nb = std::min(B, r.batches - w0);
        for (int64_t b = 0; b < nb; ++b) {
            const int32_t* win = stream.data() + (w0 + b) * (T + 1);
            std::copy(win, win + T, tokens.begin() + b * T);
            std::copy(win + 1, win + T + 1, targets.begin() + b * T);
        }
        ModelBatch batch;
        batch.tokens = ConstTensorView(tokens.data(), DType::kI32, Shape{nb, T});
        batch.targets = ConstTensorView(targets.data(), DType::kI32, Shape{nb, T});
        total += double(model.forward(batch)) * double(nb * T);
    }
    EvalLossResult out;
    out.checkpoint = checkpoint;
    out.windows = r.batches;
    out.tokens = r.batches * T;
    out.loss = total / double(out.tokens);
    out.perplexity = std::exp(out.loss);
    return out;
}

std::string eval_loss_json(const EvalLossRequest& request, const EvalLossResult& result) {
    nlohmann::ordered_json j;
    j["loss"] = result.loss;
    j["perplexity"] = result.perplexity;
    j["tokens"] = result.tokens;
    j["windows"] = result.windows;
    j["seq_len"] = request.seq_len;
    j["device"] = request.device;
    j["checkpoint"] = result.checkpoint;
    j["data"] = request.data;
    return j.dump();
}

}  // namespace lathe
