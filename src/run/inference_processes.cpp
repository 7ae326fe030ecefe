#include "run/inference_processes.h"

#include <algorithm>
#include <utility>

#include "dist/process_group.h"
#include "infer/tensor_parallel.h"
#include "model/model_io.h"

namespace lathe {

Result<InferenceProcesses> inference_processes_open(const ModelConfig& config, int tensor_parallel,
                                                    const std::string& device,
                                                    std::string_view command) {
    const int tp = tensor_parallel;
    if (tp < 1) return invalid_argument_error("--tensor-parallel must be >= 1, got {}", tp);
    LATHE_ASSIGN_OR_RETURN(const ProcessGroupInfo group,
                           process_group_from_env(process_environment()));
    if (tp > 1 && tp != group.world_size) {
        return invalid_argument_error(
            "--tensor-parallel {} must equal the number of processes of this job, {} ({}): start "
            "{} processes (`lathe launch --gpus {} lathe {} ...`, or `mpirun -np {} ...` "
            "with --device cpu) or pass --tensor-parallel {}",
            tp, group.world_size, group.describe(), tp, tp, command, tp, group.world_size);
    }
    if (tp > 1) LATHE_RETURN_IF_ERROR(tp_local_config(config, tp, "--tensor-parallel").status());
    InferenceProcesses p;
    p.tensor_parallel = tp;
    LATHE_ASSIGN_OR_RETURN(p.device, ComputeDevice::open(device, "--device"));
    if (tp > 1) {
        LATHE_ASSIGN_OR_RETURN(World w, world_open(p.device));
        p.world.emplace(std::move(w));
    }
    return p;
}

Result<Model> inference_model_create(const ModelConfig& config, const InferenceProcesses& p,
                                     int64_t random_weights, const std::filesystem::path& dir) {
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    const int tp = p.tensor_parallel;
    const Context& ctx = p.device.context();
    if (random_weights >= 0)
        return tp_model_create_random(config, p.rank(), tp, shape, ctx, uint64_t(random_weights));
    if (tp > 1) return tp_model_create_loaded(config, p.rank(), tp, shape, ctx, dir.string());
    return model_create_loaded(config, shape, ctx, dir.string());
}

int64_t inference_prefill_chunk(int64_t requested, const InferenceProcesses& p, int64_t max_len) {
    const bool cpu = p.device.context().backend == Backend::kCpu;
    return std::min<int64_t>(requested > 0 ? requested : cpu ? 256 : 2048, max_len);
}

}  // namespace lathe
