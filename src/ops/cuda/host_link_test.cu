// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// host_link_probe on a real GPU: the attributes read without error, a pinned host -> device
// bandwidth measured, the PCI device's NUMA node when the system has NUMA, and the coherence
// answer of the host architecture: an x86-64 host has no coherent CPU-GPU link (PCIe, at most
// HMM page migration); an aarch64 Grace host with NVLink-C2C does.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "ops/device_info.h"

namespace lathe {
namespace {

TEST(HostLinkGpu, AttributesAndBandwidth) {
    const size_t bytes = size_t(256) << 20;
    const HostLinkInfo link = host_link_probe(0, true, bytes);
    ASSERT_TRUE(link.error.empty()) << link.error;
    EXPECT_FALSE(link.pci_bus_id.empty());
    EXPECT_EQ(link.pinned_copy_bytes, bytes);
    // Any PCIe 3 x16 link or better moves more than 5 GB/s pinned; well below what H100 (PCIe 5,
    // about 50 GB/s) and GH200 (C2C, several hundred GB/s) reach.
    EXPECT_GT(link.pinned_h2d_bytes_per_s, 5e9) << host_coherence_summary(link);
    const std::string summary = host_coherence_summary(link);
#if defined(__x86_64__)
    EXPECT_FALSE(host_memory_coherent(link)) << summary;
    EXPECT_EQ(summary.rfind("no (", 0), 0u) << summary;
    EXPECT_EQ(choose_host_memory_path(link), HostMemoryPath::kPageLocked);
#endif
    std::printf("host link of GPU 0 (%s): coherent %s; %.1f GB/s pinned h2d; host NUMA node %d\n",
                link.pci_bus_id.c_str(), summary.c_str(), link.pinned_h2d_bytes_per_s / 1e9,
                link.host_numa_node);
}

}  // namespace
}  // namespace lathe
