#include "core/numpy_random.h"

#include <gtest/gtest.h>

#include <numeric>

// Expected values come from numpy 2.4.6 (CPython 3.11), e.g.
//   rs = np.random.RandomState(seed); rs.randint(0, 2**32, size=6, dtype=np.uint32)
// (a uint32 randint over the full range returns the raw MT19937 draws). Long outputs are compared
// through fnv1a64 over their int64 values, computed the same way in Python:
//   acc = 1469598103934665603; for v in a: acc = ((acc ^ (v & M)) * 1099511628211) & M
// (M = 2**64 - 1; uint64 values viewed as int64).

namespace lathe {
namespace {

uint64_t fnv1a64(std::span<const int64_t> values) {
    uint64_t acc = 1469598103934665603ull;
    for (int64_t v : values) acc = (acc ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return acc;
}

std::vector<uint32_t> raw_draws(NumpyRandomState& rs, int n) {
    std::vector<uint32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(rs.next_uint32());
    return out;
}

TEST(NumpyRandomState, IntegerSeedRawDraws) {
    struct Case {
        uint32_t seed;
        std::vector<uint32_t> draws;
    };
    const std::vector<Case> cases = {
        {0u, {2357136044u, 2546248239u, 3071714933u, 3626093760u, 2588848963u, 3684848379u}},
        {1u, {1791095845u, 4282876139u, 3093770124u, 4005303368u, 491263u, 550290313u}},
        {42u, {1608637542u, 3421126067u, 4083286876u, 787846414u, 3143890026u, 3348747335u}},
        {1234u, {822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u, 2629000564u}},
        {4294967295u, {419326371u, 479346978u, 3918654476u, 2416749639u, 3388880820u, 2260532800u}},
    };
    for (const auto& c : cases) {
        NumpyRandomState rs(c.seed);
        EXPECT_EQ(raw_draws(rs, 6), c.draws) << "seed " << c.seed;
    }
}

TEST(NumpyRandomState, StateAfterSeedingMatchesGetState) {
    // np.random.RandomState(seed).get_state(): key[:3], key[623], pos
    struct Case {
        uint32_t seed;
        uint32_t k0, k1, k2, k623;
    };
    for (const auto& c : {Case{0u, 0u, 1u, 1812433255u, 1796872496u},
                          Case{5489u, 5489u, 1301868182u, 2938499221u, 79981964u},
                          Case{4294967295u, 4294967295u, 1340201581u, 3941791902u, 3413567280u}}) {
        NumpyRandomState rs(c.seed);
        EXPECT_EQ(rs.key()[0], c.k0);
        EXPECT_EQ(rs.key()[1], c.k1);
        EXPECT_EQ(rs.key()[2], c.k2);
        EXPECT_EQ(rs.key()[623], c.k623);
        EXPECT_EQ(rs.pos(), 624);
    }
}

TEST(NumpyRandomState, ArraySeedUsesInitByArray) {
    // np.random.RandomState(np.array(key, dtype=np.uint32)), then 4 raw draws.
    {
        const std::vector<uint32_t> key = {0x123, 0x234, 0x345, 0x456};
        auto rs = NumpyRandomState::from_array(key);
        ASSERT_TRUE(rs.ok());
        EXPECT_EQ(raw_draws(*rs, 4),
                  (std::vector<uint32_t>{1067595299u, 955945823u, 477289528u, 4107218783u}));
    }
    {  // numpy squeezes a one-element array to the integer seed 7
        const std::vector<uint32_t> key = {7};
        auto rs = NumpyRandomState::from_array(key);
        ASSERT_TRUE(rs.ok());
        EXPECT_EQ(raw_draws(*rs, 4),
                  (std::vector<uint32_t>{327741615u, 976413892u, 3349725721u, 1369975286u}));
        NumpyRandomState seven(7);
        EXPECT_EQ(raw_draws(seven, 1), (std::vector<uint32_t>{327741615u}));
    }
    {  // a key longer than the state: the first loop runs key_length times
        std::vector<uint32_t> key(700);
        std::iota(key.begin(), key.end(), 0u);
        auto rs = NumpyRandomState::from_array(key);
        ASSERT_TRUE(rs.ok());
        EXPECT_EQ(raw_draws(*rs, 4),
                  (std::vector<uint32_t>{3727595200u, 1914792892u, 3929396303u, 3603564374u}));
    }
    EXPECT_EQ(NumpyRandomState::from_array({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(NumpyRandomState, RandomSample) {
    NumpyRandomState a(0);
    EXPECT_EQ(a.random_sample(), 0.5488135039273248);
    EXPECT_EQ(a.random_sample(), 0.7151893663724195);
    EXPECT_EQ(a.random_sample(), 0.6027633760716439);
    NumpyRandomState b(7);
    EXPECT_EQ(b.random_sample(), 0.07630828937395717);
    EXPECT_EQ(b.random_sample(), 0.7799187922401146);
    EXPECT_EQ(b.random_sample(), 0.4384092314408935);
}

TEST(NumpyRandomState, ShuffleMatchesNumpyForManySeedsAndSizes) {
    // a = np.arange(n, dtype=np.int64); np.random.RandomState(seed).shuffle(a); fnv1a64(a)
    struct Case {
        uint32_t seed;
        int64_t n;
        uint64_t hash;
    };
    const std::vector<Case> cases = {
        {0u, 0, 1469598103934665603ull},
        {0u, 1, 4953163356653287321ull},
        {0u, 2, 11125488673309971922ull},
        {0u, 3, 10947662795537084930ull},
        {0u, 10, 14488555366955391200ull},
        {0u, 100, 3661800980449426873ull},
        {0u, 1000, 14052186008779352451ull},
        {0u, 100000, 3520942254386305981ull},
        {1u, 0, 1469598103934665603ull},
        {1u, 1, 4953163356653287321ull},
        {1u, 2, 11126444148914698056ull},
        {1u, 3, 12198861948134627104ull},
        {1u, 10, 4774656749128309426ull},
        {1u, 100, 18346636812854634247ull},
        {1u, 1000, 10659100152431138761ull},
        {1u, 100000, 3667674528120491903ull},
        {2u, 0, 1469598103934665603ull},
        {2u, 1, 4953163356653287321ull},
        {2u, 2, 11125488673309971922ull},
        {2u, 3, 10947662795537084930ull},
        {2u, 10, 5657823409398499596ull},
        {2u, 100, 3494897349489980507ull},
        {2u, 1000, 11579552457388971149ull},
        {2u, 100000, 17610961823354611091ull},
        {3u, 0, 1469598103934665603ull},
        {3u, 1, 4953163356653287321ull},
        {3u, 2, 11125488673309971922ull},
        {3u, 3, 11572782435010236528ull},
        {3u, 10, 599059207848568238ull},
        {3u, 100, 127743841426207639ull},
        {3u, 1000, 280719114499286403ull},
        {3u, 100000, 8802626437638033501ull},
        {17u, 0, 1469598103934665603ull},
        {17u, 1, 4953163356653287321ull},
        {17u, 2, 11126444148914698056ull},
        {17u, 3, 12198861948134627104ull},
        {17u, 10, 9968377036851465190ull},
        {17u, 100, 6745787028058365677ull},
        {17u, 1000, 1268914126461370241ull},
        {17u, 100000, 11120749695905838995ull},
        {1234u, 0, 1469598103934665603ull},
        {1234u, 1, 4953163356653287321ull},
        {1234u, 2, 11126444148914698056ull},
        {1234u, 3, 12195995521320448702ull},
        {1234u, 10, 3798819083701321580ull},
        {1234u, 100, 7213949093233063291ull},
        {1234u, 1000, 515541970762504215ull},
        {1234u, 100000, 13626631488434724521ull},
        {99999u, 0, 1469598103934665603ull},
        {99999u, 1, 4953163356653287321ull},
        {99999u, 2, 11126444148914698056ull},
        {99999u, 3, 11570871483800784260ull},
        {99999u, 10, 15710556803159757760ull},
        {99999u, 100, 17104390277736502543ull},
        {99999u, 1000, 4550854376623609283ull},
        {99999u, 100000, 16320568205852720263ull},
        {4294967295u, 0, 1469598103934665603ull},
        {4294967295u, 1, 4953163356653287321ull},
        {4294967295u, 2, 11126444148914698056ull},
        {4294967295u, 3, 11572782435010236528ull},
        {4294967295u, 10, 648598412921005300ull},
        {4294967295u, 100, 532655288882281831ull},
        {4294967295u, 1000, 2865850207958205395ull},
        {4294967295u, 100000, 14627009161347920697ull},
    };
    for (const auto& c : cases) {
        std::vector<int64_t> a(static_cast<size_t>(c.n));
        std::iota(a.begin(), a.end(), int64_t{0});
        NumpyRandomState rs(c.seed);
        rs.shuffle(std::span<int64_t>(a));
        EXPECT_EQ(fnv1a64(a), c.hash) << "seed " << c.seed << " n " << c.n;
    }
}

TEST(NumpyRandomState, ShuffleIsElementTypeIndependent) {
    // a = np.arange(10, dtype=np.int32); np.random.RandomState(1234).shuffle(a)
    std::vector<int32_t> a(10);
    std::iota(a.begin(), a.end(), 0);
    NumpyRandomState rs(1234);
    rs.shuffle(std::span<int32_t>(a));
    EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
    // np.random.RandomState(5).permutation(8)
    NumpyRandomState p(5);
    EXPECT_EQ(p.permutation(8), (std::vector<int64_t>{7, 2, 4, 1, 0, 5, 6, 3}));
}

TEST(NumpyRandomState, RandintMatchesNumpyPerDtype) {
    // rs = np.random.RandomState(2024); fnv1a64(rs.randint(lo, hi, size=50, dtype=dt)), then three
    // scalar draws [int(rs.randint(lo, hi, dtype=dt)) for _ in range(3)] from the same stream.
    struct Case {
        NumpyIntDtype dtype;
        int64_t low, high;
        uint64_t hash;
        std::vector<int64_t> scalars;
    };
    const std::vector<Case> cases = {
        {NumpyIntDtype::kInt64, 0LL, 2LL, 17826676089684279904ull, {1, 0, 0}},
        {NumpyIntDtype::kInt64, 0LL, 10LL, 2768889087270167938ull, {0, 8, 1}},
        {NumpyIntDtype::kInt64, -5LL, 100LL, 4739153912156003946ull, {48, 89, 8}},
        {NumpyIntDtype::kInt64, 0LL, 255LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kInt64, 0LL, 256LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kInt64, 0LL, 65536LL, 14787239308821675050ull, {19001, 10838, 46390}},
        {NumpyIntDtype::kInt64,
         3LL,
         2147483647LL,
         888501779513538690ull,
         {1152141884, 590555737, 1279571257}},
        {NumpyIntDtype::kInt64,
         0LL,
         8589934597LL,
         6378948283214405437ull,
         {796858378, 1251322265, 4535799744}},
        {NumpyIntDtype::kInt64,
         -1099511627776LL,
         1099511627776LL,
         16521477599110256464ull,
         {778035474439, -330958998901, -332545982757}},
        {NumpyIntDtype::kInt64,
         0LL,
         4611686018427387904LL,
         9079606869345589072ull,
         {304148784022499335, 968397833739596427, 514763523788046043}},
        {NumpyIntDtype::kInt64, -128LL, 128LL, 14736699179500572202ull, {-71, -42, -74}},
        {NumpyIntDtype::kInt64,
         0LL,
         4294967296LL,
         200602673875663914ull,
         {3299625529, 2738039382, 3427054902}},
        {NumpyIntDtype::kInt32, 0LL, 2LL, 17826676089684279904ull, {1, 0, 0}},
        {NumpyIntDtype::kInt32, 0LL, 10LL, 2768889087270167938ull, {0, 8, 1}},
        {NumpyIntDtype::kInt32, -5LL, 100LL, 4739153912156003946ull, {48, 89, 8}},
        {NumpyIntDtype::kInt32, 0LL, 255LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kInt32, 0LL, 256LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kInt32, 0LL, 65536LL, 14787239308821675050ull, {19001, 10838, 46390}},
        {NumpyIntDtype::kInt32,
         3LL,
         2147483647LL,
         888501779513538690ull,
         {1152141884, 590555737, 1279571257}},
        {NumpyIntDtype::kInt32, -128LL, 128LL, 14736699179500572202ull, {-71, -42, -74}},
        {NumpyIntDtype::kInt16, 0LL, 2LL, 2968697509847444950ull, {1, 1, 0}},
        {NumpyIntDtype::kInt16, 0LL, 10LL, 11333045311658084357ull, {5, 3, 3}},
        {NumpyIntDtype::kInt16, -5LL, 100LL, 3196442409245785379ull, {12, 50, 68}},
        {NumpyIntDtype::kInt16, 0LL, 255LL, 12281023816702869630ull, {111, 11, 28}},
        {NumpyIntDtype::kInt16, 0LL, 256LL, 12281023816702869630ull, {111, 11, 28}},
        {NumpyIntDtype::kInt16, -128LL, 128LL, 8070625750495524222ull, {-17, -117, -100}},
        {NumpyIntDtype::kInt8, 0LL, 2LL, 13893304336014237810ull, {0, 0, 0}},
        {NumpyIntDtype::kInt8, 0LL, 10LL, 2590774434582229309ull, {8, 1, 9}},
        {NumpyIntDtype::kInt8, -5LL, 100LL, 11087408824087075273ull, {91, 32, 64}},
        {NumpyIntDtype::kInt8, -128LL, 128LL, 11710510629694763668ull, {-54, -62, 96}},
        {NumpyIntDtype::kUint64, 0LL, 2LL, 17826676089684279904ull, {1, 0, 0}},
        {NumpyIntDtype::kUint64, 0LL, 10LL, 2768889087270167938ull, {0, 8, 1}},
        {NumpyIntDtype::kUint64, 0LL, 255LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kUint64, 0LL, 256LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kUint64, 0LL, 65536LL, 14787239308821675050ull, {19001, 10838, 46390}},
        {NumpyIntDtype::kUint64,
         3LL,
         2147483647LL,
         888501779513538690ull,
         {1152141884, 590555737, 1279571257}},
        {NumpyIntDtype::kUint64,
         0LL,
         8589934597LL,
         6378948283214405437ull,
         {796858378, 1251322265, 4535799744}},
        {NumpyIntDtype::kUint64,
         0LL,
         4611686018427387904LL,
         9079606869345589072ull,
         {304148784022499335, 968397833739596427, 514763523788046043}},
        {NumpyIntDtype::kUint64,
         0LL,
         4294967296LL,
         200602673875663914ull,
         {3299625529, 2738039382, 3427054902}},
        {NumpyIntDtype::kUint32, 0LL, 2LL, 17826676089684279904ull, {1, 0, 0}},
        {NumpyIntDtype::kUint32, 0LL, 10LL, 2768889087270167938ull, {0, 8, 1}},
        {NumpyIntDtype::kUint32, 0LL, 255LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kUint32, 0LL, 256LL, 16534599517472388138ull, {57, 86, 54}},
        {NumpyIntDtype::kUint32, 0LL, 65536LL, 14787239308821675050ull, {19001, 10838, 46390}},
        {NumpyIntDtype::kUint32,
         3LL,
         2147483647LL,
         888501779513538690ull,
         {1152141884, 590555737, 1279571257}},
        {NumpyIntDtype::kUint32,
         0LL,
         4294967296LL,
         200602673875663914ull,
         {3299625529, 2738039382, 3427054902}},
        {NumpyIntDtype::kUint16, 0LL, 2LL, 2968697509847444950ull, {1, 1, 0}},
        {NumpyIntDtype::kUint16, 0LL, 10LL, 11333045311658084357ull, {5, 3, 3}},
        {NumpyIntDtype::kUint16, 0LL, 255LL, 12281023816702869630ull, {111, 11, 28}},
        {NumpyIntDtype::kUint16, 0LL, 256LL, 12281023816702869630ull, {111, 11, 28}},
        {NumpyIntDtype::kUint16, 0LL, 65536LL, 17589601815926665086ull, {51567, 3595, 32540}},
        {NumpyIntDtype::kUint8, 0LL, 2LL, 13893304336014237810ull, {0, 0, 0}},
        {NumpyIntDtype::kUint8, 0LL, 10LL, 2590774434582229309ull, {8, 1, 9}},
        {NumpyIntDtype::kUint8, 0LL, 255LL, 15844557311381371284ull, {74, 66, 224}},
        {NumpyIntDtype::kUint8, 0LL, 256LL, 15844557311381371284ull, {74, 66, 224}},
        {NumpyIntDtype::kBool, 0LL, 2LL, 14427859447698415158ull, {0, 0, 1}},
    };
    for (const auto& c : cases) {
        NumpyRandomState rs(2024);
        auto values = rs.randint(c.low, c.high, 50, c.dtype);
        ASSERT_TRUE(values.ok()) << values.status().to_string();
        for (int64_t v : *values) {
            ASSERT_GE(v, c.low);
            ASSERT_LT(v, c.high);
        }
        EXPECT_EQ(fnv1a64(*values), c.hash)
            << "dtype " << int(c.dtype) << " [" << c.low << ", " << c.high << ")";
        std::vector<int64_t> scalars;
        for (int i = 0; i < 3; ++i) {
            auto v = rs.randint_scalar(c.low, c.high, c.dtype);
            ASSERT_TRUE(v.ok());
            scalars.push_back(*v);
        }
        EXPECT_EQ(scalars, c.scalars)
            << "dtype " << int(c.dtype) << " [" << c.low << ", " << c.high << ")";
    }
}

TEST(NumpyRandomState, RandintRejectsBadBounds) {
    NumpyRandomState rs(0);
    EXPECT_EQ(rs.randint(5, 5, 3).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rs.randint(0, 300, 3, NumpyIntDtype::kUint8).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(rs.randint(-1, 3, 3, NumpyIntDtype::kUint32).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(rs.randint(0, 256, 3, NumpyIntDtype::kUint8).ok());
    EXPECT_TRUE(rs.randint(5, 5, 0).ok());  // numpy returns an empty array before checking
}

TEST(NumpyRandomState, SavedStateContinuesTheStream) {
    NumpyRandomState a(99);
    for (int i = 0; i < 1000; ++i) a.next_uint32();
    NumpyRandomState b(1);
    ASSERT_TRUE(b.set_state(a.key(), a.pos()).ok());
    EXPECT_EQ(raw_draws(a, 700), raw_draws(b, 700));
    EXPECT_FALSE(b.set_state(a.key(), 625).ok());
    std::array<uint32_t, 624> zeros{};
    EXPECT_FALSE(b.set_state(zeros, 0).ok());
}

}  // namespace
}  // namespace lathe
