#include "ops/lru_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace lathe {
namespace {

TEST(LruCache, KeepsAtMostCapacityEvictingTheLeastRecentlyUsed) {
    LruCache<int, std::string> cache(3);
    cache.insert(1, "one");
    cache.insert(2, "two");
    cache.insert(3, "three");
    EXPECT_TRUE(cache.full());
    ASSERT_NE(cache.find(1), nullptr);  // 1 becomes the most recent; 2 is now the oldest
    cache.insert(4, "four");
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.evictions(), 1u);
    EXPECT_FALSE(cache.contains(2));
    EXPECT_EQ(*cache.find(1), "one");
    EXPECT_EQ(*cache.find(3), "three");
    EXPECT_EQ(*cache.find(4), "four");
    // Order now (newest first): 4, 3, 1. contains() does not count as a use.
    EXPECT_TRUE(cache.contains(1));
    cache.insert(5, "five");
    EXPECT_FALSE(cache.contains(1));
    EXPECT_EQ(cache.evictions(), 2u);
}

TEST(LruCache, ManyKeysKeepTheCountAtTheBound) {
    LruCache<int, std::unique_ptr<int>> cache(8);
    for (int k = 0; k < 1000; ++k) {
        cache.insert(k, std::make_unique<int>(k));
        EXPECT_LE(cache.size(), 8u);
    }
    EXPECT_EQ(cache.size(), 8u);
    EXPECT_EQ(cache.evictions(), 992u);
    for (int k = 992; k < 1000; ++k) ASSERT_NE(cache.find(k), nullptr) << k;
    EXPECT_EQ(cache.find(991), nullptr);
}

TEST(LruCache, ReplacingAKeyEvictsNothingAndRefreshesIt) {
    LruCache<int, int> cache(2);
    cache.insert(1, 10);
    cache.insert(2, 20);
    cache.insert(1, 11);  // replace: 1 is now the newest
    EXPECT_EQ(cache.evictions(), 0u);
    cache.insert(3, 30);  // evicts 2
    EXPECT_EQ(*cache.find(1), 11);
    EXPECT_FALSE(cache.contains(2));
}

TEST(LruCache, ReferencesStayValidWhileTheirEntryStays) {
    LruCache<int, int> cache(3);
    int& first = cache.insert(1, 100);
    cache.insert(2, 200);
    cache.find(1);
    cache.insert(3, 300);
    cache.insert(4, 400);  // evicts 2, not 1
    EXPECT_EQ(first, 100);
    EXPECT_EQ(cache.find(1), &first);
}

TEST(LruCache, ShrinkingEvictsTheOldest) {
    LruCache<int, int> cache(4);
    for (int k = 0; k < 4; ++k) cache.insert(k, k);
    cache.find(0);
    cache.set_capacity(2);  // keeps 0 (just used) and 3
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_TRUE(cache.contains(0));
    EXPECT_TRUE(cache.contains(3));
    EXPECT_EQ(cache.evictions(), 2u);
}

}  // namespace
}  // namespace lathe
