#include "data/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace lathe {
namespace {

std::string temp_dir() {
    const auto dir =
        std::filesystem::temp_directory_path() / ("lathe_npy_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::string padded(std::string_view dict, size_t total) {
    std::string s(dict);
    s.append(total - s.size() - 1, ' ');
    s.push_back('\n');
    return s;
}

TEST(Npy, HeaderIsByteIdenticalToNumpySave) {
    // numpy 2.4.6: io.BytesIO + np.save(np.arange(10, dtype=np.int32)) starts with these 128 bytes.
    const std::vector<int64_t> shape1 = {10};
    EXPECT_EQ(npy_header(NpyDtype::kInt32, shape1),
              std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                  padded("{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }", 118));
    // np.zeros((5, 2), dtype=np.int64)
    const std::vector<int64_t> shape2 = {5, 2};
    EXPECT_EQ(npy_header(NpyDtype::kInt64, shape2),
              std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                  padded("{'descr': '<i8', 'fortran_order': False, 'shape': (5, 2), }", 118));
    EXPECT_EQ(npy_header(NpyDtype::kUint32, shape1).size() % 64, 0u);
}

TEST(Npy, RoundTripsEveryDtype) {
    const std::string dir = temp_dir();
    const std::vector<int64_t> values = {0, 1, -2, 3, 123456789, -1};
    const std::vector<int64_t> shape = {3, 2};
    ASSERT_TRUE(npy_write(dir + "/a.npy", std::span<const int64_t>(values), shape).ok());
    auto a = NpyArray::open(dir + "/a.npy");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->dtype(), NpyDtype::kInt64);
    EXPECT_EQ(a->shape(), shape);
    EXPECT_EQ(std::vector<int64_t>(a->values<int64_t>().begin(), a->values<int64_t>().end()),
              values);

    const std::vector<uint32_t> u = {7, 8, 9};
    const std::vector<int64_t> ushape = {3};
    ASSERT_TRUE(npy_write(dir + "/u.npy", std::span<const uint32_t>(u), ushape).ok());
    auto b = NpyArray::open(dir + "/u.npy");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->dtype(), NpyDtype::kUint32);
    EXPECT_EQ(b->values<uint32_t>()[2], 9u);

    const std::vector<int64_t> empty_shape = {0};
    ASSERT_TRUE(npy_write(dir + "/e.npy", std::span<const int32_t>(), empty_shape).ok());
    auto e = NpyArray::open(dir + "/e.npy");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->size(), 0);
}

TEST(Npy, ReadsOlderLayouts) {
    const std::string dir = temp_dir();
    // Version 2.0 header, 16-byte alignment and Python 2's "3L" shape, as old numpy wrote them.
    std::string dict = "{'descr': '<i2', 'fortran_order': False, 'shape': (3L,), }";
    std::string file = std::string("\x93NUMPY\x02\x00", 8);
    const size_t text = dict.size() + 1;
    const size_t pad = 16 - ((8 + 4 + text) % 16);
    const uint32_t hlen = static_cast<uint32_t>(text + pad);
    file.append(reinterpret_cast<const char*>(&hlen), 4);
    file += dict + std::string(pad, ' ') + "\n";
    const int16_t data[3] = {-1, 2, 300};
    file.append(reinterpret_cast<const char*>(data), sizeof(data));
    ASSERT_TRUE(file_write_atomic(dir + "/old.npy", file).ok());
    auto a = NpyArray::open(dir + "/old.npy");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->dtype(), NpyDtype::kInt16);
    EXPECT_EQ(a->values<int16_t>()[2], 300);
}

TEST(Npy, CorruptFilesAreDataLossNamingTheFile) {
    const std::string dir = temp_dir();
    const std::vector<int32_t> v = {1, 2, 3, 4};
    const std::vector<int64_t> shape = {4};
    ASSERT_TRUE(npy_write(dir + "/good.npy", std::span<const int32_t>(v), shape).ok());
    const std::string good = *file_read_all(dir + "/good.npy");

    auto expect_corrupt = [&](const std::string& name, const std::string& bytes,
                              const std::string& needle) {
        const std::string path = dir + "/" + name;
        ASSERT_TRUE(file_write_atomic(path, bytes).ok());
        auto a = NpyArray::open(path);
        ASSERT_FALSE(a.ok()) << name;
        EXPECT_EQ(a.status().code(), StatusCode::kDataLoss) << name;
        EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status().message();
        EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status().message();
    };
    expect_corrupt("truncated.npy", good.substr(0, good.size() - 3), "truncated");
    expect_corrupt("extra.npy", good + "xx", "needs 16 data bytes");
    expect_corrupt("magic.npy", "PK\x03\x04" + good.substr(4), "magic");
    std::string big_endian = good;
    big_endian.replace(big_endian.find("<i4"), 3, ">i4");
    expect_corrupt("bigendian.npy", big_endian, "not supported");
    std::string object = good;
    object.replace(object.find("<i4"), 3, "|O8");
    expect_corrupt("object.npy", object, "not supported");
    expect_corrupt("short.npy", "\x93NUM", "magic");

    EXPECT_EQ(NpyArray::open(dir + "/missing.npy").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace lathe
