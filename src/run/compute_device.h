#pragma once
// Where a command computes: the CPU reference or one CUDA device. `train.device`, `--device` of
// eval/bench/align take "auto" (the first GPU when this lathe was built with CUDA and the driver
// reports one, else the CPU), "cpu" or "cuda" (an error when no GPU can be used). The CUDA state
// (stream, library handles, workspaces) lives as long as the ComputeDevice; the Context it hands
// out points at it, so keep the ComputeDevice alive while any model or op uses the Context.

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "ops/context.h"

namespace lathe {

class ComputeDevice {
public:
    ComputeDevice();  // the CPU
    ~ComputeDevice();
    ComputeDevice(ComputeDevice&&) noexcept;
    ComputeDevice& operator=(ComputeDevice&&) noexcept;

    // `want`: auto | cpu | cuda. `key` names the setting in errors (e.g. "train.device").
    // Errors: an unknown value; cuda asked for in a build without CUDA or on a machine without
    // a GPU (the message says which).
    static Result<ComputeDevice> open(std::string_view want, std::string_view key);

    const Context& context() const { return ctx_; }
    // Lets ops use their faster nondeterministic variants (Context::deterministic).
    void set_deterministic(bool deterministic) { ctx_.deterministic = deterministic; }
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
