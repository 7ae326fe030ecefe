#include "run/world.h"

#include <fmt/format.h>
#include <unistd.h>

#include "dist/open.h"

namespace lathe {

std::string World::who() const {
    return fmt::format("rank {} of {} on host {} ({})", group.rank, group.world_size, host,
                       launcher_name(group.launcher));
}

Result<World> world_open(ComputeDevice& device, int timeout_ms) {
    World w;
    LATHE_ASSIGN_OR_RETURN(w.group, process_group_from_env(process_environment()));
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) w.host = name;
    const int ordinal = device.context().device;
    auto comm = communicator_open(w.group, device.backend(), ordinal, timeout_ms);
    if (!comm.ok()) return comm.status().with_context(w.group.describe());
    w.comm = std::move(comm).value();
    device.set_comm(w.comm.get());
    return w;
}

}  // namespace lathe
