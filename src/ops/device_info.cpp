#include "ops/device_info.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <initializer_list>

#include "ops/cuda/device_info.h"
#include "ops/cuda/host_link.h"

namespace lathe {
namespace {

// A library opened with dlopen, closed on destruction. Closing only drops our reference: a
// library the process also links (libcudnn once the ops link it) stays loaded.
class DlHandle {
public:
    explicit DlHandle(void* handle) : handle_(handle) {}
    ~DlHandle() {
        if (handle_ != nullptr) dlclose(handle_);
    }
    DlHandle(const DlHandle&) = delete;
    DlHandle& operator=(const DlHandle&) = delete;
    void* get() const { return handle_; }

private:
    void* handle_;
};

// Opens the first of `names` the dynamic loader finds (its usual search: LD_LIBRARY_PATH,
// ld.so.cache, the default folders) and reads its version through `symbol`, a function
// returning the encoded version (size_t cudnnGetVersion(void) or int ncclGetVersion(int*) style,
// told apart by `by_pointer`). The version is decoded by `decode`.
template <typename Decode>
GpuLibraryInfo probe_library(std::initializer_list<const char*> names, const char* symbol,
                             bool by_pointer, Decode decode) {
    GpuLibraryInfo info;
    std::string tried;
    for (const char* name : names) {
        DlHandle lib(dlopen(name, RTLD_NOW | RTLD_LOCAL));
        if (lib.get() == nullptr) {
            const char* why = dlerror();
            tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why != nullptr ? why : name);
            continue;
        }
        void* fn = dlsym(lib.get(), symbol);
        if (fn == nullptr) {
            info.detail = fmt::format("{} has no {}", name, symbol);
            return info;
        }
        if (by_pointer) {
            int version = 0;
            // ncclResult_t ncclGetVersion(int* version): 0 is ncclSuccess.
            const int rc = reinterpret_cast<int (*)(int*)>(fn)(&version);
            if (rc != 0) {
                info.detail = fmt::format("{}: {} returned error {}", name, symbol, rc);
                return info;
            }
            info.version = decode(size_t(version));
        } else {
            info.version = decode(reinterpret_cast<size_t (*)()>(fn)());
        }
        info.found = true;
        Dl_info where{};
        info.detail = dladdr(fn, &where) != 0 && where.dli_fname != nullptr
                          ? std::string(where.dli_fname)
                          : std::string(name);
        return info;
    }
    info.detail = "not found (" + tried + ")";
    return info;
}

// The driver's release ("580.159.04") through NVML, which ships with the driver
// (libnvidia-ml.so.1); empty when NVML is not there or fails. Its functions return 0 on success.
std::string nvml_driver_release() {
    DlHandle lib(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
    if (lib.get() == nullptr) return {};
    auto init = reinterpret_cast<int (*)()>(dlsym(lib.get(), "nvmlInit_v2"));
    auto get =
        reinterpret_cast<int (*)(char*, unsigned)>(dlsym(lib.get(), "nvmlSystemGetDriverVersion"));
    auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib.get(), "nvmlShutdown"));
    if (init == nullptr || get == nullptr || shutdown == nullptr || init() != 0) return {};
    char version[96] = {};  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE is 80
    const bool ok = get(version, sizeof(version)) == 0;
    shutdown();
    return ok ? std::string(version) : std::string();
}

}  // namespace

std::string cuda_version_string(int version) {
    return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string library_version_string(size_t version) {
    return fmt::format("{}.{}.{}", version / 10000, (version / 100) % 100, version % 100);
}

std::string nccl_version_string(int version) {
    // NCCL_VERSION(X, Y, Z) in nccl.h: X * 1000 + Y * 100 + Z up to 2.8, X * 10000 + Y * 100 + Z
    // from 2.9 on (so every new-style code is >= 20900, every old one < 10000).
    if (version >= 10000) return library_version_string(size_t(version));
    return fmt::format("{}.{}.{}", version / 1000, (version / 100) % 10, version % 100);
}

GpuEnvironment gpu_environment_probe(int only_device) {
    GpuEnvironment env;
    cuda::probe_environment(env, only_device);
    env.driver_release = nvml_driver_release();
    // cudnnGetVersion: CUDNN_VERSION of the library loaded (major * 10000 + minor * 100 + patch
    // since cuDNN 9), which is what runs, whatever header lathe was compiled against.
    env.cudnn = probe_library({"libcudnn.so.9", "libcudnn.so"}, "cudnnGetVersion", false,
                              [](size_t v) { return library_version_string(v); });
    env.nccl = probe_library({"libnccl.so.2", "libnccl.so"}, "ncclGetVersion", true,
                             [](size_t v) { return nccl_version_string(int(v)); });
    return env;
}

bool gpu_memory_info(int device, size_t& free_bytes, size_t& total_bytes) {
    return cuda::memory_info(device, free_bytes, total_bytes);
}

std::vector<GpuSelfTestCheck> gpu_self_test(int device, uint64_t seed) {
    return cuda::gpu_self_test(device, seed);
}

bool host_memory_coherent(const HostLinkInfo& link) {
    return link.error.empty() && link.pageable_memory_access && link.uses_host_page_tables;
}

HostMemoryPath choose_host_memory_path(const HostLinkInfo& link) {
    return host_memory_coherent(link) ? HostMemoryPath::kSystemAllocated
                                      : HostMemoryPath::kPageLocked;
}

std::string host_coherence_summary(const HostLinkInfo& link) {
    if (!link.error.empty()) return "unknown (" + link.error + ")";
    if (host_memory_coherent(link)) {
        return fmt::format(
            "yes (pageable host memory through the host's page tables{}; host buffers are "
            "system-allocated)",
            link.host_native_atomics ? ", native host atomics" : "");
    }
    if (link.pageable_memory_access) {
        return "no (pageable host memory reachable by page migration (HMM), not through the "
               "host's page tables; host buffers are page-locked)";
    }
    return "no (pageable host memory not reachable from the GPU; host buffers are page-locked)";
}

int pci_numa_node(const std::string& sysfs_root, const std::string& pci_bus_id) {
    if (pci_bus_id.empty()) return -1;
    // sysfs names PCI devices in lower case ("0000:1b:00.0"); CUDA writes hex digits in upper
    // case.
    std::string id = pci_bus_id;
    for (char& c : id) c = char(std::tolower(static_cast<unsigned char>(c)));
    std::ifstream in(sysfs_root + "/bus/pci/devices/" + id + "/numa_node");
    int node = -1;
    if (!(in >> node) || node < 0) return -1;
    return node;
}

HostLinkInfo host_link_probe(int device, bool measure_bandwidth, size_t copy_bytes) {
    HostLinkInfo link;
    cuda::probe_host_link(link, device, measure_bandwidth, copy_bytes);
    if (link.host_numa_node < 0) link.host_numa_node = pci_numa_node("/sys", link.pci_bus_id);
    return link;
}

}  // namespace lathe
