#pragma once
// The processes of an inference command (lathe generate, lathe serve): one process, or T
// tensor-parallel ranks (infer/tensor_parallel.h), each holding its shard of the model.
//
//   inference_processes_open   checks --tensor-parallel against the job the launcher started
//                              (process_group_from_env: T must equal its process count) and the
//                              model's split (tp_local_config), then opens the device and, with
//                              T > 1, the world; every refusal comes before any process waits on
//                              another.
//   inference_model_create     the rank's model for inference (bf16 weights alone on CUDA): drawn
//                              from --random-weights SEED (each rank its shard), the rank's
//                              slices of the checkpoint's safetensors, or the whole checkpoint.
//   inference_prefill_chunk    the prompt tokens of one prefill forward: the requested count, or
//                              2048 on CUDA and 256 on the CPU, at most max_len.
// `command` names the command in messages ("generate", "serve").

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "model/model.h"
#include "model/model_config.h"
#include "run/compute_device.h"
#include "run/world.h"

namespace lathe {

struct InferenceProcesses {
    int tensor_parallel = 1;
    ComputeDevice device;
    std::optional<World> world;  // T > 1 only

    int rank() const { return world ? world->rank() : 0; }
    bool rank0() const { return rank() == 0; }
};

Result<InferenceProcesses> inference_processes_open(const ModelConfig& config, int tensor_parallel,
                                                    const std::string& device,
                                                    std::string_view command);

// random_weights < 0: load from `dir`.
Result<Model> inference_model_create(const ModelConfig& config, const InferenceProcesses& p,
                                     int64_t random_weights, const std::filesystem::path& dir);

int64_t inference_prefill_chunk(int64_t requested, const InferenceProcesses& p, int64_t max_len);

}  // namespace lathe
