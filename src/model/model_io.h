#pragma once
// Model I/O: a Model's parameters to and from Hugging Face safetensors checkpoints (the format
// lathe's own checkpoints use for weights), and the parameter / gradient accessors by HF name.
// Everything here works on host memory through a ParamStaging (param_staging.h) made for the call
// and dropped after it; the model itself only reads and writes arena entries.
//
// Conversions: stored F32, BF16 and F16 tensors are read as f32 by safetensors_convert_elements
// (io/safetensors.h), the one decoder of tensor bytes; the HF layout of each parameter (stacked
// q/k/v, GPT-NeoX's interleaved qkv, GPT-2's transposed Conv1D) is the parameter table's
// (hf_param_import / hf_param_export, model/param_table.h). Saving writes f32.

#include <string>
#include <string_view>

#include "core/finite.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/model.h"

namespace lathe {

class ParamStaging;
class SafetensorsCheckpoint;
struct SafetensorsTensor;

// Loads every parameter of `model` from `checkpoint` (f32, bf16 or f16 tensors, converted to
// f32). Names may lack the family's base-model prefix (checkpoints of the bare base model). A
// tied model takes a stored head only when it is the embedding (check_tied_head). Errors name the
// checkpoint and tensor: a missing parameter, a wrong shape, an unsupported dtype, a NaN or
// infinite weight (kDataLoss, check_finite_weights: nothing computes with them). Tensors the
// model does not use are listed in a warning, except known buffers (ModelFamily::ignored_suffixes).
Status model_load_hf(Model& model, const SafetensorsCheckpoint& checkpoint);

// An error when `bad` (count_non_finite of `n` weights read from the tensor `name` of the
// checkpoint file `where`) found NaN or infinite values, naming the file, the tensor, how many
// there are and the first (bad.first: its element index in the tensor's stored order); ok when
// bad.count is 0.
Status check_finite_weights(const NonFiniteCount& bad, int64_t n, const std::string& where,
                            std::string_view name);

// A checkpoint whose config.json ties the LM head to the token embedding but that stores a head
// tensor as well (some exporters write it): an error naming both unless the head is the
// embedding, value for value; otherwise config.json is wrong about the tie, and the model would
// compute with the embedding in the head's place. `where` names the checkpoint.
Status check_tied_head(const SafetensorsTensor& head, const SafetensorsTensor& embedding,
                       const std::string& where);

// A model of `config` for `shape` on `ctx`, its parameters loaded from the safetensors of the
// checkpoint folder `dir` (model_load_hf): what every command that evaluates or generates from a
// checkpoint starts with. Errors: Model::create's, and the checkpoint's with "--checkpoint" as
// context.
Result<Model> model_create_loaded(const ModelConfig& config, const ModelShape& shape,
                                  const Context& ctx, const std::string& dir);

// Writes `dir`/model.safetensors with the HF names, stored shapes and layouts (f32), and
// `dir`/config.json (the config's JSON with torch_dtype float32). `dir` must exist.
Status model_save_hf(const Model& model, const std::string& dir);
// model_save_hf of the entries `staging` (a ParamStaging over `model`) holds: filled by another
// reader, such as the gather of a sharded model's parameters (run/data_parallel.h).
Status model_save_hf_staged(const Model& model, ParamStaging& staging, const std::string& dir);

// The parameter / gradient called `name` (an HF name) in its stored HF layout, copied into `out`
// (host, f32, the HF shape). An unknown name is a bug (checked); see ParamTable::find_hf.
void model_read_param_hf(const Model& model, std::string_view name, TensorView out);
void model_read_grad_hf(const Model& model, std::string_view name, TensorView out);
// Sets the parameter `name` of `model` from `hf` (host, f32, the HF shape).
void model_write_param_hf(Model& model, std::string_view name, ConstTensorView hf);

}  // namespace lathe
