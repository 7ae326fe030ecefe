// CUPTI activity records through dlopen: see kernel_profile.h.

#include "ops/cuda/kernel_profile.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace lathe::cuda {
namespace {

using RegisterFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
using KindFn = CUptiResult (*)(CUpti_ActivityKind);
using FlushFn = CUptiResult (*)(uint32_t);
using NextFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
using ResultStringFn = CUptiResult (*)(CUptiResult, const char**);

struct Cupti {
    void* lib = nullptr;
    RegisterFn register_callbacks = nullptr;
    KindFn enable = nullptr;
    KindFn disable = nullptr;
    FlushFn flush_all = nullptr;
    NextFn next_record = nullptr;
    ResultStringFn result_string = nullptr;
};

constexpr size_t kBufferBytes = size_t(8) << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

std::mutex g_mutex;
Cupti g_cupti;
bool g_running = false;
std::vector<KernelRecord> g_records;

std::string demangle(const char* name) {
    if (name == nullptr) return "(unnamed)";
    int status = 0;
    char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status != 0 || out == nullptr) return name;
    std::string s(out);
    std::free(out);
    return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    // CUPTI wants 8-byte aligned buffers; aligned_alloc gives that and more.
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(64, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::vector<KernelRecord> got;
    CUpti_Activity* record = nullptr;
    while (g_cupti.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
                got.push_back({demangle(k->name), k->start, k->end, false, k->streamId});
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
                got.push_back({"memcpy", m->start, m->end, true, m->streamId});
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
                got.push_back({"memset", m->start, m->end, true, m->streamId});
                break;
            }
            default:
                break;
        }
    }
    std::free(buffer);
    std::lock_guard<std::mutex> lock(g_mutex);
    for (KernelRecord& r : got) g_records.push_back(std::move(r));
}

std::string cupti_error(CUptiResult r) {
    const char* s = nullptr;
    if (g_cupti.result_string != nullptr && g_cupti.result_string(r, &s) == CUPTI_SUCCESS &&
        s != nullptr)
        return s;
    return "CUPTI error " + std::to_string(int(r));
}

std::string open_cupti() {
    if (g_cupti.lib != nullptr) return {};
    std::vector<std::string> tried;
    if (const char* env = std::getenv("LATHE_CUPTI"); env != nullptr && *env != '\0')
        tried.push_back(env);
    tried.push_back("libcupti.so.13");
    tried.push_back("/usr/local/cuda/lib64/libcupti.so.13");
    tried.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13");
    std::string errors;
    for (const std::string& path : tried) {
        g_cupti.lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (g_cupti.lib != nullptr) break;
        const char* e = dlerror();
        errors += "\n  " + path + ": " + (e != nullptr ? e : "not found");
    }
    if (g_cupti.lib == nullptr)
        return "the kernel breakdown needs CUPTI (libcupti.so.13, part of the CUDA toolkit), and "
               "none loaded:" +
               errors + "\nset LATHE_CUPTI to the library's path";
    const auto sym = [&](const char* name) { return dlsym(g_cupti.lib, name); };
    g_cupti.register_callbacks =
        reinterpret_cast<RegisterFn>(sym("cuptiActivityRegisterCallbacks"));
    g_cupti.enable = reinterpret_cast<KindFn>(sym("cuptiActivityEnable"));
    g_cupti.disable = reinterpret_cast<KindFn>(sym("cuptiActivityDisable"));
    g_cupti.flush_all = reinterpret_cast<FlushFn>(sym("cuptiActivityFlushAll"));
    g_cupti.next_record = reinterpret_cast<NextFn>(sym("cuptiActivityGetNextRecord"));
    g_cupti.result_string = reinterpret_cast<ResultStringFn>(sym("cuptiGetResultString"));
    if (!g_cupti.register_callbacks || !g_cupti.enable || !g_cupti.disable || !g_cupti.flush_all ||
        !g_cupti.next_record) {
        dlclose(g_cupti.lib);
        g_cupti = Cupti{};
        return "the CUPTI library that loaded lacks the activity API (cuptiActivity*): set "
               "LATHE_CUPTI to CUDA 13's libcupti.so.13";
    }
    return {};
}

}  // namespace

std::string kernel_profile_start() {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_running) return "a kernel profile is running already";
    if (std::string e = open_cupti(); !e.empty()) return e;
    if (CUptiResult r = g_cupti.register_callbacks(buffer_requested, buffer_completed);
        r != CUPTI_SUCCESS)
        return "cuptiActivityRegisterCallbacks: " + cupti_error(r);
    for (CUpti_ActivityKind kind : kKinds) {
        if (CUptiResult r = g_cupti.enable(kind); r != CUPTI_SUCCESS)
            return "cuptiActivityEnable(" + std::to_string(int(kind)) + "): " + cupti_error(r);
    }
    g_records.clear();
    g_running = true;
    return {};
}

std::string kernel_profile_stop(std::vector<KernelRecord>& out) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (!g_running) return "no kernel profile is running";
    }
    // The flush calls buffer_completed, which takes the mutex: not held here.
    const CUptiResult flushed = g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (CUpti_ActivityKind kind : kKinds) g_cupti.disable(kind);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_running = false;
    if (flushed != CUPTI_SUCCESS) return "cuptiActivityFlushAll: " + cupti_error(flushed);
    out = std::move(g_records);
    g_records.clear();
    return {};
}

}  // namespace lathe::cuda
