#include "run/world.h"

#include <fmt/format.h>
#include <unistd.h>

#include "dist/open.h"
#include "model/model.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"

namespace lathe {

std::string World::who() const {
    return fmt::format("rank {} of {} on host {} ({})", group.rank, group.world_size, host,
                       launcher_name(group.launcher));
}

namespace {

// Runs each collective of a training step once over a 32 MiB device buffer, so that NCCL has
// allocated what it keeps for them, and frees the buffer.
Status warm_up(Communicator& comm, const Context& ctx) {
    constexpr int64_t kElements = 8 << 20;  // f32
    const int64_t n = kElements / comm.size() * comm.size();
    ArenaLayout layout;
    LATHE_RETURN_IF_ERROR(layout.add("warm_up", DType::kF32, Shape{n}).status());
    LATHE_ASSIGN_OR_RETURN(ModelArena arena, ModelArena::allocate(layout, ctx));
    const TensorView v = arena.view(0);
    const int64_t chunk = n / comm.size();
    LATHE_RETURN_IF_ERROR(comm.all_reduce(v, v, ReduceOp::kSum, ctx.stream));
    LATHE_RETURN_IF_ERROR(
        comm.all_gather(v, v.slice(comm.rank() * chunk, (comm.rank() + 1) * chunk), ctx.stream));
    LATHE_RETURN_IF_ERROR(comm.broadcast(v.slice(0, chunk), 0, ctx.stream));
    cuda_state_of(ctx, "world").synchronize();
    return ok_status();
}

}  // namespace

Result<World> world_open(ComputeDevice& device, int timeout_ms) {
    World w;
    LATHE_ASSIGN_OR_RETURN(w.group, process_group_from_env(process_environment()));
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) w.host = name;
    const int ordinal = device.context().device;
    const bool measure = device.backend() == Backend::kCuda && !w.group.single_process();
    const size_t free_before = measure ? cuda_memory_info(ordinal).free_bytes : 0;
    auto comm = communicator_open(w.group, device.backend(), ordinal, timeout_ms);
    if (!comm.ok()) return comm.status().with_context(w.group.describe());
    w.comm = std::move(comm).value();
    device.set_comm(w.comm.get());
    if (measure) {
        LATHE_RETURN_IF_ERROR(
            warm_up(*w.comm, device.context()).with_context("the first collectives"));
        const size_t free_after = cuda_memory_info(ordinal).free_bytes;
        w.device_bytes = free_before > free_after ? free_before - free_after : 0;
    }
    return w;
}

}  // namespace lathe
