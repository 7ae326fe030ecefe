#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/arena.h"

namespace lathe {
namespace {

TEST(Tensor, ShapeBasics) {
    const Shape s{2, 3, 4};
    EXPECT_EQ(s.rank(), 3);
    EXPECT_EQ(s.numel(), 24);
    EXPECT_EQ(s[-1], 4);
    EXPECT_EQ(s.to_string(), "(2, 3, 4)");
    EXPECT_EQ(s.with_dim(1, 5), (Shape{2, 5, 4}));
    EXPECT_EQ(Shape{}.numel(), 1);
    EXPECT_FALSE(s == (Shape{2, 3}));
}

TEST(Tensor, ViewsAreTypedAndSliceRows) {
    HostTensor t(DType::kF32, Shape{4, 3});
    float* p = t.as<float>();
    for (int i = 0; i < 12; ++i) p[i] = float(i);
    ConstTensorView v = t.view();  // TensorView converts to ConstTensorView
    EXPECT_EQ(v.bytes(), 48u);
    const ConstTensorView rows = v.slice(1, 3);
    EXPECT_EQ(rows.shape(), (Shape{2, 3}));
    EXPECT_EQ(rows.as<float>()[0], 3.0f);
    EXPECT_EQ(v.reshape(Shape{2, 6}).dim(1), 6);
    EXPECT_TRUE(TensorView().is_null());
    EXPECT_EQ(TensorView().as<float>(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
}

TEST(TensorDeathTest, WrongDtypeOrShapeStops) {
    HostTensor t(DType::kF32, Shape{4, 3});
    EXPECT_DEATH((void)t.view().as<int32_t>(), "view holds f32, accessed as i32");
    EXPECT_DEATH((void)t.view().reshape(Shape{5}), "reshape");
    EXPECT_DEATH((void)t.view().slice(2, 5), "slice");
}

TEST(Tensor, ConvertBetweenFloatTypes) {
    HostTensor f(DType::kF32, Shape{4});
    const float vals[] = {1.0f + 0x1p-8f, -3.0f, 1000.0f, 0.1f};
    std::copy(vals, vals + 4, f.as<float>());
    HostTensor b(DType::kBF16, Shape{2, 2}), e(DType::kE4M3, Shape{4}), back(DType::kF32, Shape{4});
    tensor_convert(b.view(), f.view());
    EXPECT_EQ(b.as<bf16>()[0].bits, float_to_bf16(vals[0]).bits);
    tensor_convert(back.view(), b.view());
    EXPECT_EQ(back.as<float>()[0], 1.0f);  // tie to even
    EXPECT_EQ(back.as<float>()[1], -3.0f);
    tensor_convert(e.view(), b.view());  // bf16 -> e4m3 through fp32, saturating
    tensor_convert(back.view(), e.view());
    EXPECT_EQ(back.as<float>()[2], 448.0f);
    tensor_convert(e.view(), f.view(), Fp8Overflow::kNoSaturate);
    EXPECT_TRUE(std::isnan(e4m3_to_float(e.as<fp8_e4m3>()[2])));
    HostTensor ids(DType::kI32, Shape{4});
    EXPECT_DEATH(tensor_convert(f.view(), ids.view()), "tensor_convert between i32 and f32");
}

TEST(Arena, CarvesAlignedNamedTensors) {
    ArenaLayout layout;
    auto a = layout.add("a", DType::kF32, Shape{3});
    auto b = layout.add("b", DType::kBF16, Shape{10, 10});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(layout.entries()[0].offset, 0u);
    EXPECT_EQ(layout.entries()[1].offset, 256u);  // 12 bytes padded to the alignment
    EXPECT_EQ(layout.total_bytes(), 512u);        // 256 + 200 padded
    const auto dup = layout.add("a", DType::kF32, Shape{1});
    ASSERT_FALSE(dup.ok());
    EXPECT_NE(dup.status().message().find("'a' added twice"), std::string::npos);
    EXPECT_FALSE(layout.find("missing").ok());
    EXPECT_NE(layout.describe().find("b bf16 (10, 10) 200"), std::string::npos);

    auto arena = HostArena::allocate(std::move(layout));
    ASSERT_TRUE(arena.ok());
    auto va = arena->view("a");
    auto vb = arena->view("b");
    ASSERT_TRUE(va.ok() && vb.ok());
    EXPECT_EQ(static_cast<std::byte*>(vb->data()) - static_cast<std::byte*>(va->data()), 256);
    va->as<float>()[2] = 7.0f;
    EXPECT_EQ(arena->view(size_t(0)).as<float>()[2], 7.0f);
    arena->zero();
    EXPECT_EQ(va->as<float>()[2], 0.0f);
    EXPECT_FALSE(arena->view("c").ok());
}

}  // namespace
}  // namespace lathe
