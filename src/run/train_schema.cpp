#include "run/train_schema.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/registry.h"

namespace lathe {

ConfigSchema train_config_schema() {
    ConfigSchema s;
    // ---- model: an HF config.json, or the fields inline (HF names) ----
    s.add({"model.config", ConfigType::kString, "",
           "path of a Hugging Face config.json defining the model"});
    s.add({"model.family", ConfigType::kString, "",
           model_family_names(" | ", " | ") + " (when model.config is not given)"});
    s.add({"model.hidden_size", ConfigType::kInt, "", "width of the residual stream (C)"});
    s.add({"model.intermediate_size", ConfigType::kInt, "", "MLP inner width"});
    s.add({"model.num_hidden_layers", ConfigType::kInt, "", "transformer blocks (L)"});
    s.add({"model.num_attention_heads", ConfigType::kInt, "", "query heads (H)"});
    s.add({"model.num_key_value_heads", ConfigType::kInt, "", "key/value heads (Hkv); default H"});
    s.add({"model.head_dim", ConfigType::kInt, "", "per-head width (D); default C / H"});
    s.add({"model.max_position_embeddings", ConfigType::kInt, "",
           "longest sequence the model allows"});
    s.add({"model.rope_theta", ConfigType::kFloat, "", "rotary base"});
    s.add({"model.norm_eps", ConfigType::kFloat, "", "RMSNorm/LayerNorm epsilon"});
    s.add({"model.tie_word_embeddings", ConfigType::kBool, "",
           "output head shares the embedding matrix"});
    s.add({"model.sliding_window", ConfigType::kInt, "",
           "attention window (Mistral); unset = full causal"});
    s.add({"model.vocab_size", ConfigType::kInt, "",
           "embedding rows; default: the tokenizer's size, padded"});
    s.add({"model.make_vocab_size_divisible_by", ConfigType::kInt, "128",
           "vocabulary padding multiple (GPT-NeoX)"});
    // ---- data ----
    s.add({"data.path", ConfigType::kStringList, "", "token-file prefix(es) from `lathe prepare`",
           true});
    s.add({"data.weights", ConfigType::kFloatList, "",
           "blend weight per data.path entry; default equal"});
    s.add({"data.label_path", ConfigType::kStringList, "",
           "label-file prefix(es) (SFT loss masks), one per data.path"});
    s.add({"data.valid_path", ConfigType::kStringList, "",
           "validation prefix(es); with several data.path entries (a blend) GPT-NeoX needs "
           "explicit lists"});
    s.add(
        {"data.valid_label_path", ConfigType::kStringList, "", "label files for data.valid_path"});
    s.add({"data.test_path", ConfigType::kStringList, "", "test prefix(es), as data.valid_path"});
    s.add({"data.test_label_path", ConfigType::kStringList, "", "label files for data.test_path"});
    s.add({"data.split", ConfigType::kString, "969,30,1",
           "train,valid,test split of documents (GPT-NeoX)"});
    s.add({"data.seq_length", ConfigType::kInt, "1024", "tokens per sample (T)"});
    s.add({"data.tokenizer", ConfigType::kString, "", "tokenizer.json of the token files", true});
    s.add({"data.per_document_attention", ConfigType::kBool, "false",
           "packed samples: attend within each document only"});
    // ---- train ----
    s.add({"train.steps", ConfigType::kInt, "", "optimizer steps", true});
    s.add({"train.micro_batch_size", ConfigType::kInt, "8", "sequences per forward/backward (B)"});
    s.add({"train.gradient_accumulation_steps", ConfigType::kInt, "1",
           "micro-batches per optimizer step"});
    s.add({"train.log_interval", ConfigType::kInt, "10", "steps between console/metrics lines"});
    s.add({"train.eval_interval", ConfigType::kInt, "1000",
           "steps between validation passes; 0 = never"});
    s.add({"train.eval_iters", ConfigType::kInt, "10", "micro-batches per validation pass"});
    s.add({"train.seed", ConfigType::kInt, "1234", "seed for initialisation and sample order"});
    s.add({"train.device", ConfigType::kString, "auto", "auto | cpu | cuda | cuda:N"});
    s.add({"train.precision", ConfigType::kString, "bf16",
           "fp32 | bf16 | fp8 (GPU); the CPU computes in fp32"});
    s.add({"train.recompute", ConfigType::kString, "none",
           "activation recompute: none | selective | full"});
    s.add({"train.threads", ConfigType::kInt, "0", "CPU threads; 0 = all cores"});
    s.add({"train.deterministic", ConfigType::kBool, "true",
           "same bits on every run; false lets the GPU use faster nondeterministic kernels "
           "(attention backward)"});
    s.add({"train.nonfinite_policy", ConfigType::kString, "skip",
           "a NaN/Inf loss or gradient: skip the step | stop"});
    s.add({"train.max_skipped_steps", ConfigType::kInt, "10",
           "stop after this many skipped steps in a row"});
    s.add({"train.spike_factor", ConfigType::kFloat, "0",
           "treat loss > factor x running mean as a spike (0 = off)"});
    s.add({"train.freeze", ConfigType::kStringList, "[]",
           "parameter-name patterns (glob) to keep frozen"});
    // ---- parallel: several processes (ranks) train one model (run/data_parallel.h) ----
    s.add({"parallel.zero_stage", ConfigType::kInt, "1",
           "data parallel: 0 = every rank holds the whole optimizer state, 1 = AdamW state "
           "sharded over the ranks (ZeRO-1), 2 = AdamW state and gradients sharded (ZeRO-2), "
           "3 = AdamW state, gradients and parameters sharded (ZeRO-3)"});
    s.add({"parallel.tensor", ConfigType::kInt, "1",
           "tensor parallel: T consecutive ranks share every layer (Megatron-style, "
           "infer/tensor_parallel.h); the world is T x data-parallel ranks; T divides the "
           "attention heads, the key/value heads and the MLP width (llama, mistral, qwen2)"});
    s.add({"parallel.sequence_parallel", ConfigType::kBool, "true",
           "with parallel.tensor > 1: each tensor rank keeps 1/T of the rows of the residual "
           "stream, the norms and residual adds (all-gather before, reduce-scatter after each "
           "tensor-parallel region; docs/DISTRIBUTED.md); micro_batch_size x seq_length must be a "
           "multiple of parallel.tensor. false: every rank keeps every row"});
    s.add({"parallel.tensor_overlap", ConfigType::kBool, "true",
           "with sequence parallel: the layer's all-gathers and reduce-scatters run on a stream "
           "of their own beside its compute (the backward's gathers begun early and its "
           "reduce-scatters under the weight gradients; the forward pipelined by row chunks "
           "with parallel.tensor_overlap_chunks > 1; docs/DISTRIBUTED.md). false: each "
           "collective in turn on the compute stream"});
    s.add({"parallel.tensor_overlap_chunks", ConfigType::kInt, "1",
           "with parallel.tensor_overlap: the forward's row chunks (1 to 8); micro_batch_size x "
           "seq_length must be a multiple of parallel.tensor x this"});
    s.add({"parallel.tensor_overlap_sms", ConfigType::kInt, "0",
           "with parallel.tensor_overlap on CUDA: SMs the layer's GEMMs leave to the collectives "
           "running beside them (cuBLASLt plans each GEMM for the rest; 0: for all)"});
    s.add({"parallel.timeout_s", ConfigType::kFloat, "600",
           "a rank waiting longer than this on the others stops the run, naming the wait "
           "(0 = wait forever)"});
    // ---- optimizer (AdamW) ----
    s.add({"optimizer.lr", ConfigType::kFloat, "6e-4", "peak learning rate"});
    s.add({"optimizer.min_lr", ConfigType::kFloat, "0", "floor of the schedule"});
    s.add({"optimizer.weight_decay", ConfigType::kFloat, "0.1",
           "decoupled weight decay (not on norms and biases)"});
    s.add({"optimizer.beta1", ConfigType::kFloat, "0.9", "AdamW beta1"});
    s.add({"optimizer.beta2", ConfigType::kFloat, "0.95", "AdamW beta2"});
    s.add({"optimizer.eps", ConfigType::kFloat, "1e-8", "AdamW epsilon"});
    s.add(
        {"optimizer.gradient_clipping", ConfigType::kFloat, "1.0", "global L2 norm clip; 0 = off"});
    // Optimizer offload (model/host_memory_plan.h). No schema defaults: unset keys stay out of
    // a run's config.yaml; train_settings_resolve applies none, 1 and fp32.
    s.add({"optimizer.offload", ConfigType::kString, "",
           "none (default) | cpu: the f32 masters and AdamW moments of "
           "optimizer.offload_fraction of the parameters in pinned host memory, stepped on the "
           "CPU (docs/SFT.md, \"Optimizer offload\")"});
    s.add({"optimizer.offload_fraction", ConfigType::kFloat, "",
           "with optimizer.offload: cpu, the fraction of the parameters offloaded, in (0, 1]; "
           "default 1: the last layers (and the LM head) go first, as few as hold the fraction; "
           "the rest keeps its masters and moments on the GPU, stepped there"});
    s.add({"optimizer.offload_schedule", ConfigType::kString, "",
           "with optimizer.offload: cpu: overlapped (default: gradients leave the GPU layer by "
           "layer during the backward, the CPU steps on a worker thread while the next forward "
           "waits per layer) | serial (whole-vector copies and the update between the steps); "
           "same bits | delayed (offload_fraction 1: the update of step s runs on the CPU "
           "during step s + 1, which computes with the weights before it: other bits, the host "
           "step hidden; checkpoints and validation apply the update in flight first)"});
    s.add({"optimizer.schedule", ConfigType::kString, "",
           "the device AdamW: serial (default: the whole update between the backward and the "
           "next forward) | overlapped (after the gradient norm, unit by unit on a low-priority "
           "stream while the next forward waits per unit); same bits; one process, no offload"});
    s.add({"optimizer.overlap_sms", ConfigType::kInt, "0",
           "with optimizer.schedule: overlapped on CUDA, the SMs the forward's GEMMs leave to the "
           "update beside them (cuBLASLt's SM count target; 0 to 64, fewer than the device's); 0: "
           "none, the serial schedule's bits"});
    s.add({"optimizer.state_dtype", ConfigType::kString, "",
           "AdamW moment storage: fp32 (default) | bf16 (rounded to nearest even on store): "
           "the device optimizer's, or with optimizer.offload: cpu the host's"});
    // ---- learning-rate schedule (GPT-NeoX AnnealingLR) ----
    s.add({"lr.decay_style", ConfigType::kString, "cosine",
           "constant | linear | cosine | exponential"});
    s.add({"lr.warmup", ConfigType::kFloat, "0.01", "warmup as a fraction of the decay steps"});
    s.add({"lr.decay_steps", ConfigType::kInt, "0", "steps of decay; 0 = train.steps"});
    // ---- checkpoints ----
    s.add({"checkpoint.interval", ConfigType::kInt, "1000",
           "steps between checkpoints; 0 = only at the end"});
    s.add({"checkpoint.keep_last", ConfigType::kInt, "3", "complete checkpoints to keep; 0 = all"});
    s.add({"checkpoint.init_from", ConfigType::kString, "",
           "start from this checkpoint: a checkpoint folder (lathe or Hugging Face), a run folder "
           "(its newest checkpoint) or RUN/checkpoints/latest"});
    s.add({"checkpoint.init_mode", ConfigType::kString, "finetune",
           "finetune (weights only) | continue (optimizer and step too)"});
    // ---- fp8 (read with train.precision: fp8; model/fp8_state.h) ----
    s.add({"fp8.recipe", ConfigType::kString, "tensorwise",
           "tensorwise (scale from each tensor's amax) | delayed (from an amax history) | "
           "blockwise (1x128 / 128x128 scales, e4m3 everywhere)"});
    s.add({"fp8.grad_format", ConfigType::kString, "auto",
           "the fp8 format of gradients: auto (e5m2; blockwise: e4m3) | e5m2 | e4m3"});
    s.add({"fp8.lm_head", ConfigType::kBool, "false", "the LM head's GEMMs in fp8 too"});
    s.add({"fp8.amax_history", ConfigType::kInt, "16",
           "delayed: steps of amax history a scale is computed from (1-4096)"});
    s.add({"fp8.amax_reduction", ConfigType::kString, "max",
           "delayed: max | most_recent of the amax history"});
    // ---- logging (besides the console and RUN_DIR/metrics.jsonl) ----
    s.add({"logging.tensorboard", ConfigType::kBool, "true",
           "write TensorBoard event files into RUN_DIR/tb/ (rank 0)"});
    return s;
}

bool train_key_resume_compatible(std::string_view key) {
    // Keep in step with the list in train_schema.h.
    static constexpr std::string_view kCompatible[] = {"train.steps",
                                                       "train.log_interval",
                                                       "train.eval_interval",
                                                       "train.eval_iters",
                                                       "train.device",
                                                       "train.precision",
                                                       "train.recompute",
                                                       "train.threads",
                                                       "train.deterministic",
                                                       "train.nonfinite_policy",
                                                       "train.max_skipped_steps",
                                                       "train.spike_factor",
                                                       "train.freeze",
                                                       "checkpoint.interval",
                                                       "checkpoint.keep_last",
                                                       "checkpoint.init_mode"};
    for (std::string_view prefix : {"optimizer.", "lr.", "parallel.", "logging."}) {
        if (key.starts_with(prefix)) return true;
    }
    for (std::string_view k : kCompatible) {
        if (key == k) return true;
    }
    return false;
}

std::string config_value_text(const Config& c, const ConfigKey& key) {
    if (!c.has(key.name)) return "(unset)";
    switch (key.type) {
        case ConfigType::kInt:
            return fmt::format("{}", c.get_int(key.name));
        case ConfigType::kFloat:
            return fmt::format("{}", c.get_float(key.name));  // shortest text that reads back
        case ConfigType::kBool:
            return c.get_bool(key.name) ? "true" : "false";
        case ConfigType::kString:
            return c.get_string(key.name);
        case ConfigType::kStringList:
            return fmt::format("[{}]", fmt::join(c.get_string_list(key.name), ", "));
        case ConfigType::kFloatList:
            return fmt::format("[{}]", fmt::join(c.get_float_list(key.name), ", "));
    }
    return "";
}

std::vector<TrainConfigChange> train_config_changes(const Config& before, const Config& after) {
    std::vector<TrainConfigChange> out;
    for (const ConfigKey& key : after.schema().keys()) {
        std::string a = config_value_text(before, key), b = config_value_text(after, key);
        if (a == b) continue;
        out.push_back(
            {key.name, std::move(a), std::move(b), train_key_resume_compatible(key.name)});
    }
    return out;
}

}  // namespace lathe
