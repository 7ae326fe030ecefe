// The BPE memo (BpeCache): what it returns must be what was stored for that exact piece, whatever
// collisions, overwrites and arena restarts happen; a miss is always allowed.

#include "tokenizer/bpe_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lathe {
namespace {

std::vector<int32_t> ids_for(const std::string& piece) {
    // A deterministic, piece-specific id list of 1..7 ids.
    std::vector<int32_t> ids;
    const size_t n = 1 + piece.size() % 7;
    for (size_t i = 0; i < n; ++i)
        ids.push_back(static_cast<int32_t>(piece.size() * 131 + i * 7 + piece[0]));
    return ids;
}

TEST(BpeCache, ShortPiecesNeverReturnAnotherPiecesIds) {
    BpeCache cache(64);  // tiny: forces overwrites
    std::vector<std::string> pieces;
    for (int i = 0; i < 2000; ++i) pieces.push_back("w" + std::to_string(i * 7919));
    pieces.push_back(std::string(BpeCache::kMaxKeyBytes, 'x'));  // longest short key
    for (const std::string& p : pieces) {
        BpeCache::Key key;
        BpeCache::make_key(p, key);
        const std::vector<int32_t> ids = ids_for(p);
        cache.insert(key, ids.data(), ids.size());
    }
    size_t hits = 0;
    for (const std::string& p : pieces) {
        BpeCache::Key key;
        BpeCache::make_key(p, key);
        std::vector<int32_t> out = {-1};
        if (cache.lookup(key, out)) {
            ++hits;
            std::vector<int32_t> expected = {-1};
            const std::vector<int32_t> ids = ids_for(p);
            expected.insert(expected.end(), ids.begin(), ids.end());
            EXPECT_EQ(out, expected) << p;
        } else {
            EXPECT_EQ(out, std::vector<int32_t>{-1});
        }
    }
    EXPECT_GT(hits, 0u);
    EXPECT_LE(hits, 64u);
}

TEST(BpeCache, LongPiecesSurviveArenaRestarts) {
    BpeCache cache;
    std::vector<std::string> pieces;
    // Enough long pieces to overflow the long table's arena several times.
    for (int i = 0; i < 60000; ++i) {
        pieces.push_back(std::string(40 + i % 200, static_cast<char>('a' + i % 26)) +
                         std::to_string(i));
    }
    for (const std::string& p : pieces) {
        const std::vector<int32_t> ids = ids_for(p);
        cache.insert_long(p, hash_bytes(p.data(), p.size()), ids.data(), ids.size());
    }
    size_t hits = 0;
    for (const std::string& p : pieces) {
        std::vector<int32_t> out;
        if (cache.lookup_long(p, hash_bytes(p.data(), p.size()), out)) {
            ++hits;
            EXPECT_EQ(out, ids_for(p)) << p;
        }
    }
    EXPECT_GT(hits, 0u);
    // The most recent piece is always there.
    std::vector<int32_t> out;
    ASSERT_TRUE(cache.lookup_long(pieces.back(),
                                  hash_bytes(pieces.back().data(), pieces.back().size()), out));
    // Longer than the long table takes: never stored.
    const std::string huge(BpeCache::kMaxLongKeyBytes + 1, 'z');
    const std::vector<int32_t> ids = {1, 2};
    cache.insert_long(huge, hash_bytes(huge.data(), huge.size()), ids.data(), ids.size());
    out.clear();
    EXPECT_FALSE(cache.lookup_long(huge, hash_bytes(huge.data(), huge.size()), out));
}

}  // namespace
}  // namespace lathe
