// KvCache on the CPU: rows follow open/close (the last row moves into a freed one, its filled
// prefix copied in every layer), a full cache refuses open(), views land where the layout says.
#include "infer/kv_cache.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

KvCacheShape small_shape() {
    KvCacheShape s;
    s.layers = 2;
    s.rows = 3;
    s.max_len = 5;
    s.kv_heads = 2;
    s.head_dim = 4;
    return s;
}

// Fills row `row`'s positions [0, len) of every layer with value(layer, kv, pos, i).
float value(int layer, int kv, int64_t pos, int64_t i, int tag) {
    return float(tag * 1000 + layer * 100 + kv * 50 + pos * 8 + i);
}

void fill(KvCache& c, int64_t row, int64_t len, int tag) {
    for (int l = 0; l < 2; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            TensorView t = kv == 0 ? c.keys(l, row, 0, len) : c.values(l, row, 0, len);
            float* p = t.as<float>();
            for (int64_t pos = 0; pos < len; ++pos)
                for (int64_t i = 0; i < 8; ++i) p[pos * 8 + i] = value(l, kv, pos, i, tag);
        }
    }
}

bool holds(const KvCache& c, int64_t row, int64_t len, int tag) {
    for (int l = 0; l < 2; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            TensorView t = kv == 0 ? c.keys(l, row, 0, len) : c.values(l, row, 0, len);
            const float* p = t.as<float>();
            for (int64_t pos = 0; pos < len; ++pos)
                for (int64_t i = 0; i < 8; ++i)
                    if (p[pos * 8 + i] != value(l, kv, pos, i, tag)) return false;
        }
    }
    return true;
}

TEST(KvCache, LayoutAndBytes) {
    Result<KvCache> c = KvCache::create(small_shape(), Context{});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->keys(1).shape(), Shape({3, 5, 2, 4}));
    EXPECT_GE(c->bytes(), size_t(2 * 2 * 3 * 5 * 2 * 4 * 4));
    // Row 1, positions [2, 4): 1 * 5 * 8 + 2 * 8 elements from the layer's start.
    TensorView v = c->values(0, 1, 2, 4);
    EXPECT_EQ(v.shape(), Shape({1, 2, 2, 4}));
    EXPECT_EQ(static_cast<float*>(v.data()) - c->values(0).as<float>(), 5 * 8 + 2 * 8);
}

TEST(KvCache, OpenUntilFullThenRefuse) {
    Result<KvCache> c = KvCache::create(small_shape(), Context{});
    ASSERT_TRUE(c.ok());
    for (int i = 0; i < 3; ++i) {
        Result<SeqId> s = c->open();
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(c->row(*s), i);
        EXPECT_EQ(c->length(*s), 0);
    }
    Result<SeqId> full = c->open();
    ASSERT_FALSE(full.ok());
    EXPECT_NE(full.status().message().find("all 3 rows"), std::string::npos)
        << full.status().to_string();
}

TEST(KvCache, CloseMovesTheLastRowIntoTheHole) {
    Result<KvCache> c = KvCache::create(small_shape(), Context{});
    ASSERT_TRUE(c.ok());
    const SeqId a = *c->open(), b = *c->open(), d = *c->open();
    fill(*c, 0, 2, 1);
    fill(*c, 1, 5, 2);
    fill(*c, 2, 3, 3);
    c->set_length(a, 2);
    c->set_length(b, 5);
    c->set_length(d, 3);
    c->close(b);  // d moves from row 2 to row 1
    EXPECT_FALSE(c->is_open(b));
    EXPECT_EQ(c->rows_in_use(), 2);
    EXPECT_EQ(c->row(a), 0);
    EXPECT_EQ(c->row(d), 1);
    EXPECT_EQ(c->seq_at(1), d);
    EXPECT_EQ(c->length(d), 3);
    EXPECT_TRUE(holds(*c, 0, 2, 1));
    EXPECT_TRUE(holds(*c, 1, 3, 3));
    // Closing the last row moves nothing; a new sequence takes the next free row.
    c->close(d);
    EXPECT_TRUE(holds(*c, 0, 2, 1));
    const SeqId e = *c->open();
    EXPECT_EQ(c->row(e), 1);
    EXPECT_EQ(c->length(e), 0);
    EXPECT_NE(e, d);
}

TEST(KvCache, RefusesNonPositiveShapes) {
    KvCacheShape s = small_shape();
    s.max_len = 0;
    Result<KvCache> c = KvCache::create(s, Context{});
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("max_len 0"), std::string::npos);
}

}  // namespace
}  // namespace lathe
