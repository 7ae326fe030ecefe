#pragma once
// Where a command computes: the CPU reference or one CUDA device. `train.device`, `--device` of
// eval/bench/align take "auto" (a GPU when this lathe was built with CUDA and the driver reports
// one, and the build can run the whole model there, attention included; else the CPU), "cpu",
// "cuda" (an error when no GPU can be used, or the build has no CUDA attention) or "cuda:N" (GPU
// N of those visible, explicitly). Which GPU auto and cuda take comes from the process group
// (dist/process_group.h): GPU <local rank> of the visible ones, so that the processes a launcher
// starts on one machine spread over its GPUs; when fewer GPUs are visible than the local rank
// needs and exactly one is (a launcher that hides the others per process), that one. A single
// process takes GPU 0. The CUDA state (streams, library handles, workspaces) lives as long as the
// ComputeDevice; the Context it hands out points at it, so keep the ComputeDevice alive while any
// model or op uses the Context.

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "dist/process_group.h"
#include "ops/context.h"
#include "ops/device_info.h"

namespace lathe {

// Where `want` (auto | cpu | cuda) computes on a machine described by `env` (its GPU 0) in a
// build whose CUDA attention is missing for the reason `cuda_attention_missing` (null when it is
// built: ops/attention.h). A GPU is used only when it is listed, this build has kernels for it,
// and attention runs on it, since every model needs it. auto falls back to the CPU and, when a
// GPU is there but cannot be used, puts the reason into `fallback_note` (empty otherwise).
// Errors: an unknown value; cuda when a GPU cannot be used (the message says why and what to do).
// `key` names the setting in messages. open() calls this with the probed machine.
Result<Backend> compute_device_choose(std::string_view want, std::string_view key,
                                      const GpuEnvironment& env, const char* cuda_attention_missing,
                                      std::string& fallback_note);

// Whether `want` is one of the forms above (auto, cpu, cuda, cuda:N with N a whole number >= 0).
bool compute_device_name_valid(std::string_view want);

// The CUDA device ordinal `want` (auto | cuda | cuda:N) computes on for `group`, with
// `visible_devices` GPUs visible to this process (as the header comment says). Errors: a
// malformed cuda:N; N or the local rank beyond the visible GPUs (the message says how many there
// are and what to do).
Result<int> compute_device_index(std::string_view want, std::string_view key,
                                 const ProcessGroupInfo& group, int visible_devices);

class ComputeDevice {
public:
    ComputeDevice();  // the CPU
    ~ComputeDevice();
    ComputeDevice(ComputeDevice&&) noexcept;
    ComputeDevice& operator=(ComputeDevice&&) noexcept;

    // `want`: auto | cpu | cuda | cuda:N. `key` names the setting in errors (e.g. "train.device").
    // The GPU comes from `group` (compute_device_index). Errors: an unknown value; cuda asked for
    // in a build without CUDA or CUDA attention, or on a machine without a usable GPU (the message
    // says which; compute_device_choose); a device index beyond the visible GPUs.
    static Result<ComputeDevice> open(std::string_view want, std::string_view key,
                                      const ProcessGroupInfo& group);
    // As above, with this process's group read from its environment (launcher variables) when a
    // GPU may be used; errors of process_group_from_env come back as they are.
    static Result<ComputeDevice> open(std::string_view want, std::string_view key);

    const Context& context() const { return ctx_; }
    // Lets ops use their faster nondeterministic variants (Context::deterministic).
    void set_deterministic(bool deterministic) { ctx_.deterministic = deterministic; }
    // The world communicator contexts handed out from now on carry (Context::comm; run/world.h).
    void set_comm(Communicator* comm) { ctx_.comm = comm; }
    Backend backend() const { return ctx_.backend; }
    // "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB)" or "cpu".
    std::string describe() const;
    // Memory a model may plan for: the device's free memory on CUDA, physical RAM on the CPU
    // (0 if unknown).
    size_t available_memory_bytes() const;
    // Waits for the device (CUDA); no-op on the CPU.
    void synchronize() const;

private:
    struct Cuda;
    std::unique_ptr<Cuda> cuda_;
    Context ctx_;
};

}  // namespace lathe
