#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cuda/attention.h"
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

// A case's random inputs, drawn in this order: q (B, T, H, D), k and v (B, T, Hkv, D), document
// ids (B, T); and the scale 1 / sqrt(D).
struct CaseInputs {
    HostTensor q, k, v, docs;
    float scale;
    // The document ids when the case packs documents, else a null view (no document mask).
    ConstTensorView doc_ids(const Case& c) const {
        return c.docs ? ConstTensorView(docs.view()) : ConstTensorView();
    }
};

CaseInputs case_inputs(Rng& rng, const Case& c) {
    return CaseInputs{random_tensor(rng, Shape{c.B, c.T, c.H, c.D}),
                      random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D}),
                      random_tensor(rng, Shape{c.B, c.T, c.Hkv, c.D}), make_docs(rng, c.B, c.T),
                      1.0f / std::sqrt(float(c.D))};
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
        CaseInputs in = case_inputs(rng, c);
        HostTensor &q = in.q, &k = in.k, &v = in.v;
        const ConstTensorView dv = in.doc_ids(c);
        const float scale = in.scale;
        HostTensor out = f32(q.shape()), lse = f32(Shape{c.B, c.H, c.T});
        HostTensor ref = f32(q.shape()), ref_lse = f32(Shape{c.B, c.H, c.T});
        attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), dv, c.window, scale,
                          ctx);
        naive_attention(ref, ref_lse, q, k, v, c.docs ? in.docs.as<int32_t>() : nullptr, c, scale);
        EXPECT_TRUE(close_to(out.view(), ref.view(), 1e-6)) << "H " << c.H << " Hkv " << c.Hkv;
        EXPECT_TRUE(close_to(lse.view(), ref_lse.view(), 1e-6));
    }
}

// q, k, v packed by rows in one buffer (what the model's single q, k, v GEMM writes): the same
// products on strided rows, so the very bits of the separate tensors, forward and backward, and
// every element of dqkv written.
TEST(Attention, PackedQkvIsTheAttentionOfItsSlices) {
    const Context ctx = cpu_context();
    Rng rng(66);
    for (const Case& c : kCases) {
        SCOPED_TRACE(::testing::Message() << "H " << c.H << " Hkv " << c.Hkv << " docs " << c.docs);
        CaseInputs in = case_inputs(rng, c);
        const ConstTensorView docs = in.doc_ids(c);
        const HostTensor dout = random_tensor(rng, in.q.shape());
        HostTensor out = f32(in.q.shape()), lse = f32(Shape{c.B, c.H, c.T});
        attention_forward(out.view(), lse.view(), in.q.view(), in.k.view(), in.v.view(), docs,
                          c.window, in.scale, ctx);
        HostTensor dq = f32(in.q.shape()), dk = f32(in.k.shape()), dv = f32(in.v.shape());
        attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), in.q.view(), in.k.view(),
                           in.v.view(), out.view(), lse.view(), docs, c.window, in.scale, ctx);

        const HostTensor qkv = pack_heads({in.q.view(), in.k.view(), in.v.view()});
        HostTensor out2 = f32(in.q.shape()), lse2 = f32(lse.shape());
        attention_forward_qkv(out2.view(), lse2.view(), qkv.view(), docs, c.window, in.scale, ctx);
        EXPECT_TRUE(bitwise_equal(out2, out));
        EXPECT_TRUE(bitwise_equal(lse2, lse));
        HostTensor dqkv = f32(qkv.shape());
        std::fill_n(dqkv.as<float>(), dqkv.numel(), std::numeric_limits<float>::quiet_NaN());
        attention_backward_qkv(dqkv.view(), dout.view(), qkv.view(), out.view(), lse.view(), docs,
                               c.window, in.scale, ctx);
        EXPECT_TRUE(bitwise_equal(take_heads(dqkv.view(), 0, c.H), dq));
        EXPECT_TRUE(bitwise_equal(take_heads(dqkv.view(), c.H, c.Hkv), dk));
        EXPECT_TRUE(bitwise_equal(take_heads(dqkv.view(), c.H + c.Hkv, c.Hkv), dv));
    }
}

TEST(AttentionDeathTest, PackedQkvNeedsHPlusTwoKeyValueGroups) {
    HostTensor qkv = f32(Shape{1, 4, 5, 4}), out = f32(Shape{1, 4, 2, 4}),
               lse = f32(Shape{1, 2, 4});
    EXPECT_DEATH(
        attention_forward_qkv(out.view(), lse.view(), qkv.view(), {}, 0, 0.5f, cpu_context()),
        "qkv has 5 heads a row and out 2");
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
        CaseInputs in = case_inputs(rng, c);
        HostTensor &q = in.q, &k = in.k, &v = in.v;
        const ConstTensorView dv_docs = in.doc_ids(c);
        const float scale = in.scale;
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

// Rows t0 .. t0 + n - 1 of a (B, T, X, D) tensor as a (B, n, X, D) tensor.
HostTensor rows_of(const HostTensor& x, int64_t t0, int64_t n) {
    const Shape s = x.shape();
    const int64_t B = s[0], T = s[1], row = s[2] * s[3];
    HostTensor r = f32(Shape{B, n, s[2], s[3]});
    for (int64_t b = 0; b < B; ++b)
        std::memcpy(r.as<float>() + b * n * row, x.as<float>() + (b * T + t0) * row,
                    size_t(n * row) * sizeof(float));
    return r;
}

// lse (B, H, T) columns t0 .. t0 + n - 1 as (B, H, n).
HostTensor lse_cols_of(const HostTensor& lse, int64_t t0, int64_t n) {
    const Shape s = lse.shape();
    HostTensor r = f32(Shape{s[0], s[1], n});
    for (int64_t bh = 0; bh < s[0] * s[1]; ++bh)
        for (int64_t i = 0; i < n; ++i)
            r.as<float>()[bh * n + i] = lse.as<float>()[bh * s[2] + t0 + i];
    return r;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
    return a.numel() == b.numel() &&
           std::memcmp(a.as<float>(), b.as<float>(), size_t(a.numel()) * sizeof(float)) == 0;
}

// Queries that continue a cache (the last Tq positions, q_offset = T - Tq, against all T keys)
// give the last Tq rows of the full attention. The two compute each row with the same fp32 sums
// (a dot of D products per score, Tk = T terms per output, fp64 softmax sums), but the matrix
// products run as one sgemm over Tq rows against one over T rows, which BLAS may block
// differently: each output may differ by the rounding of those two fp32 sums, at most
// (D + T) 2^-24 of the scale of scores and values (unit here); 4x that bound is the tolerance.
TEST(Attention, QueriesAtAnOffsetMatchTheLastRowsOfFullAttention) {
    const Context ctx = cpu_context();
    Rng rng(64);
    for (const Case& c : kCases) {
        CaseInputs in = case_inputs(rng, c);
        HostTensor &q = in.q, &k = in.k, &v = in.v;
        const ConstTensorView dv = in.doc_ids(c);
        const float scale = in.scale;
        HostTensor full = f32(q.shape()), full_lse = f32(Shape{c.B, c.H, c.T});
        attention_forward(full.view(), full_lse.view(), q.view(), k.view(), v.view(), dv, c.window,
                          scale, ctx);
        const double tol = 4.0 * double(c.D + c.T) * std::ldexp(1.0, -24);
        for (int64_t Tq : {int64_t(1), int64_t(3), c.T - 1, c.T}) {
            const int64_t offset = c.T - Tq;
            HostTensor qs = rows_of(q, offset, Tq);
            HostTensor out = f32(qs.shape()), lse = f32(Shape{c.B, c.H, Tq});
            attention_forward(out.view(), lse.view(), qs.view(), k.view(), v.view(), dv, c.window,
                              scale, offset, ctx);
            EXPECT_TRUE(close_to(out.view(), rows_of(full, offset, Tq).view(), tol))
                << "Tq " << Tq << " H " << c.H << " Hkv " << c.Hkv << " window " << c.window;
            EXPECT_TRUE(close_to(lse.view(), lse_cols_of(full_lse, offset, Tq).view(), tol))
                << "Tq " << Tq;
        }
    }
}

// Keys past the last query's position are never read: a cache buffer longer than what is filled
// (its tail NaN) gives the same bits as one that ends at the last query (the same products run).
TEST(Attention, KeysPastTheLastQueryAreNeverRead) {
    const Context ctx = cpu_context();
    Rng rng(65);
    const int64_t B = 2, Tq = 3, offset = 4, Tk = 12, H = 4, Hkv = 2, D = 4, filled = offset + Tq;
    HostTensor q = random_tensor(rng, Shape{B, Tq, H, D});
    HostTensor k = random_tensor(rng, Shape{B, Tk, Hkv, D});
    HostTensor v = random_tensor(rng, Shape{B, Tk, Hkv, D});
    HostTensor k_filled = rows_of(k, 0, filled), v_filled = rows_of(v, 0, filled);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = (b * Tk + filled) * Hkv * D; i < (b + 1) * Tk * Hkv * D; ++i)
            k.as<float>()[i] = v.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t window : {int64_t(0), int64_t(3)}) {
        HostTensor out1 = f32(q.shape()), lse1 = f32(Shape{B, H, Tq});
        HostTensor out2 = f32(q.shape()), lse2 = f32(Shape{B, H, Tq});
        attention_forward(out1.view(), lse1.view(), q.view(), k.view(), v.view(), {}, window, 0.5f,
                          offset, ctx);
        attention_forward(out2.view(), lse2.view(), q.view(), k_filled.view(), v_filled.view(), {},
                          window, 0.5f, offset, ctx);
        EXPECT_TRUE(same_bits(out1, out2)) << "window " << window;
        EXPECT_TRUE(same_bits(lse1, lse2)) << "window " << window;
    }
}

// The causal, window and document rules at an offset by hand (q = 0: every visible key weighs the
// same; v[j] = j, so out is the mean position of the keys a query sees).
TEST(Attention, WindowAndDocumentMaskAtAnOffsetByHand) {
    const Context ctx = cpu_context();
    const int64_t T = 6, Tq = 2, offset = 3;  // the queries are at positions 3 and 4
    HostTensor q = f32(Shape{1, Tq, 1, 1}), k = f32(Shape{1, T, 1, 1});
    HostTensor v = tensor_of(Shape{1, T, 1, 1}, {0, 1, 2, 3, 4, 5});
    HostTensor out = f32(Shape{1, Tq, 1, 1}), lse = f32(Shape{1, 1, Tq});
    auto run = [&](int64_t window, ConstTensorView docs) {
        attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), docs, window, 1.0f,
                          offset, ctx);
        return std::vector<float>(out.as<float>(), out.as<float>() + Tq);
    };
    EXPECT_EQ(run(0, {}), (std::vector<float>{1.5f, 2}));       // keys 0..3, 0..4
    EXPECT_EQ(run(2, {}), (std::vector<float>{2.5f, 3.5f}));    // keys 2..3, 3..4
    EXPECT_EQ(run(1, {}), (std::vector<float>{3, 4}));          // itself only
    HostTensor docs = ids_of(Shape{1, T}, {0, 0, 1, 1, 1, 2});  // documents of the key positions
    EXPECT_EQ(run(0, docs.view()), (std::vector<float>{2.5f, 3}));
    EXPECT_EQ(run(2, docs.view()), (std::vector<float>{2.5f, 3.5f}));
    EXPECT_NEAR(lse.as<float>()[1], std::log(2.0f), 1e-7);
}

// The paged decode step is attention_decode over each row's positions laid out in order: rows
// whose blocks are scattered through the pool in a shuffled order (lengths 1, a multiple of the
// block and not), pool blocks no row holds NaN (so a key read through a wrong table entry shows),
// the same bits as attention_decode on the contiguous cache built from the tables.
TEST(Attention, DecodePagedIsTheDecodeOfEachRowsPositionsInOrder) {
    const Context ctx = cpu_context();
    const int64_t B = 3, H = 6, Hkv = 2, D = 4;
    const int32_t len[B] = {1, 8, 11};
    for (int64_t Bk : {int64_t(1), int64_t(4), int64_t(16)}) {
        Rng rng(uint64_t(70 + Bk));
        const int64_t M = (11 + Bk - 1) / Bk, N = B * M + 2, row = Hkv * D;
        HostTensor q = random_tensor(rng, Shape{B, 1, H, D});
        HostTensor kp = random_tensor(rng, Shape{N, Bk, Hkv, D});
        HostTensor vp = random_tensor(rng, Shape{N, Bk, Hkv, D});
        // Block ids in a reversed order: row b's i-th block is N - 1 - (b M + i).
        std::vector<int32_t> table(size_t(B * M), 0);
        std::vector<char> used(size_t(N), 0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < (len[b] + Bk - 1) / Bk; ++i) {
                table[size_t(b * M + i)] = int32_t(N - 1 - (b * M + i));
                used[size_t(N - 1 - (b * M + i))] = 1;
            }
        for (int64_t n = 0; n < N; ++n)
            if (!used[size_t(n)])
                for (int64_t i = n * Bk * row; i < (n + 1) * Bk * row; ++i)
                    kp.as<float>()[i] = vp.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
        const int64_t Tmax = M * Bk;
        HostTensor k = f32(Shape{B, Tmax, Hkv, D}), v = f32(Shape{B, Tmax, Hkv, D});
        for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < len[b]; ++j) {
                const int64_t at = (table[size_t(b * M + j / Bk)] * Bk + j % Bk) * row;
                std::memcpy(k.as<float>() + (b * Tmax + j) * row, kp.as<float>() + at,
                            size_t(row) * sizeof(float));
                std::memcpy(v.as<float>() + (b * Tmax + j) * row, vp.as<float>() + at,
                            size_t(row) * sizeof(float));
            }
        HostTensor tables(DType::kI32, Shape{B, M});
        std::copy(table.begin(), table.end(), tables.as<int32_t>());
        HostTensor lengths = ids_of(Shape{B}, {len[0], len[1], len[2]});
        for (int64_t window : {int64_t(0), int64_t(3)}) {
            HostTensor out = f32(q.shape()), lse = f32(Shape{B, H, 1});
            HostTensor out_ref = f32(q.shape()), lse_ref = f32(Shape{B, H, 1});
            attention_decode_paged(out.view(), lse.view(), q.view(), kp.view(), vp.view(),
                                   tables.view(), lengths.view(), window, 0.5f, ctx);
            attention_decode(out_ref.view(), lse_ref.view(), q.view(), k.view(), v.view(),
                             lengths.view(), window, 0.5f, ctx);
            EXPECT_EQ(std::memcmp(out.as<float>(), out_ref.as<float>(), out.view().bytes()), 0)
                << "Bk " << Bk << " window " << window;
            EXPECT_EQ(std::memcmp(lse.as<float>(), lse_ref.as<float>(), lse.view().bytes()), 0)
                << "Bk " << Bk << " window " << window;
        }
    }
}

// kv_rows_scatter writes row i to pool slot slots[i] and touches no other slot (a slot of -1
// writes nothing); kv_rows_gather reads the slots back in the given order.
TEST(Attention, KvRowsScatterThenGatherReadsTheRowsBack) {
    const Context ctx = cpu_context();
    Rng rng(71);
    const int64_t N = 3, Bk = 4, Hkv = 2, D = 3, row = Hkv * D;
    HostTensor pool = random_tensor(rng, Shape{N, Bk, Hkv, D});
    const HostTensor before = [&] {
        HostTensor c = f32(pool.shape());
        std::memcpy(c.as<float>(), pool.as<float>(), pool.view().bytes());
        return c;
    }();
    HostTensor rows = random_tensor(rng, Shape{3, 1, Hkv, D});
    HostTensor slots = ids_of(Shape{3}, {11, 0, 5});
    // A fourth row with slot -1 (padding) writes nothing.
    HostTensor padded = random_tensor(rng, Shape{4, 1, Hkv, D});
    std::memcpy(padded.as<float>(), rows.as<float>(), rows.view().bytes());
    HostTensor padded_slots = ids_of(Shape{4}, {11, 0, 5, -1});
    kv_rows_scatter(pool.view(), padded.view(), padded_slots.view(), ctx);
    for (int64_t s = 0; s < N * Bk; ++s) {
        const int64_t i = s == 11 ? 0 : s == 0 ? 1 : s == 5 ? 2 : -1;
        const float* want = i >= 0 ? rows.as<float>() + i * row : before.as<float>() + s * row;
        EXPECT_EQ(std::memcmp(pool.as<float>() + s * row, want, size_t(row) * sizeof(float)), 0)
            << "slot " << s;
    }
    HostTensor back = f32(Shape{3, 1, Hkv, D});
    kv_rows_gather(back.view(), pool.view(), slots.view(), ctx);
    EXPECT_EQ(std::memcmp(back.as<float>(), rows.as<float>(), rows.view().bytes()), 0);
}

// The decode step: row b's query against its first lengths[b] cached keys is attention_forward
// with Tq = 1 at q_offset lengths[b] - 1 over those keys (the same products: the same bits), and
// cache slots at or past lengths[b] (NaN here) are never read.
TEST(Attention, DecodeIsTheForwardOfEachRowsLastPosition) {
    const Context ctx = cpu_context();
    Rng rng(66);
    const int64_t B = 3, Tmax = 9, H = 6, Hkv = 2, D = 4;
    const int32_t len[B] = {9, 1, 5};
    HostTensor q = random_tensor(rng, Shape{B, 1, H, D});
    HostTensor k = random_tensor(rng, Shape{B, Tmax, Hkv, D});
    HostTensor v = random_tensor(rng, Shape{B, Tmax, Hkv, D});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = (b * Tmax + len[b]) * Hkv * D; i < (b + 1) * Tmax * Hkv * D; ++i)
            k.as<float>()[i] = v.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    HostTensor lengths = ids_of(Shape{B}, {len[0], len[1], len[2]});
    for (int64_t window : {int64_t(0), int64_t(3)}) {
        HostTensor out = f32(q.shape()), lse = f32(Shape{B, H, 1});
        attention_decode(out.view(), lse.view(), q.view(), k.view(), v.view(), lengths.view(),
                         window, 0.5f, ctx);
        for (int64_t b = 0; b < B; ++b) {
            // Row b alone, its cache cut at its length.
            HostTensor qb = f32(Shape{1, 1, H, D}), kb = f32(Shape{1, len[b], Hkv, D}),
                       vb = f32(Shape{1, len[b], Hkv, D});
            std::memcpy(qb.as<float>(), q.as<float>() + b * H * D, size_t(H * D) * sizeof(float));
            std::memcpy(kb.as<float>(), k.as<float>() + b * Tmax * Hkv * D,
                        size_t(len[b] * Hkv * D) * sizeof(float));
            std::memcpy(vb.as<float>(), v.as<float>() + b * Tmax * Hkv * D,
                        size_t(len[b] * Hkv * D) * sizeof(float));
            HostTensor ob = f32(qb.shape()), lb = f32(Shape{1, H, 1});
            attention_forward(ob.view(), lb.view(), qb.view(), kb.view(), vb.view(), {}, window,
                              0.5f, len[b] - 1, ctx);
            EXPECT_EQ(std::memcmp(ob.as<float>(), out.as<float>() + b * H * D,
                                  size_t(H * D) * sizeof(float)),
                      0)
                << "row " << b << " window " << window;
            EXPECT_EQ(
                std::memcmp(lb.as<float>(), lse.as<float>() + b * H, size_t(H) * sizeof(float)), 0)
                << "row " << b << " window " << window;
        }
    }
}

TEST(AttentionDeathTest, QueriesLongerThanKeysStop) {
    const Context ctx = cpu_context();
    HostTensor q = f32(Shape{1, 4, 2, 4}), k = f32(Shape{1, 3, 2, 4});
    HostTensor out = f32(q.shape()), lse = f32(Shape{1, 2, 4});
    EXPECT_DEATH(attention_forward(out.view(), lse.view(), q.view(), k.view(), k.view(), {}, 0,
                                   1.0f, 0, ctx),
                 "attention_forward: q .* is longer than k .*Tq <= Tk");
}

TEST(AttentionDeathTest, AnOffsetPastTheKeysStops) {
    const Context ctx = cpu_context();
    HostTensor q = f32(Shape{1, 2, 2, 4}), k = f32(Shape{1, 5, 2, 4});
    HostTensor out = f32(q.shape()), lse = f32(Shape{1, 2, 2});
    EXPECT_DEATH(attention_forward(out.view(), lse.view(), q.view(), k.view(), k.view(), {}, 0,
                                   1.0f, 4, ctx),
                 "attention_forward: q_offset 4 with Tq = 2, Tk = 5.*0 <= q_offset <= Tk - Tq");
    EXPECT_DEATH(attention_forward(out.view(), lse.view(), q.view(), k.view(), k.view(), {}, 0,
                                   1.0f, -1, ctx),
                 "attention_forward: q_offset -1");
}

TEST(AttentionDeathTest, BackwardTakesTrainingShapesOnly) {
    const Context ctx = cpu_context();
    HostTensor q = f32(Shape{1, 2, 2, 4}), k = f32(Shape{1, 5, 2, 4});
    HostTensor lse = f32(Shape{1, 2, 2});
    EXPECT_DEATH(attention_backward(q.view(), k.view(), k.view(), q.view(), q.view(), k.view(),
                                    k.view(), q.view(), lse.view(), {}, 0, 1.0f, ctx),
                 "attention_backward: .*the backward takes Tq == Tk");
}

TEST(AttentionDeathTest, DecodeLengthOutsideTheCacheStops) {
    const Context ctx = cpu_context();
    HostTensor q = f32(Shape{2, 1, 2, 4}), k = f32(Shape{2, 5, 2, 4});
    HostTensor out = f32(q.shape()), lse = f32(Shape{2, 2, 1});
    HostTensor zero = ids_of(Shape{2}, {3, 0}), past = ids_of(Shape{2}, {6, 1});
    EXPECT_DEATH(attention_decode(out.view(), lse.view(), q.view(), k.view(), k.view(), zero.view(),
                                  0, 1.0f, ctx),
                 "attention_decode: lengths\\[1\\] = 0; each length is in \\[1, Tmax = 5\\]");
    EXPECT_DEATH(attention_decode(out.view(), lse.view(), q.view(), k.view(), k.view(), past.view(),
                                  0, 1.0f, ctx),
                 "attention_decode: lengths\\[0\\] = 6");
    HostTensor q2 = f32(Shape{2, 2, 2, 4}), lse2 = f32(Shape{2, 2, 2});
    HostTensor ok = ids_of(Shape{2}, {3, 3});
    EXPECT_DEATH(attention_decode(q2.view(), lse2.view(), q2.view(), k.view(), k.view(), ok.view(),
                                  0, 1.0f, ctx),
                 "attention_decode: q .*; one new token per row");
}

// The paged decode kernel's rules, checked before any launch (the inference engine at creation):
// a block's shared memory grows with the GQA group and head_dim; past the device's limit per
// block the check refuses, naming head_dim, the group, the bytes and the remedy.
TEST(AttentionDecodePagedSupports, RefusesWhatTheKernelCannotTake) {
    // cudaDevAttrMaxSharedMemoryPerBlockOptin of compute capability 9.0 (the H100): 227 KiB.
    constexpr int64_t kSm90Limit = 227 * 1024;
    EXPECT_TRUE(attention_decode_paged_supports(32, 8, 128, kSm90Limit).ok());  // Llama-3-8B
    EXPECT_TRUE(attention_decode_paged_supports(16, 16, 256, kSm90Limit).ok());
    EXPECT_TRUE(attention_decode_paged_supports(8, 1, 64, kSm90Limit).ok());

    // The group, one query head per key/value head more at a time, until the bytes pass the
    // limit: then every larger group is refused too.
    int64_t first_refused = 0;
    for (int64_t G = 1; G <= 512 && first_refused == 0; ++G)
        if (!attention_decode_paged_supports(G, 1, 128, kSm90Limit).ok()) first_refused = G;
    ASSERT_GT(first_refused, 8);
    EXPECT_FALSE(attention_decode_paged_supports(2 * first_refused, 2, 128, kSm90Limit).ok());
    const Status big = attention_decode_paged_supports(first_refused, 1, 128, kSm90Limit);
    EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
    for (const std::string& part :
         {std::string("head_dim 128"), "GQA group of " + std::to_string(first_refused),
          std::string("allows 232448"), std::string("--kv-block-size 0")})
        EXPECT_NE(big.message().find(part), std::string::npos) << big.message();
    // The same model on a device with less shared memory per block is refused sooner.
    EXPECT_FALSE(attention_decode_paged_supports(32, 8, 128, 16 * 1024).ok());
    EXPECT_FALSE(attention_decode_paged_supports(32, 8, 128, 0).ok());  // the query failed

    const Status odd = attention_decode_paged_supports(12, 4, 12, kSm90Limit);
    EXPECT_NE(odd.message().find("head_dim % 8 == 0"), std::string::npos) << odd.message();
    const Status wide = attention_decode_paged_supports(4, 4, 264, kSm90Limit);
    EXPECT_NE(wide.message().find("head_dim <= 256"), std::string::npos) << wide.message();
    EXPECT_FALSE(
        attention_decode_paged_supports(6, 4, 64, kSm90Limit).ok());  // 4 does not divide 6
}

}  // namespace
}  // namespace lathe::optest

// The rule that picks the CUDA attention backward's batch chunk (ops/cuda/attention.h), host-only
// arithmetic shared by the op and the memory plan.
TEST(Attention, BackwardChunkRowsAreTheLargestDivisorOfBWhoseShareFitsTheCap) {
    using lathe::cuda::attention_backward_chunk_rows;
    EXPECT_EQ(attention_backward_chunk_rows(8, 800, 0), 8);    // no cap
    EXPECT_EQ(attention_backward_chunk_rows(8, 800, 800), 8);  // the whole batch fits
    EXPECT_EQ(attention_backward_chunk_rows(8, 800, 799), 4);  // 7, 6, 5 do not divide 8
    EXPECT_EQ(attention_backward_chunk_rows(8, 800, 400), 4);
    EXPECT_EQ(attention_backward_chunk_rows(8, 800, 399), 2);
    EXPECT_EQ(attention_backward_chunk_rows(6, 600, 500), 3);  // 5 and 4 do not divide 6
    EXPECT_EQ(attention_backward_chunk_rows(2, 200, 150), 1);
    EXPECT_EQ(attention_backward_chunk_rows(2, 200, 99), 1);  // no chunk fits: one row
    EXPECT_EQ(attention_backward_chunk_rows(1, 200, 99), 1);
    // Llama-3.2-1B at B = 8, T = 2048: cuDNN's 2178 MiB over the 1472 MiB of its dead scratch.
    EXPECT_EQ(attention_backward_chunk_rows(8, size_t(2178) << 20, size_t(1472) << 20), 4);
}
