#include "dist/process_group.h"

#include <charconv>
#include <cstdint>
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
        case Launcher::kLaunch:
            return "lathe launch";
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

// The names of one launcher's variables. The launcher is present when its rank or its size is
// set, or only when its size is set where `size_marks_launcher`: SLURM_PROCID is also in the
// environment of a batch script's own process, which srun did not start (process_group.h).
struct LauncherVars {
    Launcher launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
    bool size_marks_launcher;
};

constexpr LauncherVars kLaunchers[] = {
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {Launcher::kMpirun, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", false},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr, true},
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

// LATHE_LAUNCHER=launch (set by `lathe launch` beside torchrun's variables) turns the torchrun
// group just read into a `lathe launch` one.
Status read_launch_marker(const EnvMap& env, ProcessGroupInfo& info) {
    const auto marker = lookup(env, "LATHE_LAUNCHER");
    if (!marker) return ok_status();
    if (*marker != "launch")
        return invalid_argument_error(
            "environment variable LATHE_LAUNCHER='{}' is not a launcher lathe knows: only `lathe "
            "launch` sets it, to 'launch' (unset it)",
            *marker);
    if (info.launcher != Launcher::kTorchrun)
        return invalid_argument_error(
            "environment variable LATHE_LAUNCHER=launch is set but RANK and WORLD_SIZE are not: "
            "`lathe launch` sets all three, so this process was not started by it (unset "
            "LATHE_LAUNCHER)");
    info.launcher = Launcher::kLaunch;
    return ok_status();
}

// Digits only, at least one.
bool all_digits(std::string_view s) {
    if (s.empty()) return false;
    for (const char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

// a <= b for two strings of digits of any length (leading zeros allowed).
bool digits_less_equal(std::string_view a, std::string_view b) {
    const auto strip = [](std::string_view s) {
        while (s.size() > 1 && s.front() == '0') s.remove_prefix(1);
        return s;
    };
    a = strip(a);
    b = strip(b);
    if (a.size() != b.size()) return a.size() < b.size();
    return a <= b;
}

// Under srun, MASTER_ADDR and MASTER_PORT default to values every task of the step computes
// alike (process_group.h): the step's first node, the job's when the step's list is absent.
Status read_slurm_defaults(const EnvMap& env, ProcessGroupInfo& info) {
    if (info.master_addr.empty()) {
        const char* name = "SLURM_STEP_NODELIST";
        auto list = lookup(env, name);
        if (!list) {
            name = "SLURM_JOB_NODELIST";
            list = lookup(env, name);
        }
        if (list) {
            auto first = slurm_first_host(*list);
            if (!first.ok())
                return invalid_argument_error(
                    "environment variable {}: {}; SLURM sets it, so check what set it by hand, "
                    "or set MASTER_ADDR to rank 0's host",
                    name, first.status().message());
            info.master_addr = std::move(first).value();
        }
    }
    if (info.master_port == 0) {
        if (const auto id = lookup(env, "SLURM_JOB_ID")) {
            uint64_t v = 0;
            const char* end = id->data() + id->size();
            const auto [ptr, ec] = std::from_chars(id->data(), end, v);
            if (id->empty() || ec != std::errc() || ptr != end)
                return invalid_argument_error(
                    "environment variable SLURM_JOB_ID='{}' is not a whole number; SLURM sets "
                    "it, so check what set it by hand, or set MASTER_PORT",
                    *id);
            info.master_port = 29500 + int(v % 1000);
        }
    }
    return ok_status();
}

}  // namespace

Result<std::string> slurm_first_host(std::string_view list) {
    const auto bad = [&](size_t at, std::string_view what) {
        return invalid_argument_error("host list '{}' has {} at character {}", list, what, at + 1);
    };
    if (list.empty()) return invalid_argument_error("host list is empty");
    std::string first;
    bool in_first = true;    // still reading the first host
    bool host_empty = true;  // the host being read has nothing yet
    size_t i = 0;
    while (i < list.size()) {
        const char c = list[i];
        if (c == ',') {
            if (host_empty) return bad(i, "an empty host name");
            in_first = false;
            host_empty = true;
            ++i;
            continue;
        }
        if (c == ']') return bad(i, "a ']' without its '['");
        if (c == '[') {
            const size_t close = list.find(']', i);
            if (close == std::string_view::npos) return bad(i, "a '[' without its ']'");
            const std::string_view body = list.substr(i + 1, close - i - 1);
            if (const size_t inner = body.find('['); inner != std::string_view::npos)
                return bad(i + 1 + inner, "a '[' inside brackets");
            if (body.empty()) return bad(i, "empty brackets");
            std::string_view first_number;
            size_t at = i + 1;  // where the current item starts in `list`
            for (size_t start = 0; start <= body.size();) {
                size_t comma = body.find(',', start);
                if (comma == std::string_view::npos) comma = body.size();
                const std::string_view item = body.substr(start, comma - start);
                const size_t dash = item.find('-');
                const std::string_view low = item.substr(0, dash);
                const std::string_view high =
                    dash == std::string_view::npos ? low : item.substr(dash + 1);
                if (item.empty()) return bad(at, "an empty number in brackets");
                if (!all_digits(low) || !all_digits(high))
                    return bad(at, fmt::format("'{}' in brackets, which is neither a number nor "
                                               "a low-high range of numbers",
                                               item));
                if (!digits_less_equal(low, high))
                    return bad(at, fmt::format("the range '{}', whose low end is above its high "
                                               "end",
                                               item));
                if (first_number.empty()) first_number = low;
                at += item.size() + 1;
                start = comma + 1;
            }
            if (in_first) first += first_number;
            host_empty = false;
            i = close + 1;
            continue;
        }
        if (c <= ' ' || c == 0x7f) return bad(i, "a space or control character");
        if (in_first) first += c;
        host_empty = false;
        ++i;
    }
    if (host_empty) return bad(list.size() - 1, "an empty host name (a comma at the end)");
    return first;
}

Result<ProcessGroupInfo> process_group_from_env(const EnvMap& env) {
    ProcessGroupInfo info;
    for (const LauncherVars& vars : kLaunchers) {
        const bool present = vars.size_marks_launcher
                                 ? lookup(env, vars.size).has_value()
                                 : lookup(env, vars.rank) || lookup(env, vars.size);
        if (!present) continue;
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
    LATHE_RETURN_IF_ERROR(read_launch_marker(env, info));
    if (info.launcher == Launcher::kSlurm) {
        LATHE_RETURN_IF_ERROR(read_slurm_defaults(env, info));
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
