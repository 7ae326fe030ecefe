#pragma once
// `lathe convert INPUT_DIR OUTPUT_DIR --to hf|lathe [--dtype fp32|bf16|fp16]
//                [--max-shard-size SIZE] [--overwrite]`
//
// Moves a model between the two folder formats lathe reads and writes:
//
//   Hugging Face folder   config.json, model.safetensors or model-0000K-of-0000N.safetensors +
//                         model.safetensors.index.json, tokenizer files, generation_config.json.
//                         Weights in any of F32 / BF16 / F16.
//   lathe checkpoint      the same files (weights F32, the master weights the trainer keeps), plus
//                         optimizer.safetensors (AdamW moments exp_avg / exp_avg_sq, flat F32 in
//                         the parameter-arena layout) and trainer_state.json. A lathe *run folder*
//                         (DIR/checkpoints/step-N/) stands for its newest complete checkpoint.
//
// The input's kind is detected: a folder with config.json is a lathe checkpoint when it holds
// trainer_state.json or optimizer.safetensors, otherwise a Hugging Face folder; a folder without
// config.json that holds checkpoints/step-*/ (a run folder) or step-*/ (its checkpoints folder)
// resolves to the newest step.
//
// Every tensor goes through the model's parameter table (model/registry.h), built from config.json:
// each parameter must be present once (under its full name, or without the family's base-model
// prefix as bare base-model checkpoints store it) with the shape the config implies, and nothing
// else may be there except known buffers (rotary inv_freq, GPT-2's causal-mask biases), which are
// dropped. Tying is checked both ways: an untied model (tie_word_embeddings false) must carry its
// head; a tied model may carry a head only if it is bit-identical to the token embedding (some
// exporters write both), and it is then dropped. Each error names the tensor and what was expected.
//
// Values are never changed except by the dtype conversion, done element by element as torch's
// `.to(dtype)` does: widening (bf16/f16 -> f32) is exact; narrowing rounds to nearest, ties to even
// (torch's round_to_nearest_even; a NaN stays a NaN). So a round trip that ends in the
// dtype it started from (HF bf16 -> lathe f32 -> HF bf16, or f32 throughout) reproduces every
// parameter tensor bit for bit. Tensors are written in the parameter table's order, under their
// full names, with {"format": "pt"} metadata, and split into shards by huggingface_hub's rule
// (safetensors_write_checkpoint's), one shard at a time, so memory holds at most one shard's
// converted tensors besides the input's memory maps (for --to lathe without a shard limit: the
// whole f32 model). save_pretrained's own order depends on the model and the transformers
// version (module order, or names sorted when transformers 5 renames weights on saving), so shard
// boundaries may fall elsewhere than in its files; the tensors, the index's keys and total_size
// are the same, and a shard limit reproduces lathe's own sharded output byte for byte.
//
// What else is written:
//   --to hf     config.json (every architectural key, "architectures", torch_dtype = the chosen
//               dtype, the keys lathe does not interpret kept verbatim); generation_config.json
//               (the input's, or one made from bos/eos/pad_token_id as transformers'
//               GenerationConfig.from_model_config does, when the config names any of them).
//   both        config.json's bos/eos/pad_token_id checked against the carried tokenizer
//               (run/special_tokens.h, SpecialIdsMode::kKeepValid): an id that names no special
//               token of it is replaced by the tokenizer's (a warning says so); a tokenizer.json
//               without tokenizer_config.json gets one written (tokenizer_class
//               PreTrainedTokenizerFast and its bos/eos/pad/unk tokens), so that transformers
//               knows them and generate stops at the end of a document.
//   --to lathe  config.json (torch_dtype float32); optimizer.safetensors with zero moments and
//               trainer_state.json at step 0, so that both `checkpoint.init_mode: finetune` and
//               `continue` start from it (continuing from step 0 with fresh AdamW state).
//   both        the tokenizer files (tokenizer.json, tokenizer_config.json with its chat template,
//               chat_template.jinja / .json, special_tokens_map.json, added_tokens.json,
//               vocab.json, merges.txt, tokenizer.model), generation_config.json, README.md and
//               the license files, copied byte for byte. Nothing else is carried (in particular no
//               pytorch_model*.bin: weights that were not converted must not ride along).
//
// The output is built in a hidden sibling folder (".NAME.partial-PID") and renamed onto OUTPUT_DIR
// only when every file is complete and synced; a failed or killed conversion leaves OUTPUT_DIR as
// it was. An existing non-empty OUTPUT_DIR is refused unless `overwrite` is set.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

enum class CheckpointFormat : uint8_t { kHf, kLathe };

// "hf", "lathe".
std::string_view checkpoint_format_name(CheckpointFormat format);

// The element type of written weights.
enum class ConvertDtype : uint8_t { kF32, kBF16, kF16 };

// "fp32", "bf16", "fp16".
std::string_view convert_dtype_name(ConvertDtype dtype);
// config.json's torch_dtype for it: "float32", "bfloat16", "float16".
std::string_view convert_dtype_torch_name(ConvertDtype dtype);
// Parses fp32 / f32 / float32, bf16 / bfloat16, fp16 / f16 / float16 (case-insensitive).
// Errors: kInvalidArgument naming the value and the choices.
Result<ConvertDtype> convert_parse_dtype(std::string_view text);

// Parses a shard size as transformers' max_shard_size does: a byte count ("1000000"), or a number
// with a decimal unit (KB, MB, GB, TB: powers of 1000) or a binary one (KiB, MiB, GiB, TiB: powers
// of 1024), case-insensitive, an optional space before the unit; fractions allowed ("1.5GB").
// "0" means no limit. Errors: kInvalidArgument naming the text and the accepted forms.
Result<uint64_t> convert_parse_size(std::string_view text);

// A checkpoint folder found from what the user named.
struct ConvertSource {
    std::string dir;  // the folder holding config.json and the weights
    CheckpointFormat format = CheckpointFormat::kHf;
    std::string given;  // what the user passed (differs from `dir` for a run folder)
};

// Resolves `input` as the file comment describes. Errors (kNotFound / kInvalidArgument, naming the
// path and what was looked for): no such folder; no config.json and no checkpoints; config.json
// but no safetensors weights (pytorch_model.bin only is named as such, with what to do).
Result<ConvertSource> convert_find_source(const std::string& input);

struct ConvertRequest {
    std::string input;
    std::string output;
    CheckpointFormat to = CheckpointFormat::kHf;
    // Weights written: default bf16 for --to hf; a lathe checkpoint is always fp32 (another value
    // is refused: the trainer keeps fp32 master weights).
    std::optional<ConvertDtype> dtype;
    // Bytes of tensor data per shard: default 5 GB (5e9) for --to hf, no limit (one
    // model.safetensors, as the trainer writes) for --to lathe; 0 = no limit.
    std::optional<uint64_t> max_shard_bytes;
    bool overwrite = false;  // replace a non-empty OUTPUT_DIR
};

struct ConvertResult {
    ConvertSource source;
    std::string output;  // the final folder
    CheckpointFormat to = CheckpointFormat::kHf;
    ConvertDtype dtype = ConvertDtype::kF32;
    std::string architecture;               // "LlamaForCausalLM", ...
    int64_t tensors = 0;                    // parameter tensors written
    int64_t parameters = 0;                 // their elements
    uint64_t weight_bytes = 0;              // bytes of tensor data written (the index's total_size)
    std::vector<std::string> weight_files;  // shard file names, then the index when there is one
    std::vector<std::string> other_files;   // config.json, tokenizer files, state files, ...
    std::vector<std::string> dropped;       // input tensors not written (buffers, a tied head)
    std::vector<std::string> input_dtypes;  // distinct dtypes of the input's parameters ("BF16")
};

// Runs the conversion. Errors: those of convert_find_source; kInvalidArgument for a request that
// makes no sense (lathe -> lathe, a dtype other than fp32 for --to lathe, OUTPUT_DIR equal to or
// inside the input, OUTPUT_DIR not empty without `overwrite`); kUnimplemented for an architecture
// or config setting lathe does not support (from config.json's parser, naming the key); and, naming
// the tensor and what was expected, kInvalidArgument for a missing parameter, an extra tensor, a
// shape mismatch, an unsupported element type, an untied model without its head, or a tied model
// whose stored head differs from its embedding; kIoError / kDataLoss from the files.
Result<ConvertResult> convert_run(const ConvertRequest& request);

// The result as one JSON line (no trailing newline): what was read, what was written.
std::string convert_result_json(const ConvertResult& result);

}  // namespace lathe
