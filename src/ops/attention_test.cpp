#include "ops/attention.h"

#include <cmath>
#include <vector>

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

struct Case {
    int64_t B, T, H, Hkv, D, window;
    bool docs;
};

// Naive attention built from separate simple steps: a full (T, T) mask, full scores, a row
// softmax, then P V. Written independently of ops/cpu/attention.cpp.
void naive_attention(HostTensor& out, HostTensor& lse, const HostTensor& q, const HostTensor& k,
                     const HostTensor& v, const int32_t* docs, const Case& c, float scale) {
    const int64_t T = c.T, D = c.D;
    for (int64_t b = 0; b < c.B; ++b) {
        std::vector<std::vector<bool>> allowed(static_cast<size_t>(T),
                                               std::vector<bool>(static_cast<size_t>(T)));
        for (int64_t i = 0; i < T; ++i)
            for (int64_t j = 0; j < T; ++j)
                allowed[i][j] = j <= i && (c.window == 0 || i - j < c.window) &&
                                (docs == nullptr || docs[b * T + i] == docs[b * T + j]);
        for (int64_t h = 0; h < c.H; ++h) {
            const int64_t kvh = h * c.Hkv / c.H;  // HF repeat_kv: head h reads kv head h // n_rep
            std::vector<std::vector<double>> score(
                static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(T), 0.0));
            for (int64_t i = 0; i < T; ++i)
                for (int64_t j = 0; j < T; ++j)
                    for (int64_t d = 0; d < D; ++d)
                        score[i][j] += double(q.as<float>()[((b * T + i) * c.H + h) * D + d]) *
                                       k.as<float>()[((b * T + j) * c.Hkv + kvh) * D + d];
            for (int64_t i = 0; i < T; ++i) {
                double total = 0.0;
                for (int64_t j = 0; j < T; ++j)
                    if (allowed[i][j]) total += std::exp(scale * score[i][j]);
                lse.as<float>()[(b * c.H + h) * T + i] = float(std::log(total));
                for (int64_t d = 0; d < D; ++d) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < T; ++j)
                        if (allowed[i][j])
                            acc += std::exp(scale * score[i][j]) / total *
                                   v.as<float>()[((b * T + j) * c.Hkv + kvh) * D + d];
                    out.as<float>()[((b * T + i) * c.H + h) * D + d] = float(acc);
                }
            }
        }
    }
}

HostTensor make_docs(Rng& rng, int64_t B, int64_t T) {
    // Packed documents: ids rise along the sequence at random boundaries.
    HostTensor docs(DType::kI32, Shape{B, T});
    for (int64_t b = 0; b < B; ++b) {
        int32_t id = 0;
        for (int64_t t = 0; t < T; ++t) {
            if (t > 0 && rng.integer(0, 2) == 0) ++id;
            docs.as<int32_t>()[b * T + t] = id;
        }
    }
    return docs;
}

const Case kCases[] = {
    {2, 6, 2, 2, 4, 0, false},  // plain multi-head causal
    {1, 7, 4, 2, 3, 0, false},  // GQA, 2 query heads per kv head
    {2, 7, 4, 1, 4, 3, false},  // multi-query + sliding window
    {2, 8, 2, 2, 4, 0, true},   // packed documents
    {1, 9, 6, 2, 4, 4, true},   // everything together
};

TEST(Attention, ForwardMatchesNaiveReference) {
    const Context ctx = cpu_context();
    Rng rng(61);
    for (const Case& c : kCases) {
        HostTensor q = random_tensor(rng, Shape{c.B, c.T, c.H, c.D});
        HostTensor k = random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D});
        HostTensor v = random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D});
        HostTensor docs = make_docs(rng, c.B, c.T);
        const ConstTensorView dv = c.docs ? ConstTensorView(docs.view()) : ConstTensorView();
        const float scale = 1.0f / std::sqrt(float(c.D));
        HostTensor out = f32(q.shape()), lse = f32(Shape{c.B, c.H, c.T});
        HostTensor ref = f32(q.shape()), ref_lse = f32(Shape{c.B, c.H, c.T});
        attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), dv, c.window, scale,
                          ctx);
        naive_attention(ref, ref_lse, q, k, v, c.docs ? docs.as<int32_t>() : nullptr, c, scale);
        EXPECT_TRUE(close_to(out.view(), ref.view(), 1e-6)) << "H " << c.H << " Hkv " << c.Hkv;
        EXPECT_TRUE(close_to(lse.view(), ref_lse.view(), 1e-6));
    }
}

// GQA is multi-head attention with each kv head repeated for its group (HF's repeat_kv).
TEST(Attention, GroupedQueryEqualsRepeatedKeyValueHeads) {
    const Context ctx = cpu_context();
    Rng rng(62);
    const int64_t B = 2, T = 5, H = 6, Hkv = 2, D = 4;
    HostTensor q = random_tensor(rng, Shape{B, T, H, D});
    HostTensor k = random_tensor(rng, Shape{B, T, Hkv, D}),
               v = random_tensor(rng, Shape{B, T, Hkv, D});
    HostTensor k_rep = f32(Shape{B, T, H, D}), v_rep = f32(Shape{B, T, H, D});
    for (int64_t bt = 0; bt < B * T; ++bt)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t d = 0; d < D; ++d) {
                k_rep.as<float>()[(bt * H + h) * D + d] = k.as<float>()[(bt * Hkv + h / 3) * D + d];
                v_rep.as<float>()[(bt * H + h) * D + d] = v.as<float>()[(bt * Hkv + h / 3) * D + d];
            }
    HostTensor out1 = f32(q.shape()), out2 = f32(q.shape()), lse = f32(Shape{B, H, T});
    attention_forward(out1.view(), lse.view(), q.view(), k.view(), v.view(), {}, 0, 0.5f, ctx);
    attention_forward(out2.view(), lse.view(), q.view(), k_rep.view(), v_rep.view(), {}, 0, 0.5f,
                      ctx);
    for (int64_t i = 0; i < out1.numel(); ++i) EXPECT_EQ(out1.as<float>()[i], out2.as<float>()[i]);
}

// The window and document rules by hand: with q = 0 every visible key gets the same weight, and
// v[j] = j, so out[i] is the mean index of the keys query i sees.
TEST(Attention, WindowAndDocumentMaskByHand) {
    const Context ctx = cpu_context();
    const int64_t T = 6;
    HostTensor q = f32(Shape{1, T, 1, 1}), k = f32(Shape{1, T, 1, 1});
    HostTensor v = tensor_of(Shape{1, T, 1, 1}, {0, 1, 2, 3, 4, 5});
    HostTensor out = f32(Shape{1, T, 1, 1}), lse = f32(Shape{1, 1, T});
    auto run = [&](int64_t window, ConstTensorView docs) {
        attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), docs, window, 1.0f,
                          ctx);
        return std::vector<float>(out.as<float>(), out.as<float>() + T);
    };
    EXPECT_EQ(run(0, {}), (std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f}));
    // Mistral window 2: query i sees i - 1 and i (i - window < j <= i).
    EXPECT_EQ(run(2, {}), (std::vector<float>{0, 0.5f, 1.5f, 2.5f, 3.5f, 4.5f}));
    EXPECT_EQ(run(1, {}), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    HostTensor docs = ids_of(Shape{1, T}, {0, 0, 1, 1, 1, 2});
    EXPECT_EQ(run(0, docs.view()), (std::vector<float>{0, 0.5f, 2, 2.5f, 3, 5}));
    EXPECT_EQ(run(2, docs.view()), (std::vector<float>{0, 0.5f, 2, 2.5f, 3.5f, 5}));
    EXPECT_NEAR(lse.as<float>()[4], std::log(2.0f), 1e-7);  // two keys with score 0
}

TEST(Attention, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(63);
    for (const Case& c : kCases) {
        HostTensor q = random_tensor(rng, Shape{c.B, c.T, c.H, c.D});
        HostTensor k = random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D});
        HostTensor v = random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D});
        HostTensor docs = make_docs(rng, c.B, c.T);
        const ConstTensorView dv_docs = c.docs ? ConstTensorView(docs.view()) : ConstTensorView();
        const float scale = 1.0f / std::sqrt(float(c.D));
        HostTensor out = f32(q.shape()), lse = f32(Shape{c.B, c.H, c.T});
        HostTensor r = random_tensor(rng, q.shape());
        auto loss = [&] {
            attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), dv_docs,
                              c.window, scale, ctx);
            return weighted_sum(out.view(), r.view());
        };
        loss();
        HostTensor dq = f32(q.shape()), dk = f32(k.shape()), dv = f32(v.shape());
        attention_backward(dq.view(), dk.view(), dv.view(), r.view(), q.view(), k.view(), v.view(),
                           out.view(), lse.view(), dv_docs, c.window, scale, ctx);
        EXPECT_TRUE(gradient_matches(q, dq, loss)) << "q, H " << c.H << " window " << c.window;
        EXPECT_TRUE(gradient_matches(k, dk, loss)) << "k, H " << c.H << " window " << c.window;
        EXPECT_TRUE(gradient_matches(v, dv, loss)) << "v, H " << c.H << " window " << c.window;
    }
}

}  // namespace
}  // namespace lathe::optest
