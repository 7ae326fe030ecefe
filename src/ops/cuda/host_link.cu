// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "ops/cuda/host_link.h"

namespace lathe::cuda {
namespace {

std::string error_text(const char* call, cudaError_t err) {
    return std::string(call) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

// Reads one integer attribute; false (with link.error set and the sticky error cleared) when
// the runtime refuses.
bool read_attribute(HostLinkInfo& link, cudaDeviceAttr attr, const char* name, int device,
                    int& value) {
    const cudaError_t err = cudaDeviceGetAttribute(&value, attr, device);
    if (err == cudaSuccess) return true;
    link.error = error_text(name, err);
    (void)cudaGetLastError();
    return false;
}

// Frees what the bandwidth measurement allocated, whichever step failed.
struct CopyResources {
    void* host = nullptr;
    void* device = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~CopyResources() {
        if (start != nullptr) cudaEventDestroy(start);
        if (stop != nullptr) cudaEventDestroy(stop);
        if (stream != nullptr) cudaStreamDestroy(stream);
        if (device != nullptr) cudaFree(device);
        if (host != nullptr) cudaFreeHost(host);
        (void)cudaGetLastError();
    }
};

// Best bandwidth (bytes/s) of kCopies pinned host -> device copies of `bytes` after one warm-up
// copy (the first pays for mapping the pages); 0 with link.error set when a call fails.
double measure_pinned_h2d(HostLinkInfo& link, size_t bytes) {
    constexpr int kCopies = 5;
    CopyResources r;
    cudaError_t err = cudaMallocHost(&r.host, bytes);
    if (err != cudaSuccess) return link.error = error_text("cudaMallocHost", err), 0.0;
    err = cudaMalloc(&r.device, bytes);
    if (err != cudaSuccess) return link.error = error_text("cudaMalloc", err), 0.0;
    // Touch every host page, so the timed copies measure the link and not first-touch faults.
    for (size_t i = 0; i < bytes; i += 4096) static_cast<unsigned char*>(r.host)[i] = 1;
    if ((err = cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaEventCreate(&r.start)) != cudaSuccess ||
        (err = cudaEventCreate(&r.stop)) != cudaSuccess)
        return link.error = error_text("stream/event creation", err), 0.0;
    double best = 0;
    for (int i = 0; i <= kCopies; ++i) {
        if ((err = cudaEventRecord(r.start, r.stream)) != cudaSuccess ||
            (err = cudaMemcpyAsync(r.device, r.host, bytes, cudaMemcpyHostToDevice, r.stream)) !=
                cudaSuccess ||
            (err = cudaEventRecord(r.stop, r.stream)) != cudaSuccess ||
            (err = cudaEventSynchronize(r.stop)) != cudaSuccess)
            return link.error = error_text("pinned host -> device copy", err), 0.0;
        float ms = 0;
        if ((err = cudaEventElapsedTime(&ms, r.start, r.stop)) != cudaSuccess)
            return link.error = error_text("cudaEventElapsedTime", err), 0.0;
        if (i > 0 && ms > 0) best = std::max(best, double(bytes) / (double(ms) * 1e-3));
    }
    return best;
}

}  // namespace

void probe_host_link(HostLinkInfo& link, int device, bool measure_bandwidth, size_t copy_bytes) {
    link.ordinal = device;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        link.error = error_text("cudaGetDeviceCount", err);
        (void)cudaGetLastError();
        return;
    }
    if (device < 0 || device >= count) {
        link.error = "no CUDA device " + std::to_string(device) + " (the runtime lists " +
                     std::to_string(count) + ")";
        return;
    }
    int value = 0;
    if (!read_attribute(link, cudaDevAttrPageableMemoryAccess, "cudaDevAttrPageableMemoryAccess",
                        device, value))
        return;
    link.pageable_memory_access = value != 0;
    if (!read_attribute(link, cudaDevAttrPageableMemoryAccessUsesHostPageTables,
                        "cudaDevAttrPageableMemoryAccessUsesHostPageTables", device, value))
        return;
    link.uses_host_page_tables = value != 0;
    if (!read_attribute(link, cudaDevAttrHostNativeAtomicSupported,
                        "cudaDevAttrHostNativeAtomicSupported", device, value))
        return;
    link.host_native_atomics = value != 0;
    // NUMA attributes exist from CUDA 12.2 on; a driver that does not know them leaves -1.
    int numa_config = 0;
    if (cudaDeviceGetAttribute(&numa_config, cudaDevAttrNumaConfig, device) == cudaSuccess &&
        numa_config == cudaDeviceNumaConfigNumaNode &&
        cudaDeviceGetAttribute(&value, cudaDevAttrNumaId, device) == cudaSuccess)
        link.gpu_numa_node = value;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrHostNumaId, device) == cudaSuccess)
        link.host_numa_node = value;
    (void)cudaGetLastError();
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, int(sizeof(bus_id)), device) == cudaSuccess)
        link.pci_bus_id = bus_id;
    (void)cudaGetLastError();
    if (!measure_bandwidth || copy_bytes == 0) return;
    if ((err = cudaSetDevice(device)) != cudaSuccess) {
        link.error = error_text("cudaSetDevice", err);
        (void)cudaGetLastError();
        return;
    }
    link.pinned_copy_bytes = copy_bytes;
    link.pinned_h2d_bytes_per_s = measure_pinned_h2d(link, copy_bytes);
}

}  // namespace lathe::cuda
