// The host-link probe of ops/device_info.h: the coherence rule, the path it picks, doctor's
// summary, the sysfs NUMA lookup, and the probe itself on this machine (an error naming why on a
// machine or build without a GPU; attributes and a measured bandwidth on one with a GPU).

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/temp_files_test_util.h"
#include "ops/cuda/memory.h"
#include "ops/device_info.h"

namespace lathe {
namespace {

HostLinkInfo link_with(bool pageable, bool host_page_tables) {
    HostLinkInfo link;
    link.pageable_memory_access = pageable;
    link.uses_host_page_tables = host_page_tables;
    return link;
}

TEST(HostLink, CoherentOnlyThroughTheHostPageTables) {
    // GH200 (NVLink-C2C): both attributes.
    EXPECT_TRUE(host_memory_coherent(link_with(true, true)));
    // x86-64 with HMM: pageable access by page migration, not coherent.
    EXPECT_FALSE(host_memory_coherent(link_with(true, false)));
    // PCIe without HMM.
    EXPECT_FALSE(host_memory_coherent(link_with(false, false)));
    // Attributes that could not be read say nothing, whatever the fields hold.
    HostLinkInfo failed = link_with(true, true);
    failed.error = "cudaGetDeviceCount: no driver";
    EXPECT_FALSE(host_memory_coherent(failed));
}

TEST(HostLink, PathFollowsCoherence) {
    EXPECT_EQ(choose_host_memory_path(link_with(true, true)), HostMemoryPath::kSystemAllocated);
    EXPECT_EQ(choose_host_memory_path(link_with(true, false)), HostMemoryPath::kPageLocked);
    EXPECT_EQ(choose_host_memory_path(link_with(false, false)), HostMemoryPath::kPageLocked);
}

TEST(HostLink, SummaryNamesTheAnswerAndWhy) {
    HostLinkInfo coherent = link_with(true, true);
    coherent.host_native_atomics = true;
    const std::string yes = host_coherence_summary(coherent);
    EXPECT_EQ(yes.rfind("yes (", 0), 0u) << yes;
    EXPECT_NE(yes.find("host's page tables"), std::string::npos) << yes;
    EXPECT_NE(yes.find("native host atomics"), std::string::npos) << yes;
    EXPECT_NE(yes.find("system-allocated"), std::string::npos) << yes;

    const std::string hmm = host_coherence_summary(link_with(true, false));
    EXPECT_EQ(hmm.rfind("no (", 0), 0u) << hmm;
    EXPECT_NE(hmm.find("HMM"), std::string::npos) << hmm;
    EXPECT_NE(hmm.find("page-locked"), std::string::npos) << hmm;

    const std::string pcie = host_coherence_summary(link_with(false, false));
    EXPECT_EQ(pcie.rfind("no (", 0), 0u) << pcie;
    EXPECT_EQ(pcie.find("HMM"), std::string::npos) << pcie;

    HostLinkInfo failed;
    failed.error = "no CUDA device 3 (the runtime lists 1)";
    EXPECT_EQ(host_coherence_summary(failed), "unknown (no CUDA device 3 (the runtime lists 1))");
}

TEST(HostLink, PciNumaNodeFromSysfs) {
    testutil::TempFiles tmp("host_link_test");
    const std::string root = tmp.path("sys");
    for (const char* id : {"0000:1b:00.0", "0009:01:00.0", "0000:2c:00.0"})
        std::filesystem::create_directories(root + "/bus/pci/devices/" + id);
    tmp.write("sys/bus/pci/devices/0000:1b:00.0/numa_node", "1\n");
    tmp.write("sys/bus/pci/devices/0009:01:00.0/numa_node", "-1\n");
    tmp.write("sys/bus/pci/devices/0000:2c:00.0/numa_node", "garbage\n");
    // CUDA writes the bus id in upper case; sysfs in lower case.
    EXPECT_EQ(pci_numa_node(root, "0000:1B:00.0"), 1);
    EXPECT_EQ(pci_numa_node(root, "0000:1b:00.0"), 1);
    EXPECT_EQ(pci_numa_node(root, "0009:01:00.0"), -1);  // no NUMA
    EXPECT_EQ(pci_numa_node(root, "0000:2c:00.0"), -1);  // unreadable
    EXPECT_EQ(pci_numa_node(root, "0000:99:00.0"), -1);  // missing
    EXPECT_EQ(pci_numa_node(root, ""), -1);
}

// The probe on this machine: without a GPU (or CUDA in the build) it says why and is not
// coherent; with one it reads the attributes and measures a bandwidth above zero.
TEST(HostLink, ProbeOnThisMachine) {
    const size_t bytes = size_t(8) << 20;
    const HostLinkInfo link = host_link_probe(0, /*measure_bandwidth=*/true, bytes);
    EXPECT_EQ(link.ordinal, 0);
    if (cuda_device_count() == 0) {
        EXPECT_FALSE(link.error.empty());
        EXPECT_FALSE(host_memory_coherent(link));
        EXPECT_EQ(link.pinned_h2d_bytes_per_s, 0.0);
        EXPECT_EQ(host_coherence_summary(link).rfind("unknown (", 0), 0u);
    } else {
        EXPECT_TRUE(link.error.empty()) << link.error;
        EXPECT_EQ(link.pinned_copy_bytes, bytes);
        EXPECT_GT(link.pinned_h2d_bytes_per_s, 0.0);
        EXPECT_FALSE(link.pci_bus_id.empty());
    }
    const HostLinkInfo missing = host_link_probe(1 << 20, false);
    EXPECT_FALSE(missing.error.empty());
}

}  // namespace
}  // namespace lathe
