#include "dist/process_group.h"

#include <charconv>
#include <optional>

extern char** environ;

namespace lathe {

std::string_view launcher_name(Launcher launcher) {
    switch (launcher) {
        case Launcher::kNone:
            return "none";
        case Launcher::kTorchrun:
            return "torchrun";
        case Launcher::kMpirun:
            return "mpirun";
        case Launcher::kSlurm:
            return "srun";
    }
    return "?";
}

std::string ProcessGroupInfo::describe() const {
    if (launcher == Launcher::kNone) return "a single process (no launcher)";
    return fmt::format("rank {} of {} (local rank {}, {})", rank, world_size, local_rank,
                       launcher_name(launcher));
}

namespace {

std::optional<std::string_view> lookup(const EnvMap& env, std::string_view name) {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return std::string_view(it->second);
}

// The whole-number value of `name`, or nullopt when unset. Surrounding spaces are not accepted:
// launchers never write them, and a value that has them was typed by hand and may mean anything.
Result<std::optional<int>> read_int(const EnvMap& env, std::string_view name) {
    const auto value = lookup(env, name);
    if (!value) return std::optional<int>();
    int v = 0;
    const char* end = value->data() + value->size();
    const auto [ptr, ec] = std::from_chars(value->data(), end, v);
    if (value->empty() || ec != std::errc() || ptr != end)
        return invalid_argument_error(
            "environment variable {}='{}' is not a whole number; the launcher sets it, so check "
            "what set it by hand",
            name, *value);
    return std::optional<int>(v);
}

// The names of one launcher's variables.
struct LauncherVars {
    Launcher launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
};

constexpr LauncherVars kLaunchers[] = {
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kMpirun, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

Status read_launcher(const EnvMap& env, const LauncherVars& vars, ProcessGroupInfo& info) {
    LATHE_ASSIGN_OR_RETURN(const std::optional<int> rank, read_int(env, vars.rank));
    LATHE_ASSIGN_OR_RETURN(const std::optional<int> size, read_int(env, vars.size));
    if (!rank || !size)
        return invalid_argument_error(
            "environment variable {} is set but {} is not; {} sets both (unset the one left "
            "over, or set the other)",
            rank ? vars.rank : vars.size, rank ? vars.size : vars.rank,
            launcher_name(vars.launcher));
    if (*size < 1)
        return invalid_argument_error(
            "environment variable {}={}: a world needs at least one "
            "process",
            vars.size, *size);
    if (*rank < 0 || *rank >= *size)
        return invalid_argument_error(
            "environment variable {}={} is outside [0, {}) given by {}={}", vars.rank, *rank, *size,
            vars.size, *size);
    LATHE_ASSIGN_OR_RETURN(const std::optional<int> local_rank, read_int(env, vars.local_rank));
    std::optional<int> local_size;
    if (vars.local_size != nullptr) {
        LATHE_ASSIGN_OR_RETURN(local_size, read_int(env, vars.local_size));
    }
    if (!local_rank && *size > 1)
        return invalid_argument_error(
            "environment variable {} is not set, but {}={} says there are {} processes: the "
            "local rank picks this process's GPU ({} sets it)",
            vars.local_rank, vars.size, *size, *size, launcher_name(vars.launcher));
    info.launcher = vars.launcher;
    info.rank = *rank;
    info.world_size = *size;
    info.local_rank = local_rank.value_or(0);
    info.local_world_size = local_size.value_or(0);
    if (info.local_rank < 0 || info.local_rank > info.rank)
        return invalid_argument_error(
            "environment variable {}={} is outside [0, {}] (a local rank counts the processes "
            "of one machine, so it is at most the rank {}={})",
            vars.local_rank, info.local_rank, info.rank, vars.rank, info.rank);
    if (local_size) {
        if (*local_size < 1 || *local_size > info.world_size)
            return invalid_argument_error(
                "environment variable {}={} is outside [1, {}] given by {}={}", vars.local_size,
                *local_size, info.world_size, vars.size, info.world_size);
        if (info.local_rank >= *local_size)
            return invalid_argument_error(
                "environment variable {}={} is outside [0, {}) given by {}={}", vars.local_rank,
                info.local_rank, *local_size, vars.local_size, *local_size);
    }
    return ok_status();
}

}  // namespace

Result<ProcessGroupInfo> process_group_from_env(const EnvMap& env) {
    ProcessGroupInfo info;
    for (const LauncherVars& vars : kLaunchers) {
        if (!lookup(env, vars.rank) && !lookup(env, vars.size)) continue;
        LATHE_RETURN_IF_ERROR(read_launcher(env, vars, info));
        break;
    }
    if (const auto addr = lookup(env, "MASTER_ADDR")) info.master_addr = std::string(*addr);
    LATHE_ASSIGN_OR_RETURN(const std::optional<int> port, read_int(env, "MASTER_PORT"));
    if (port) {
        if (*port < 1 || *port > 65535)
            return invalid_argument_error(
                "environment variable MASTER_PORT={} is not a TCP port (1 to 65535)", *port);
        info.master_port = *port;
    }
    return info;
}

EnvMap process_environment() {
    EnvMap env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string_view entry(*e);
        const size_t eq = entry.find('=');
        if (eq == std::string_view::npos) continue;
        env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
    return env;
}

}  // namespace lathe
