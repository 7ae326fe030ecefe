#pragma once
// What the machine offers the CUDA backend: its GPUs, the CUDA driver and runtime, the GPU
// libraries (cuBLASLt, cuDNN, NCCL), and a short numerics self-test of the CUDA ops against their
// CPU twins. For `lathe doctor` and `lathe bench`.
//
// Works in every build. In a build without CUDA (LATHE_HAVE_CUDA undefined) the probe says so
// and lists no devices (ops/cuda_stub/device_info.cpp); cuDNN and NCCL are looked up with dlopen in
// any build, so a machine's libraries can be checked before lathe is built with CUDA. Probing never
// stops the process: a missing driver, no device or a missing library are answers (strings saying
// why), not errors. The self-test, in contrast, runs real kernels: a CUDA error there stops with
// file:line as any CUDA call does (STYLE.md, "Errors"), because a GPU that fails a small GEMM is
// broken.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lathe {

// One CUDA device, from cudaGetDeviceProperties and cudaMemGetInfo.
struct GpuDeviceInfo {
    int ordinal = 0;
    std::string name;  // "NVIDIA H100 80GB HBM3"
    int cc_major = 0, cc_minor = 0;
    int sm_count = 0;
    size_t total_memory_bytes = 0;
    size_t free_memory_bytes = 0;
    // Whether this binary carries kernel code this device can run (the build compiles for the
    // architectures in CMAKE_CUDA_ARCHITECTURES, sm_90a by default: Hopper only). When false,
    // kernel_image_error says why (cudaFuncGetAttributes on one of lathe's kernels).
    bool kernel_image_ok = false;
    std::string kernel_image_error;

    // BF16 tensor cores: Ampere (8.0) and later.
    bool has_bf16() const { return cc_major >= 8; }
    // FP8 (E4M3/E5M2) tensor cores: Ada (8.9) and Hopper (9.0) and later.
    bool has_fp8() const { return cc_major * 10 + cc_minor >= 89; }
    bool is_hopper() const { return cc_major == 9; }
};

// A shared library found (or not) and its version.
struct GpuLibraryInfo {
    bool found = false;
    std::string version;  // "9.14.0" when found
    std::string detail;   // where it came from, or why it was not found
};

struct GpuEnvironment {
    bool cuda_build = false;     // this binary has the CUDA backend
    int driver_version = 0;      // cudaDriverGetVersion (13000 = 13.0); 0 = no driver
    std::string driver_release;  // the driver's own version ("580.159.04") from NVML, or empty
    int runtime_version = 0;     // cudaRuntimeGetVersion of the linked runtime
    // Why no device is listed (cudaGetDeviceCount's error, or "built without CUDA"); empty when
    // the device count could be read (it may still be 0).
    std::string device_error;
    // The runtime's answer means there is no GPU to use: no driver installed, or
    // cudaErrorNoDevice (none present, or all hidden by CUDA_VISIBLE_DEVICES), or a build without
    // CUDA. False when a GPU may be there but cannot be reached (a driver older than the runtime,
    // a failed initialization): device_error says which.
    bool no_gpu = false;
    std::vector<GpuDeviceInfo> devices;
    GpuLibraryInfo cublaslt, cudnn, nccl;
};

// Probes the machine as described above. Never fails. Examining a device creates its CUDA
// context (a few hundred MiB of its memory, until the process ends): `only_device` >= 0 limits
// the device list to that one device (when it exists), for callers that use only it.
GpuEnvironment gpu_environment_probe(int only_device = -1);

// "13.0" from CUDA's 1000 * major + 10 * minor encoding (driver and runtime versions).
std::string cuda_version_string(int version);

// "9.14.0" from the major * 10000 + minor * 100 + patch encoding (cuBLASLt, cuDNN 9,
// NCCL >= 2.9); NCCL before 2.9 used major * 1000 + minor * 100 + patch, told apart by size.
std::string library_version_string(size_t version);
std::string nccl_version_string(int version);

// One comparison of the self-test: a CUDA op through its dispatcher against the CPU twin on the
// same (bf16-representable) random inputs.
struct GpuSelfTestCheck {
    std::string name;  // "linear_forward bf16 (cuBLASLt, bias epilogue) 256x512 -> 384"
    bool passed = false;
    double max_abs_error = 0;  // max |cuda - cpu| over the output
    double max_ref = 0;        // max |cpu| over the output (the error's scale)
    // Allowed per element: rel_tolerance * |ref| + abs_tolerance * max_ref, derived from the
    // output dtype (bf16 unit roundoff 2^-8 for bf16 outputs).
    double rel_tolerance = 0, abs_tolerance = 0;
    int64_t failing_elements = 0;  // beyond the tolerance, or not finite
};

// Runs the self-test on CUDA device `device` (must be listed by gpu_environment_probe with
// kernel_image_ok): a cuBLASLt bf16 GEMM with bias (linear_forward) and the weight-gradient GEMM
// plus the deterministic bias column reduction (linear_backward), an RMSNorm forward (per-row
// reductions), and the global gradient norm (grad_norm_l2, a two-pass fp64 reduction), each
// against the CPU reference. `seed` draws the inputs. In a build without CUDA: no checks (empty).
std::vector<GpuSelfTestCheck> gpu_self_test(int device, uint64_t seed);

// How host memory reaches one GPU, from the CUDA runtime's device attributes and one timed copy.
// On a coherent CPU-GPU link (GH200's NVLink-C2C: address translation through the host's page
// tables, hardware coherence) the GPU reads and writes ordinary malloc'ed host memory at link
// speed, so host-resident buffers (offloaded optimizer state, the batch path) need neither
// cudaMallocHost nor cudaHostRegister; elsewhere (PCIe, x86-64 HMM) they must be page-locked to
// be copied at link speed. For `lathe doctor`.
struct HostLinkInfo {
    int ordinal = 0;
    // Why the attributes could not be read (no CUDA build, no such device, a failed query);
    // empty when they were.
    std::string error;
    // cudaDevAttrPageableMemoryAccess: the GPU can access pageable (malloc'ed) host memory at
    // all. True on GH200, and on x86-64 with HMM (open kernel modules), where it migrates pages.
    bool pageable_memory_access = false;
    // cudaDevAttrPageableMemoryAccessUsesHostPageTables: it does so through the host's page
    // tables (ATS over a coherent link), without migrating pages.
    bool uses_host_page_tables = false;
    // cudaDevAttrHostNativeAtomicSupported: atomics on host memory go over the link natively.
    bool host_native_atomics = false;
    // NUMA nodes: the GPU's memory as a node of its own (cudaDevAttrNumaId; GH200 exposes HBM as
    // one) and the host node closest to the GPU (cudaDevAttrHostNumaId, else the PCI device's
    // numa_node in sysfs); -1 when the system has none.
    int gpu_numa_node = -1;
    int host_numa_node = -1;
    std::string pci_bus_id;  // "0000:1b:00.0"
    // Pinned host -> device copy bandwidth (bytes/s, best of a few copies of
    // pinned_copy_bytes); 0 when not measured.
    double pinned_h2d_bytes_per_s = 0;
    size_t pinned_copy_bytes = 0;
};

// Coherent CPU-GPU memory: pageable host memory accessed through the host's page tables (both
// attributes above). A GPU reaching pageable memory through HMM page migration alone is not.
bool host_memory_coherent(const HostLinkInfo& link);

// Where lathe puts host-resident buffers that the GPU reads: system-allocated (malloc'ed,
// placed on the GPU's closest host NUMA node) memory where the link is coherent, page-locked
// memory (cudaMallocHost / cudaHostRegister) elsewhere.
enum class HostMemoryPath { kPageLocked, kSystemAllocated };
HostMemoryPath choose_host_memory_path(const HostLinkInfo& link);

// `lathe doctor`'s answer: "yes (...)" or "no (...)" with the attributes behind it, or
// "unknown (<error>)" when they could not be read.
std::string host_coherence_summary(const HostLinkInfo& link);

// The host NUMA node of the PCI device `pci_bus_id` from `sysfs_root`/bus/pci/devices/<id>/
// numa_node (sysfs_root is "/sys" on a real machine); -1 when the file is missing, unreadable or
// says -1 (no NUMA).
int pci_numa_node(const std::string& sysfs_root, const std::string& pci_bus_id);

// Probes `device`'s link to the host as described above; with `measure_bandwidth`, times
// pinned host -> device copies of `copy_bytes` (a few hundred MiB of host and device memory for
// the duration). Never stops: what fails is in error.
HostLinkInfo host_link_probe(int device, bool measure_bandwidth,
                             size_t copy_bytes = size_t(256) << 20);

// Device memory of `device`: false (and nothing written) when the build has no CUDA or the query
// fails. Used by `lathe bench` to measure what the run keeps resident.
bool gpu_memory_info(int device, size_t& free_bytes, size_t& total_bytes);

}  // namespace lathe
