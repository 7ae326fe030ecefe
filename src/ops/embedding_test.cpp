#include "ops/embedding.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

TEST(Embedding, ForwardLooksUpTokensAndPositions) {
    const Context ctx = cpu_context();
    HostTensor wte = tensor_of(Shape{3, 2}, {0, 1, 10, 11, 20, 21});
    HostTensor wpe = tensor_of(Shape{4, 2}, {0.5f, 0.25f, 1.5f, 1.25f, 2.5f, 2.25f, 3.5f, 3.25f});
    HostTensor tokens = ids_of(Shape{1, 3}, {2, 0, 2});
    HostTensor out = f32(Shape{1, 3, 2});
    embedding_forward(out.view(), tokens.view(), {}, wte.view(), {}, ctx);
    EXPECT_EQ(out.as<float>()[0], 20.0f);
    EXPECT_EQ(out.as<float>()[3], 1.0f);
    embedding_forward(out.view(), tokens.view(), {}, wte.view(), wpe.view(), ctx);
    EXPECT_EQ(out.as<float>()[0], 20.5f);   // token 2 at position 0
    EXPECT_EQ(out.as<float>()[5], 23.25f);  // token 2 at position 2
    HostTensor positions = ids_of(Shape{1, 3}, {3, 0, 1});
    embedding_forward(out.view(), tokens.view(), positions.view(), wte.view(), wpe.view(), ctx);
    EXPECT_EQ(out.as<float>()[0], 23.5f);
    EXPECT_EQ(out.as<float>()[5], 22.25f);
}

TEST(Embedding, GradientsMatchFiniteDifferencesAndAccumulate) {
    const Context ctx = cpu_context();
    Rng rng(11);
    const int64_t B = 2, T = 5, C = 4, V = 6, P = 7;
    HostTensor wte = random_tensor(rng, Shape{V, C}), wpe = random_tensor(rng, Shape{P, C});
    HostTensor tokens(DType::kI32, Shape{B, T});
    for (int64_t i = 0; i < B * T; ++i) tokens.as<int32_t>()[i] = int32_t(rng.integer(0, V - 1));
    tokens.as<int32_t>()[1] = tokens.as<int32_t>()[7];  // a repeated token sums its rows
    HostTensor out = f32(Shape{B, T, C}), r = random_tensor(rng, Shape{B, T, C});
    auto loss = [&] {
        embedding_forward(out.view(), tokens.view(), {}, wte.view(), wpe.view(), ctx);
        return weighted_sum(out.view(), r.view());
    };
    HostTensor dwte = f32(Shape{V, C}), dwpe = f32(Shape{P, C});
    embedding_backward(dwte.view(), dwpe.view(), r.view(), tokens.view(), {}, ctx);
    EXPECT_TRUE(gradient_matches(wte, dwte, loss)) << "wte";
    EXPECT_TRUE(gradient_matches(wpe, dwpe, loss)) << "wpe";
    // += : a second backward doubles the gradients.
    HostTensor once = copy_tensor(dwte.view());
    embedding_backward(dwte.view(), {}, r.view(), tokens.view(), {}, ctx);
    for (int64_t i = 0; i < V * C; ++i)
        EXPECT_FLOAT_EQ(dwte.as<float>()[i], 2 * once.as<float>()[i]);
}

TEST(EmbeddingDeathTest, TokenOutsideVocabularyStops) {
    HostTensor wte = f32(Shape{3, 2});
    HostTensor tokens = ids_of(Shape{1, 1}, {3});
    HostTensor out = f32(Shape{1, 1, 2});
    EXPECT_DEATH(embedding_forward(out.view(), tokens.view(), {}, wte.view(), {}, cpu_context()),
                 "token id 3 at row 0 outside \\[0, 3\\)");
}

}  // namespace
}  // namespace lathe::optest
