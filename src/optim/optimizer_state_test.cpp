// optimizer.safetensors: the bytes (those of the house safetensors writer, dense or sparse), the
// round trip through an optimizer (whole and shard), and the errors of reading, each naming the
// file and the tensor.

#include "optim/optimizer_state.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

std::string fresh_dir(const std::string& name) {
    const fs::path d =
        fs::temp_directory_path() / fmt::format("lathe_optimizer_state_{}_{}", name, ::getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
}

std::string slurp(const std::string& path) {
    Result<std::string> s = file_read_all(path);
    LATHE_CHECK(s.ok(), "{}", s.status().to_string());
    return *s;
}

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * float(i) - 3.0f;
    return v;
}

// What the checkpoints hold, written with the house writer directly (what a saved state must
// stay byte for byte).
Status write_reference(const std::string& path, const std::vector<float>& m,
                       const std::vector<float>& v) {
    const Shape shape{int64_t(m.size())};
    const std::vector<SafetensorsWriteTensor> ts = {
        safetensors_write_tensor("exp_avg", ConstTensorView(m.data(), DType::kF32, shape)),
        safetensors_write_tensor("exp_avg_sq", ConstTensorView(v.data(), DType::kF32, shape))};
    return safetensors_write_file(path, ts,
                                  {{"format", "lathe-adamw"}, {"layout", "parameter arena"}});
}

TEST(OptimizerState, BytesAreTheHouseWritersForTheTwoMoments) {
    const std::string dir = fresh_dir("bytes");
    for (size_t n : {size_t(0), size_t(1), size_t(37), size_t(123456)}) {
        const std::vector<float> m = ramp(n, 0.5f), v = ramp(n, 0.25f);
        ASSERT_TRUE(optimizer_state_write(dir + "/a.safetensors", m, v).ok());
        ASSERT_TRUE(write_reference(dir + "/b.safetensors", m, v).ok());
        EXPECT_EQ(slurp(dir + "/a.safetensors"), slurp(dir + "/b.safetensors")) << n;
        // The sparse zero file is the same bytes as the dense one for zeros.
        const std::vector<float> zeros(n, 0.0f);
        ASSERT_TRUE(optimizer_state_write_zeros(dir + "/sparse.safetensors", n).ok());
        ASSERT_TRUE(write_reference(dir + "/dense.safetensors", zeros, zeros).ok());
        EXPECT_EQ(slurp(dir + "/sparse.safetensors"), slurp(dir + "/dense.safetensors")) << n;
    }
    // Nothing is left under a temporary name.
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    fs::remove_all(dir);
}

TEST(OptimizerState, ReadsBackWholeAndByRange) {
    const std::string dir = fresh_dir("read");
    const std::string path = dir + "/optimizer.safetensors";
    const std::vector<float> m = ramp(100, 0.5f), v = ramp(100, 0.125f);
    ASSERT_TRUE(optimizer_state_write(path, m, v).ok());
    std::vector<float> rm(100), rv(100);
    ASSERT_TRUE(optimizer_state_read(path, 100, {0, 100}, rm, rv).ok());
    EXPECT_EQ(rm, m);
    EXPECT_EQ(rv, v);
    std::vector<float> sm(30), sv(30);
    ASSERT_TRUE(optimizer_state_read(path, 100, {40, 70}, sm, sv).ok());
    EXPECT_EQ(sm, std::vector<float>(m.begin() + 40, m.begin() + 70));
    EXPECT_EQ(sv, std::vector<float>(v.begin() + 40, v.begin() + 70));
    fs::remove_all(dir);
}

TEST(OptimizerState, SavesAndLoadsAnOptimizerAndItsShards) {
    const std::string dir = fresh_dir("save");
    const std::string path = dir + "/optimizer.safetensors";
    const int64_t P = 257;
    Result<AdamWOptimizer> opt = AdamWOptimizer::create(P, {0, P}, cpu_context());
    ASSERT_TRUE(opt.ok());
    const std::vector<float> m = ramp(size_t(P), 0.5f), v = ramp(size_t(P), 0.75f);
    opt->write_state(m, v);
    ASSERT_TRUE(optimizer_state_save(*opt, path).ok());
    ASSERT_TRUE(write_reference(dir + "/ref.safetensors", m, v).ok());
    EXPECT_EQ(slurp(path), slurp(dir + "/ref.safetensors"));

    Result<AdamWOptimizer> back = AdamWOptimizer::create(P, {0, P}, cpu_context());
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(optimizer_state_load(*back, path).ok());
    std::vector<float> bm(static_cast<size_t>(P)), bv(static_cast<size_t>(P));
    back->read_state(bm, bv);
    EXPECT_EQ(bm, m);
    EXPECT_EQ(bv, v);

    const FlatRange r = flat_shard(P, 1, 3);
    Result<AdamWOptimizer> shard = AdamWOptimizer::create(P, r, cpu_context());
    ASSERT_TRUE(shard.ok());
    ASSERT_TRUE(optimizer_state_load(*shard, path).ok());
    std::vector<float> smv(static_cast<size_t>(r.size())), svv(static_cast<size_t>(r.size()));
    shard->read_state(smv, svv);
    EXPECT_EQ(smv, std::vector<float>(m.begin() + r.begin, m.begin() + r.end));
    EXPECT_EQ(svv, std::vector<float>(v.begin() + r.begin, v.begin() + r.end));
    fs::remove_all(dir);
}

void expect_error(const Status& s, StatusCode code, const std::vector<std::string>& parts) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const std::string& p : parts)
        EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' in " << s.message();
}

TEST(OptimizerState, ReadErrorsNameTheFileAndTheTensor) {
    const std::string dir = fresh_dir("errors");
    std::vector<float> m(10), v(10);
    // No file.
    const std::string missing = dir + "/none.safetensors";
    expect_error(optimizer_state_read(missing, 10, {0, 10}, m, v), StatusCode::kNotFound,
                 {missing});
    // A tensor missing.
    const std::string only_m = dir + "/only_m.safetensors";
    const std::vector<float> ten(10, 1.0f);
    {
        const std::vector<SafetensorsWriteTensor> ts = {safetensors_write_tensor(
            "exp_avg", ConstTensorView(ten.data(), DType::kF32, Shape{10}))};
        ASSERT_TRUE(safetensors_write_file(only_m, ts, {}).ok());
    }
    expect_error(optimizer_state_read(only_m, 10, {0, 10}, m, v), StatusCode::kNotFound,
                 {only_m, "exp_avg_sq"});
    // The wrong length: written for another model.
    const std::string longer = dir + "/longer.safetensors";
    const std::vector<float> twelve(12, 1.0f);
    ASSERT_TRUE(optimizer_state_write(longer, twelve, twelve).ok());
    expect_error(
        optimizer_state_read(longer, 10, {0, 10}, m, v), StatusCode::kDataLoss,
        {longer, "'exp_avg'", "48 bytes", "expected 10 f32 values", "written for another model"});
    // The wrong dtype (bf16 moments of the right element count).
    const std::string bf16 = dir + "/bf16.safetensors";
    {
        const std::vector<uint16_t> half(10, 0);
        const ConstTensorView hv(half.data(), DType::kBF16, Shape{10});
        const std::vector<SafetensorsWriteTensor> ts = {safetensors_write_tensor("exp_avg", hv),
                                                        safetensors_write_tensor("exp_avg_sq", hv)};
        ASSERT_TRUE(safetensors_write_file(bf16, ts, {}).ok());
    }
    expect_error(optimizer_state_read(bf16, 10, {0, 10}, m, v), StatusCode::kDataLoss,
                 {bf16, "'exp_avg'", "BF16"});
    fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
