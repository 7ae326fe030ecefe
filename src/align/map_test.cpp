#include "align/map.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "io/file.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
    const auto dir = fs::temp_directory_path() / ("lathe_map_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return (dir / name).string();
}

std::string shared_tokenizer(const std::string& name) {
    return std::string(LATHE_SHARED_DIR) + "/tokenizers/" + name;
}

// A minimal BPE tokenizer.json over the given single-character vocabulary.
std::string tiny_tokenizer(const std::vector<std::string>& vocab) {
    std::string v;
    for (size_t i = 0; i < vocab.size(); ++i)
        v += (i ? "," : "") + ("\"" + vocab[i] + "\": " + std::to_string(i));
    return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,)"
           R"("pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,)"
           R"("unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,)"
           R"("byte_fallback":false,"vocab":{)" +
           v + R"(},"merges":[]}})";
}

// Brute-force top-2 in double precision with the documented tie rule.
std::vector<AlignTop2> top2_reference(const std::vector<float>& A, int64_t M,
                                      const std::vector<float>& B, int64_t N, int64_t K) {
    std::vector<AlignTop2> out(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) {
        double b1 = -INFINITY, b2 = -INFINITY;
        int j1 = -1, j2 = -1;
        for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
                s += double(A[size_t(i * K + k)]) * B[size_t(j * K + k)];
            if (s > b1) {
                b2 = b1, j2 = j1, b1 = s, j1 = int(j);
            } else if (s > b2) {
                b2 = s, j2 = int(j);
            }
        }
        out[size_t(i)] = {j1, j2, float(b1), float(b2)};
    }
    return out;
}

TEST(AlignTop2Cpu, MatchesBruteForceAcrossTiles) {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t M = 301, N = 1003, K = 24;
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (float& x : A) x = normal(rng);
    for (float& x : B) x = normal(rng);
    const std::vector<AlignTop2> want = top2_reference(A, M, B, N, K);
    for (auto [tr, tc] : {std::pair<int64_t, int64_t>{64, 100}, {1000, 5000}, {7, 1}}) {
        std::vector<AlignTop2> got(static_cast<size_t>(M));
        align_top2_cpu(got, A.data(), M, B.data(), N, K, tr, tc);
        for (int64_t i = 0; i < M; ++i) {
            const AlignTop2& w = want[size_t(i)];
            const AlignTop2& g = got[size_t(i)];
            EXPECT_NEAR(g.best_score, w.best_score, 1e-4) << i;
            EXPECT_NEAR(g.second_score, w.second_score, 1e-4) << i;
            if (w.best_score - w.second_score > 1e-3) {
                EXPECT_EQ(g.best, w.best) << i;
            }
        }
    }
}

TEST(AlignTop2Cpu, TiesGoToTheLowerColumnAcrossTiles) {
    // Every source row equal: each target's best is column 0 and second column 1, whatever the
    // tiles.
    const int64_t M = 10, N = 50, K = 3;
    std::vector<float> A(size_t(M * K), 0.5f), B(size_t(N * K), 1.0f);
    std::vector<AlignTop2> got(static_cast<size_t>(M));
    align_top2_cpu(got, A.data(), M, B.data(), N, K, 3, 7);
    for (const AlignTop2& t : got) {
        EXPECT_EQ(t.best, 0);
        EXPECT_EQ(t.second, 1);
    }
}

TEST(AlignTokenizer, SpellingsAndBytes) {
    auto gpt2 = align_load_tokenizer(shared_tokenizer("gpt2.json"));
    ASSERT_TRUE(gpt2.ok()) << gpt2.status().to_string();
    EXPECT_EQ(gpt2->spelling, TokenSpelling::kByteLevel);
    auto llama = align_load_tokenizer(shared_tokenizer("llama2.json"));
    ASSERT_TRUE(llama.ok()) << llama.status().to_string();
    EXPECT_EQ(llama->spelling, TokenSpelling::kSentencePiece);
    ASSERT_TRUE(llama->unk_id.has_value());
    EXPECT_EQ(*llama->unk_id, 0);

    const int32_t g_the = *gpt2->tokenizer.token_to_id("\xC4\xA0the");  // "Ġthe"
    EXPECT_EQ(align_token_bytes(*gpt2, g_the), std::optional<std::string>(" the"));
    const int32_t g_nl = *gpt2->tokenizer.token_to_id("\xC4\x8A");  // "Ċ" = "\n"
    EXPECT_EQ(align_token_bytes(*gpt2, g_nl), std::optional<std::string>("\n"));
    const int32_t l_the = *llama->tokenizer.token_to_id("\xE2\x96\x81the");  // "▁the"
    EXPECT_EQ(align_token_bytes(*llama, l_the), std::optional<std::string>(" the"));
    const int32_t l_nl = *llama->tokenizer.token_to_id("<0x0A>");
    EXPECT_EQ(align_token_bytes(*llama, l_nl), std::optional<std::string>("\n"));

    // FVT pieces: llama's "▁the" is gpt2's "Ġthe"; a raw byte token falls back to the byte entry.
    EXPECT_EQ(align_fvt_pieces(*llama, l_the, *gpt2), std::vector<int32_t>{g_the});
    const int32_t l_e9 = *llama->tokenizer.token_to_id("<0xE9>");  // half of a UTF-8 character
    const int32_t g_e9 =
        *gpt2->tokenizer.token_to_id("\xC3\xA9");  // byte 0xE9 in GPT-2's table: "é"
    EXPECT_EQ(align_fvt_pieces(*llama, l_e9, *gpt2), std::vector<int32_t>{g_e9});
}

// Vectors for a subset of ids: the target side is the source side rotated (an orthogonal map), so
// relative representations agree exactly and every seen non-gold target token must align to the
// source token whose vector it copies.
TEST(AlignMap, RecoversAPlantedAlignmentUnderRotation) {
    auto src = align_load_tokenizer(shared_tokenizer("gpt2.json"));
    auto tgt = align_load_tokenizer(shared_tokenizer("llama2.json"));
    ASSERT_TRUE(src.ok() && tgt.ok());
    const int64_t D = 24;
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // A random orthogonal D x D matrix: Gram-Schmidt of a Gaussian matrix.
    std::vector<double> Q(size_t(D * D));
    for (double& q : Q) q = normal(rng);
    for (int64_t i = 0; i < D; ++i) {
        for (int64_t j = 0; j < i; ++j) {
            double dot = 0;
            for (int64_t k = 0; k < D; ++k) dot += Q[size_t(i * D + k)] * Q[size_t(j * D + k)];
            for (int64_t k = 0; k < D; ++k) Q[size_t(i * D + k)] -= dot * Q[size_t(j * D + k)];
        }
        double n = 0;
        for (int64_t k = 0; k < D; ++k) n += Q[size_t(i * D + k)] * Q[size_t(i * D + k)];
        for (int64_t k = 0; k < D; ++k) Q[size_t(i * D + k)] /= std::sqrt(n);
    }
    TokenVectors sv, tv;
    sv.dim = tv.dim = D;
    const int32_t Ns = 3000;
    for (int32_t s = 0; s < Ns; ++s) {
        sv.ids.push_back(s);
        for (int64_t d = 0; d < D; ++d) sv.values.push_back(normal(rng));
    }
    const auto add_target = [&](int32_t t, int32_t s) {
        tv.ids.push_back(t);
        for (int64_t i = 0; i < D; ++i) {
            double acc = 0;
            for (int64_t k = 0; k < D; ++k)
                acc += Q[size_t(i * D + k)] * sv.values[size_t(s * D + k)];
            tv.values.push_back(float(acc));
        }
    };
    AlignMapRequest req;
    req.match = AlignMatch::kByteLevelAware;
    req.pivots = 100;
    req.device = AlignDevice::kCpu;
    const std::vector<int32_t> gold = align_gold_map(*src, *tgt, req.match);
    ASSERT_EQ(int64_t(gold.size()), int64_t(tgt->tokenizer.vocab_size()));
    std::vector<int32_t> planted(gold.size(), -1);
    std::uniform_int_distribution<int32_t> pick(0, Ns - 1);
    int n_gold = 0, n_planted = 0;
    int32_t unseen = -1;
    for (int32_t t = 0; t < int32_t(gold.size()); ++t) {
        if (gold[size_t(t)] >= 0) {
            if (gold[size_t(t)] < Ns && n_gold < 400) {
                add_target(t, gold[size_t(t)]);
                ++n_gold;
            }
        } else if (n_planted < 300) {
            planted[size_t(t)] = pick(rng);
            add_target(t, planted[size_t(t)]);
            ++n_planted;
        } else if (unseen < 0) {
            unseen = t;
        }
    }
    ASSERT_EQ(n_gold, 400);
    ASSERT_EQ(n_planted, 300);
    ASSERT_GE(unseen, 0);
    // The first planted id is also a mined term.
    int32_t term = -1;
    for (int32_t t = 0; t < int32_t(planted.size()) && term < 0; ++t)
        if (planted[size_t(t)] >= 0) term = t;
    const std::vector<int32_t> terms = {term};
    auto r = align_map_compute(*src, *tgt, sv, tv, terms, req);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->pivots, 100);
    EXPECT_EQ(r->terms, 1);
    EXPECT_EQ(r->aligned, 299);
    for (int32_t t = 0; t < int32_t(gold.size()); ++t) {
        const AlignEntry& e = r->entries[size_t(t)];
        if (gold[size_t(t)] >= 0) {
            EXPECT_EQ(e.decision, AlignDecision::kGold) << t;
            EXPECT_EQ(e.source_id, gold[size_t(t)]) << t;
        } else if (t == term) {
            EXPECT_EQ(e.decision, AlignDecision::kTerm);
        } else if (planted[size_t(t)] >= 0) {
            EXPECT_EQ(e.decision, AlignDecision::kAligned) << t;
            EXPECT_EQ(e.source_id, planted[size_t(t)]) << t;
        }
    }
    EXPECT_EQ(r->entries[size_t(unseen)].decision, AlignDecision::kFvt);

    // Cosine similarity finds the same partners (the rel vectors are identical up to rounding).
    req.similarity = AlignSimilarity::kCosine;
    auto rc = align_map_compute(*src, *tgt, sv, tv, terms, req);
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(rc->aligned, 299);

    // A threshold above every similarity sends every aligned token to FVT.
    req.threshold = 2.0;
    auto rt = align_map_compute(*src, *tgt, sv, tv, terms, req);
    ASSERT_TRUE(rt.ok());
    EXPECT_EQ(rt->aligned, 0);
    EXPECT_EQ(rt->below_threshold, 299);
}

TEST(AlignMap, ExactMatchIsTokAlignsStringMatch) {
    auto src = align_load_tokenizer(shared_tokenizer("gpt2.json"));
    auto tgt = align_load_tokenizer(shared_tokenizer("gpt-neox-20b.json"));
    ASSERT_TRUE(src.ok() && tgt.ok());
    const std::vector<int32_t> gold = align_gold_map(*src, *tgt, AlignMatch::kExact);
    int64_t n = 0;
    for (int32_t t = 0; t < int32_t(gold.size()); ++t) {
        if (gold[size_t(t)] < 0) continue;
        ++n;
        EXPECT_EQ(src->tokenizer.id_to_token(gold[size_t(t)]), tgt->tokenizer.id_to_token(t));
    }
    EXPECT_GT(n, 35000);  // the two byte-level vocabularies share most entries (36938 of 50k)
    // SentencePiece vs byte level: byte-level-aware matching adds the word-initial entries.
    auto llama = align_load_tokenizer(shared_tokenizer("llama2.json"));
    ASSERT_TRUE(llama.ok());
    int64_t exact = 0, aware = 0;
    for (int32_t g : align_gold_map(*src, *llama, AlignMatch::kExact)) exact += g >= 0;
    for (int32_t g : align_gold_map(*src, *llama, AlignMatch::kByteLevelAware)) aware += g >= 0;
    // (8020 exact: pieces without a leading space; 21443 with ▁word = Ġword and <0xNN> = bytes.)
    EXPECT_GT(aware, exact + 10000);
}

TEST(AlignMap, NoSharedTokensIsAClearError) {
    const std::string a = temp_path("a.json"), b = temp_path("b.json");
    ASSERT_TRUE(file_write_atomic(a, tiny_tokenizer({"a", "b"})).ok());
    ASSERT_TRUE(file_write_atomic(b, tiny_tokenizer({"c", "d"})).ok());
    auto src = align_load_tokenizer(a);
    auto tgt = align_load_tokenizer(b);
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    ASSERT_TRUE(tgt.ok());
    TokenVectors v;
    v.dim = 2;
    v.ids = {0, 1};
    v.values = {1, 0, 0, 1};
    AlignMapRequest req;
    req.device = AlignDevice::kCpu;
    auto r = align_map_compute(*src, *tgt, v, v, {}, req);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().to_string().find("share no token"), std::string::npos)
        << r.status().to_string();

    // Shared tokens, but none has a vector on both sides: no pivots.
    const std::string c = temp_path("c.json");
    ASSERT_TRUE(file_write_atomic(c, tiny_tokenizer({"a", "x"})).ok());
    auto tgt2 = align_load_tokenizer(c);
    ASSERT_TRUE(tgt2.ok());
    TokenVectors only1;
    only1.dim = 2;
    only1.ids = {1};
    only1.values = {1, 0};
    auto r2 = align_map_compute(*src, *tgt2, v, only1, {}, req);
    ASSERT_FALSE(r2.ok());
    EXPECT_NE(r2.status().to_string().find("no pivots"), std::string::npos)
        << r2.status().to_string();
}

TEST(AlignMap, VectorsOfAnotherTokenizerAreRefused) {
    const std::string p = temp_path("v.txt");
    ASSERT_TRUE(file_write_atomic(p, "0 0.5 0.25\n7 1 2\n").ok());
    auto v = align_load_vectors(p, 5);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().to_string().find("token id 7"), std::string::npos)
        << v.status().to_string();
    EXPECT_TRUE(align_load_vectors(p, 8).ok());
}

TEST(AlignMap, MapAndReportFilesRoundTrip) {
    const std::string a = temp_path("s.json"), b = temp_path("t.json");
    ASSERT_TRUE(file_write_atomic(a, tiny_tokenizer({"a", "b", "c", "d"})).ok());
    ASSERT_TRUE(file_write_atomic(b, tiny_tokenizer({"a", "b", "c", "e", "f"})).ok());
    const std::string sv = temp_path("sv.txt"), tv = temp_path("tv.txt");
    ASSERT_TRUE(file_write_atomic(sv, "0 1 0 0\n1 0 1 0\n2 0 0 1\n3 1 1 0\n<unk> 0 0 0\n").ok());
    ASSERT_TRUE(file_write_atomic(tv, "0 1 0 0\n1 0 1 0\n2 0 0 1\n3 1 1 0.1\n").ok());
    AlignMapRequest req;
    req.source_tokenizer = a;
    req.target_tokenizer = b;
    req.source_vectors = sv;
    req.target_vectors = tv;
    req.output = temp_path("map.json");
    req.device = AlignDevice::kCpu;
    auto r = align_map_run(req);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->report, temp_path("map.report.tsv"));
    auto map = align_read_map(req.output);
    ASSERT_TRUE(map.ok()) << map.status().to_string();
    EXPECT_EQ(*map, (std::vector<int32_t>{0, 1, 2, 3, map->at(4)}));  // "e" aligns to "d"
    auto report = align_read_report(r->report);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    ASSERT_EQ(report->size(), 5u);
    EXPECT_EQ((*report)[0], AlignDecision::kGold);
    EXPECT_EQ((*report)[3], AlignDecision::kAligned);
    EXPECT_EQ((*report)[4], AlignDecision::kFvt);  // "f" has no vector
    // A second run with the same inputs is skipped (stage cache); --force recomputes.
    auto again = align_map_run(req);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->skipped);
    req.force = true;
    auto forced = align_map_run(req);
    ASSERT_TRUE(forced.ok());
    EXPECT_FALSE(forced->skipped);

    // Malformed maps are named.
    const std::string bad = temp_path("bad.json");
    ASSERT_TRUE(file_write_atomic(bad, R"({"0": 1, "2": 3})").ok());
    auto m = align_read_map(bad);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().to_string().find("target id 2"), std::string::npos)
        << m.status().to_string();
}

}  // namespace
}  // namespace lathe
