// FP8 settings, policy and delayed-scaling state (model/fp8_state.h).

#include "model/fp8_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "ops/fp8_cast.h"

namespace lathe {
namespace {

Result<Fp8Settings> parse(std::string_view recipe, std::string_view grad = "e5m2",
                          int64_t history = 16, std::string_view reduction = "max") {
    // Each key from its own line of a config file: the messages name the key's line.
    return fp8_settings_parse(recipe, grad, false, history, reduction, [](std::string_view key) {
        return std::string(key == "fp8.recipe" ? "run.yaml:3" : "run.yaml:7");
    });
}

TEST(Fp8Settings, ParsesEachRecipe) {
    auto t = parse("tensorwise");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t.value().recipe, Fp8Recipe::kTensorwise);
    EXPECT_EQ(t.value().grad_dtype, DType::kE5M2);
    auto d = parse("delayed", "e4m3", 32, "most_recent");
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d.value().recipe, Fp8Recipe::kDelayed);
    EXPECT_EQ(d.value().grad_dtype, DType::kE4M3);
    EXPECT_EQ(d.value().amax_history, 32);
    EXPECT_EQ(d.value().amax_reduction, Fp8AmaxReduction::kMostRecent);
    auto b = parse("blockwise", "e4m3");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b.value().recipe, Fp8Recipe::kBlockwise);
    // auto: E5M2 gradients, E4M3 for blockwise.
    EXPECT_EQ(parse("tensorwise", "auto").value().grad_dtype, DType::kE5M2);
    EXPECT_EQ(parse("blockwise", "auto").value().grad_dtype, DType::kE4M3);
}

TEST(Fp8Settings, RefusesBadValuesNamingKeyAndSource) {
    auto r = parse("rowwise");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("run.yaml:3: 'fp8.recipe' is 'rowwise'"), std::string::npos)
        << r.status().message();
    r = parse("tensorwise", "e3m4");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'fp8.grad_format' is 'e3m4'"), std::string::npos);
    r = parse("blockwise", "e5m2");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("set fp8.grad_format: e4m3"), std::string::npos);
    r = parse("delayed", "e5m2", 0);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("run.yaml:7: 'fp8.amax_history' is 0"), std::string::npos);
    r = parse("delayed", "e5m2", kFp8MaxAmaxHistory + 1);
    ASSERT_FALSE(r.ok());
    r = parse("delayed", "e5m2", 16, "mean");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'fp8.amax_reduction' is 'mean'"), std::string::npos);
}

TEST(Fp8Settings, PolicyPutsTheBlockLinearsInFp8AndTheHeadOnlyWhenAsked) {
    Fp8Settings s;
    PrecisionPolicy p = fp8_precision_policy(s);
    for (LinearRole r :
         {LinearRole::kQkv, LinearRole::kAttnOut, LinearRole::kMlpUp, LinearRole::kMlpDown})
        EXPECT_EQ(p.of(r), LinearPrecision::kFp8PerTensor) << linear_role_name(r);
    EXPECT_EQ(p.of(LinearRole::kLmHead), LinearPrecision::kNative);
    s.lm_head = true;
    s.recipe = Fp8Recipe::kBlockwise;
    p = fp8_precision_policy(s);
    EXPECT_EQ(p.of(LinearRole::kLmHead), LinearPrecision::kFp8Blockwise);
    EXPECT_EQ(p.of(LinearRole::kQkv), LinearPrecision::kFp8Blockwise);
}

TEST(Fp8Settings, TensorIndicesAndGemmCounts) {
    Fp8Settings s;
    EXPECT_EQ(fp8_tensor_count(2, s), 24);  // 2 layers x 4 linears x 3 tensors
    EXPECT_EQ(fp8_tensor_index(2, 0, Fp8Linear::kQkv, Fp8Tensor::kInput), 0);
    EXPECT_EQ(fp8_tensor_index(2, 0, Fp8Linear::kAttnOut, Fp8Tensor::kWeight), 4);
    EXPECT_EQ(fp8_tensor_index(2, 1, Fp8Linear::kMlpDown, Fp8Tensor::kGradOutput), 23);
    EXPECT_EQ(fp8_linear_role(Fp8Linear::kQkv), LinearRole::kQkv);
    EXPECT_EQ(fp8_linear_role(Fp8Linear::kMlpUp), LinearRole::kMlpUp);
    s.lm_head = true;
    EXPECT_EQ(fp8_tensor_count(2, s), 27);
    EXPECT_EQ(fp8_head_tensor_index(2, Fp8Tensor::kWeight), 25);
    // (2 layers x 4 linears + the head) x 3 GEMMs x 4 micro-batches.
    EXPECT_EQ(fp8_gemms_per_step(2, s, 4), (8 + 1) * 3 * 4);
    Fp8GemmCounter c;
    c.add(3);
    c.add(3);
    EXPECT_EQ(c.take(), 6);
    EXPECT_EQ(c.take(), 0);
}

// History 3, max: scales follow the largest of the last three steps' amaxes.
TEST(Fp8ScalingState, DelayedScalesFromTheHistory) {
    Fp8ScalingState st({DType::kE4M3, DType::kE5M2}, 3, Fp8AmaxReduction::kMax);
    EXPECT_EQ(st.scale(0), 1.0f);  // never seen: 1
    st.update();
    EXPECT_EQ(st.scale(0), 1.0f);  // an all-zero history keeps the scale
    st.record(0, 2.0f);
    st.record(0, 4.0f);  // two micro-batches: the step keeps the larger
    st.record(0, 3.0f);
    st.record(1, 8.0f);
    EXPECT_EQ(st.newest_amax(0), 4.0f);
    st.update();
    EXPECT_EQ(st.scale(0), fp8_scale_from_amax(4.0f, DType::kE4M3));  // 112
    EXPECT_EQ(st.scale(1), fp8_scale_from_amax(8.0f, DType::kE5M2));
    st.record(0, 1.0f);
    st.update();
    EXPECT_EQ(st.scale(0), 112.0f);  // 4 is still in the history
    st.record(0, 1.0f);
    st.update();
    EXPECT_EQ(st.scale(0), 112.0f);  // history: 4, 1, 1
    st.record(0, 1.0f);
    st.update();
    EXPECT_EQ(st.scale(0), 448.0f);  // 4 has left: 1, 1, 1
    // A non-finite amax keeps the scale (the step's loss shows the NaN).
    st.record(0, std::numeric_limits<float>::quiet_NaN());
    st.update();
    EXPECT_EQ(st.scale(0), 448.0f);
}

TEST(Fp8ScalingState, MostRecentUsesTheLastStepOnly) {
    Fp8ScalingState st({DType::kE4M3}, 4, Fp8AmaxReduction::kMostRecent);
    st.record(0, 8.0f);
    st.update();
    EXPECT_EQ(st.scale(0), 56.0f);
    st.record(0, 2.0f);
    st.update();
    EXPECT_EQ(st.scale(0), 224.0f);
}

TEST(Fp8ScalingState, SaveLoadIsBitExactAndChecksTheShape) {
    const auto dir = std::filesystem::temp_directory_path() / "lathe_fp8_state_test";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "fp8_state.json").string();
    Fp8ScalingState a({DType::kE4M3, DType::kE4M3, DType::kE5M2}, 5, Fp8AmaxReduction::kMax);
    for (int s = 0; s < 7; ++s) {
        for (int t = 0; t < 3; ++t) a.record(t, 0.1f * float(s + 1) * float(t + 1) + 1e-7f * s);
        a.update();
    }
    a.record(1, 0.3333333f);  // mid-step: a recorded amax of the step in progress
    ASSERT_TRUE(a.save(path).ok());
    Fp8ScalingState b({DType::kE4M3, DType::kE4M3, DType::kE5M2}, 5, Fp8AmaxReduction::kMax);
    ASSERT_TRUE(b.load(path).ok());
    EXPECT_EQ(a, b);
    // Both go on identically.
    a.update();
    b.update();
    EXPECT_EQ(a, b);

    Fp8ScalingState other({DType::kE4M3, DType::kE4M3}, 5, Fp8AmaxReduction::kMax);
    Status st = other.load(path);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("holds 3 tensors, this run scales 2"), std::string::npos)
        << st.message();
    Fp8ScalingState shorter({DType::kE4M3, DType::kE4M3, DType::kE5M2}, 4, Fp8AmaxReduction::kMax);
    st = shorter.load(path);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("fp8.amax_history 5"), std::string::npos) << st.message();
    {
        std::ofstream f(path);
        f << "{\"format\": \"something else\"}";
    }
    st = b.load(path);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("not a lathe fp8 scaling state"), std::string::npos);
    EXPECT_FALSE(b.load((dir / "missing.json").string()).ok());
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lathe
