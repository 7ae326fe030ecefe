// optimizer.safetensors: the bytes (those of the house safetensors writer, dense or sparse), the
// round trip through an optimizer (whole and shard), and the errors of reading, each naming the
// file and the tensor. The shard sets: saved at one world size and loaded at every other (and
// from the full file), bit for bit, and the errors of an incomplete, corrupt or foreign set. The
// range-list sets of interleaved unit chunks: their metadata and bytes, round trips and
// re-sharding between worlds, loads from single-range sets and the full file (and into the
// single-range API), and every malformed set, refused alike by the loader and rank 0's check.
// Moments that are NaN or infinite, refused by every loader naming the file, the tensor and the
// first such element.

#include "optim/optimizer_state.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

std::string fresh_dir(const std::string& name) {
    const fs::path d =
        fs::temp_directory_path() / fmt::format("lathe_optimizer_state_{}_{}", name, ::getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
}

std::string slurp(const std::string& path) {
    Result<std::string> s = file_read_all(path);
    LATHE_CHECK(s.ok(), "{}", s.status().to_string());
    return *s;
}

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * float(i) - 3.0f;
    return v;
}

// What the checkpoints hold, written with the house writer directly (what a saved state must
// stay byte for byte).
Status write_reference(const std::string& path, const std::vector<float>& m,
                       const std::vector<float>& v) {
    const Shape shape{int64_t(m.size())};
    const std::vector<SafetensorsWriteTensor> ts = {
        safetensors_write_tensor("exp_avg", ConstTensorView(m.data(), DType::kF32, shape)),
        safetensors_write_tensor("exp_avg_sq", ConstTensorView(v.data(), DType::kF32, shape))};
    return safetensors_write_file(path, ts,
                                  {{"format", "lathe-adamw"}, {"layout", "parameter arena"}});
}

TEST(OptimizerState, BytesAreTheHouseWritersForTheTwoMoments) {
    const std::string dir = fresh_dir("bytes");
    for (size_t n : {size_t(0), size_t(1), size_t(37), size_t(123456)}) {
        const std::vector<float> m = ramp(n, 0.5f), v = ramp(n, 0.25f);
        ASSERT_TRUE(optimizer_state_write(dir + "/a.safetensors", m, v).ok());
        ASSERT_TRUE(write_reference(dir + "/b.safetensors", m, v).ok());
        EXPECT_EQ(slurp(dir + "/a.safetensors"), slurp(dir + "/b.safetensors")) << n;
        // The sparse zero file is the same bytes as the dense one for zeros.
        const std::vector<float> zeros(n, 0.0f);
        ASSERT_TRUE(optimizer_state_write_zeros(dir + "/sparse.safetensors", n).ok());
        ASSERT_TRUE(write_reference(dir + "/dense.safetensors", zeros, zeros).ok());
        EXPECT_EQ(slurp(dir + "/sparse.safetensors"), slurp(dir + "/dense.safetensors")) << n;
        // The streamed writer (chunks of 2^20, so 123456 is one chunk; the file order is checked
        // by the bytes) writes the same bytes.
        ASSERT_TRUE(optimizer_state_write_streamed(
                        dir + "/streamed.safetensors", n,
                        [&](int moment, uint64_t begin, std::span<float> out) {
                            const std::vector<float>& src = moment == 0 ? m : v;
                            std::copy_n(src.begin() + ptrdiff_t(begin), out.size(), out.begin());
                        })
                        .ok());
        EXPECT_EQ(slurp(dir + "/streamed.safetensors"), slurp(dir + "/b.safetensors")) << n;
    }
    {
        // Several chunks.
        const size_t n = (size_t(1) << 21) + 5;
        const std::vector<float> m = ramp(n, 0.5f), v = ramp(n, 0.25f);
        ASSERT_TRUE(write_reference(dir + "/b.safetensors", m, v).ok());
        ASSERT_TRUE(optimizer_state_write_streamed(
                        dir + "/streamed.safetensors", n,
                        [&](int moment, uint64_t begin, std::span<float> out) {
                            const std::vector<float>& src = moment == 0 ? m : v;
                            std::copy_n(src.begin() + ptrdiff_t(begin), out.size(), out.begin());
                        })
                        .ok());
        EXPECT_EQ(slurp(dir + "/streamed.safetensors"), slurp(dir + "/b.safetensors"));
    }
    // Nothing is left under a temporary name.
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    fs::remove_all(dir);
}

TEST(OptimizerState, ReadsBackWholeAndByRange) {
    const std::string dir = fresh_dir("read");
    const std::string path = dir + "/optimizer.safetensors";
    const std::vector<float> m = ramp(100, 0.5f), v = ramp(100, 0.125f);
    ASSERT_TRUE(optimizer_state_write(path, m, v).ok());
    std::vector<float> rm(100), rv(100);
    ASSERT_TRUE(optimizer_state_read(path, 100, {0, 100}, rm, rv).ok());
    EXPECT_EQ(rm, m);
    EXPECT_EQ(rv, v);
    std::vector<float> sm(30), sv(30);
    ASSERT_TRUE(optimizer_state_read(path, 100, {40, 70}, sm, sv).ok());
    EXPECT_EQ(sm, std::vector<float>(m.begin() + 40, m.begin() + 70));
    EXPECT_EQ(sv, std::vector<float>(v.begin() + 40, v.begin() + 70));
    fs::remove_all(dir);
}

TEST(OptimizerState, SavesAndLoadsAnOptimizerAndItsShards) {
    const std::string dir = fresh_dir("save");
    const std::string path = dir + "/optimizer.safetensors";
    const int64_t P = 257;
    Result<AdamWOptimizer> opt = AdamWOptimizer::create(P, {0, P}, cpu_context());
    ASSERT_TRUE(opt.ok());
    const std::vector<float> m = ramp(size_t(P), 0.5f), v = ramp(size_t(P), 0.75f);
    opt->write_state(m, v);
    ASSERT_TRUE(optimizer_state_save(*opt, path).ok());
    ASSERT_TRUE(write_reference(dir + "/ref.safetensors", m, v).ok());
    EXPECT_EQ(slurp(path), slurp(dir + "/ref.safetensors"));

    Result<AdamWOptimizer> back = AdamWOptimizer::create(P, {0, P}, cpu_context());
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(optimizer_state_load(*back, path).ok());
    std::vector<float> bm(static_cast<size_t>(P)), bv(static_cast<size_t>(P));
    back->read_state(bm, bv);
    EXPECT_EQ(bm, m);
    EXPECT_EQ(bv, v);

    const FlatRange r = flat_shard(P, 1, 3);
    Result<AdamWOptimizer> shard = AdamWOptimizer::create(P, r, cpu_context());
    ASSERT_TRUE(shard.ok());
    ASSERT_TRUE(optimizer_state_load(*shard, path).ok());
    std::vector<float> smv(static_cast<size_t>(r.size())), svv(static_cast<size_t>(r.size()));
    shard->read_state(smv, svv);
    EXPECT_EQ(smv, std::vector<float>(m.begin() + r.begin, m.begin() + r.end));
    EXPECT_EQ(svv, std::vector<float>(v.begin() + r.begin, v.begin() + r.end));
    fs::remove_all(dir);
}

void expect_error(const Status& s, StatusCode code, const std::vector<std::string>& parts) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const std::string& p : parts)
        EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' in " << s.message();
}

TEST(OptimizerState, ReadErrorsNameTheFileAndTheTensor) {
    const std::string dir = fresh_dir("errors");
    std::vector<float> m(10), v(10);
    // No file.
    const std::string missing = dir + "/none.safetensors";
    expect_error(optimizer_state_read(missing, 10, {0, 10}, m, v), StatusCode::kNotFound,
                 {missing});
    // A tensor missing.
    const std::string only_m = dir + "/only_m.safetensors";
    const std::vector<float> ten(10, 1.0f);
    {
        const std::vector<SafetensorsWriteTensor> ts = {safetensors_write_tensor(
            "exp_avg", ConstTensorView(ten.data(), DType::kF32, Shape{10}))};
        ASSERT_TRUE(safetensors_write_file(only_m, ts, {}).ok());
    }
    expect_error(optimizer_state_read(only_m, 10, {0, 10}, m, v), StatusCode::kNotFound,
                 {only_m, "exp_avg_sq"});
    // The wrong length: written for another model.
    const std::string longer = dir + "/longer.safetensors";
    const std::vector<float> twelve(12, 1.0f);
    ASSERT_TRUE(optimizer_state_write(longer, twelve, twelve).ok());
    expect_error(
        optimizer_state_read(longer, 10, {0, 10}, m, v), StatusCode::kDataLoss,
        {longer, "'exp_avg'", "48 bytes", "expected 10 f32 values", "written for another model"});
    // The wrong dtype (bf16 moments of the right element count).
    const std::string bf16 = dir + "/bf16.safetensors";
    {
        const std::vector<uint16_t> half(10, 0);
        const ConstTensorView hv(half.data(), DType::kBF16, Shape{10});
        const std::vector<SafetensorsWriteTensor> ts = {safetensors_write_tensor("exp_avg", hv),
                                                        safetensors_write_tensor("exp_avg_sq", hv)};
        ASSERT_TRUE(safetensors_write_file(bf16, ts, {}).ok());
    }
    expect_error(optimizer_state_read(bf16, 10, {0, 10}, m, v), StatusCode::kDataLoss,
                 {bf16, "'exp_avg'", "BF16"});
    fs::remove_all(dir);
}

// The shard sets. The reference vector has `kUsed` real elements; a world of W pads it to the
// next multiple of W (`padded`), every rank holding an equal range, as the model's arena does.
constexpr int64_t kUsed = 37;

int64_t padded(int64_t used, int world) {
    return (used + world - 1) / world * world;
}

// Distinct bits in every element, signs, a subnormal and a negative zero included.
std::vector<float> reference_moment(float scale) {
    std::vector<float> x(static_cast<size_t>(kUsed));
    for (size_t i = 0; i < x.size(); ++i) x[i] = scale * (float(i) - 11.5f) / 7.0f;
    x[3] = -0.0f;
    x[5] = 1e-41f;
    return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Elements [r.begin, r.end) of `full` (zero from kUsed on), or `pad` at and after kUsed.
std::vector<float> slice(const std::vector<float>& full, FlatRange r, float pad = 0.0f) {
    std::vector<float> out;
    for (int64_t i = r.begin; i < r.end; ++i) out.push_back(i < kUsed ? full[size_t(i)] : pad);
    return out;
}

// Saves the reference as the shard set of `world` ranks into `dir`. The padding moments are
// written as `pad` (a loader must zero them whatever the file holds).
void save_shards(const std::string& dir, int world, const std::vector<float>& m,
                 const std::vector<float>& v, float pad = 0.0f) {
    const int64_t total = padded(kUsed, world);
    for (int r = 0; r < world; ++r) {
        const FlatRange range = flat_shard(total, r, world);
        Result<AdamWOptimizer> opt = AdamWOptimizer::create(total, range, cpu_context());
        ASSERT_TRUE(opt.ok());
        opt->write_state(slice(m, range, pad), slice(v, range, pad));
        const Status s = optimizer_state_save_shard(*opt, dir, r, world, kUsed);
        ASSERT_TRUE(s.ok()) << s.to_string();
    }
}

// Loads `dir` into every rank of a world of `world` over a vector of `total` elements and checks
// each range against the reference, bit for bit.
void expect_loads_at(const std::string& dir, int world, int64_t total, const std::vector<float>& m,
                     const std::vector<float>& v) {
    for (int r = 0; r < world; ++r) {
        const FlatRange range = flat_shard(total, r, world);
        Result<AdamWOptimizer> opt = AdamWOptimizer::create(total, range, cpu_context());
        ASSERT_TRUE(opt.ok());
        // Garbage first: loading replaces every element of the range.
        opt->write_state(std::vector<float>(size_t(range.size()), 9.0f),
                         std::vector<float>(size_t(range.size()), 9.0f));
        const Status s = optimizer_state_load_checkpoint(*opt, dir, kUsed);
        ASSERT_TRUE(s.ok()) << s.to_string();
        std::vector<float> gm(size_t(range.size())), gv(size_t(range.size()));
        opt->read_state(gm, gv);
        EXPECT_TRUE(same_bits(gm, slice(m, range)))
            << dir << " at rank " << r << " of " << world << " over " << total;
        EXPECT_TRUE(same_bits(gv, slice(v, range)))
            << dir << " at rank " << r << " of " << world << " over " << total;
    }
}

TEST(OptimizerStateShards, NameAndMetadata) {
    EXPECT_EQ(optimizer_state_shard_name(1, 4), "optimizer.rank-00001-of-00004.safetensors");
    EXPECT_EQ(optimizer_state_shard_name(0, 1), "optimizer.rank-00000-of-00001.safetensors");
    EXPECT_EQ(optimizer_state_shard_name(99999, 123456),
              "optimizer.rank-99999-of-123456.safetensors");
    const std::string dir = fresh_dir("shard_meta");
    save_shards(dir, 4, reference_moment(1.0f), reference_moment(0.5f));
    Result<SafetensorsFile> f =
        SafetensorsFile::open(dir + "/optimizer.rank-00003-of-00004.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const std::map<std::string, std::string> want = {{"format", "lathe-adamw-shard"},
                                                     {"range_begin", "30"},
                                                     {"range_end", "40"},
                                                     {"total", "40"},
                                                     {"used", "37"},
                                                     {"rank", "3"},
                                                     {"world", "4"}};
    EXPECT_EQ(f->metadata(), want);
    ASSERT_NE(f->find("exp_avg"), nullptr);
    EXPECT_EQ(f->find("exp_avg")->shape, (std::vector<int64_t>{10}));
    EXPECT_EQ(f->find("exp_avg_sq")->shape, (std::vector<int64_t>{10}));
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    fs::remove_all(dir);
}

TEST(OptimizerStateShards, EveryWorldLoadsAtEveryOtherWorldBitForBit) {
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    for (int w : {1, 2, 3, 4}) {
        const std::string dir = fresh_dir(fmt::format("shards_w{}", w));
        save_shards(dir, w, m, v, /*pad=*/7.0f);
        for (int to : {1, 2, 3, 4, 5}) expect_loads_at(dir, to, padded(kUsed, to), m, v);
        // More padding than any world needs, and uneven ranges.
        expect_loads_at(dir, 3, kUsed + 11, m, v);
        expect_loads_at(dir, 6, kUsed + 1, m, v);
        fs::remove_all(dir);
    }
}

TEST(OptimizerStateShards, FullFileLoadsIntoShards) {
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    // One process (no padding) and rank 0 of a run keeping the whole state over a padded arena
    // (its padding moments zero, as training leaves them).
    for (int64_t length : {kUsed, padded(kUsed, 4)}) {
        const std::string dir = fresh_dir(fmt::format("full_{}", length));
        ASSERT_TRUE(optimizer_state_write(dir + "/optimizer.safetensors", slice(m, {0, length}),
                                          slice(v, {0, length}))
                        .ok());
        for (int to : {1, 2, 3, 4}) expect_loads_at(dir, to, padded(kUsed, to), m, v);
        fs::remove_all(dir);
    }
}

// A shard file written by hand: `n` elements of ones, with `meta` as its metadata.
void write_shard_file(const std::string& path, int64_t n,
                      const std::map<std::string, std::string>& meta) {
    const std::vector<float> ones(size_t(n), 1.0f);
    const Shape shape{n};
    const std::vector<SafetensorsWriteTensor> ts = {
        safetensors_write_tensor("exp_avg", ConstTensorView(ones.data(), DType::kF32, shape)),
        safetensors_write_tensor("exp_avg_sq", ConstTensorView(ones.data(), DType::kF32, shape))};
    ASSERT_TRUE(safetensors_write_file(path, ts, meta).ok());
}

Status load_into_one(const std::string& dir, int64_t used = kUsed) {
    Result<AdamWOptimizer> opt = AdamWOptimizer::create(used, {0, used}, cpu_context());
    LATHE_CHECK(opt.ok(), "{}", opt.status().to_string());
    return optimizer_state_load_checkpoint(*opt, dir, used);
}

TEST(OptimizerStateShards, IncompleteMixedAndMissingSetsAreErrors) {
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    // Neither kind: the folder is named.
    const std::string empty = fresh_dir("empty");
    expect_error(load_into_one(empty), StatusCode::kNotFound, {empty, "no optimizer state"});
    expect_error(load_into_one(empty + "/none"), StatusCode::kNotFound, {empty + "/none"});
    // Missing ranks: each missing file named.
    const std::string part = fresh_dir("incomplete");
    save_shards(part, 4, m, v);
    fs::remove(part + "/optimizer.rank-00001-of-00004.safetensors");
    fs::remove(part + "/optimizer.rank-00003-of-00004.safetensors");
    expect_error(load_into_one(part), StatusCode::kNotFound,
                 {part, "incomplete", "optimizer.rank-00001-of-00004.safetensors",
                  "optimizer.rank-00003-of-00004.safetensors"});
    // Both kinds in one folder.
    const std::string both = fresh_dir("both");
    save_shards(both, 2, m, v);
    ASSERT_TRUE(optimizer_state_write(both + "/optimizer.safetensors", m, v).ok());
    expect_error(load_into_one(both), StatusCode::kDataLoss,
                 {both, "optimizer.safetensors", "optimizer.rank-00000-of-00002.safetensors"});
    // Two worlds' sets.
    const std::string two = fresh_dir("two_worlds");
    save_shards(two, 2, m, v);
    save_shards(two, 4, m, v);
    expect_error(load_into_one(two), StatusCode::kDataLoss, {two, "world sizes (2, 4)"});
    // Temporary and unrelated files are not shards.
    const std::string other = fresh_dir("other_files");
    save_shards(other, 2, m, v);
    ASSERT_TRUE(
        file_write_atomic(other + "/optimizer.rank-00000-of-00004.safetensors.tmp-1", "x").ok());
    ASSERT_TRUE(file_write_atomic(other + "/optimizer.rank-00004-of-00004.safetensors", "x").ok());
    ASSERT_TRUE(file_write_atomic(other + "/optimizer.rank-1-of-4.safetensors", "x").ok());
    EXPECT_TRUE(load_into_one(other).ok());
    for (const std::string& d : {empty, part, both, two, other}) fs::remove_all(d);
}

TEST(OptimizerStateShards, ForeignOrCorruptShardsAreErrorsNamingTheFile) {
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    const std::string dir = fresh_dir("foreign");
    save_shards(dir, 2, m, v);
    const std::string r1 = dir + "/optimizer.rank-00001-of-00002.safetensors";
    // Another model: `used` differs.
    expect_error(load_into_one(dir, kUsed - 1), StatusCode::kDataLoss,
                 {"optimizer.rank-00000-of-00002.safetensors", "another model", "37", "36"});
    const std::map<std::string, std::string> good = {{"format", "lathe-adamw-shard"},
                                                     {"range_begin", "19"},
                                                     {"range_end", "38"},
                                                     {"total", "38"},
                                                     {"used", "37"},
                                                     {"rank", "1"},
                                                     {"world", "2"}};
    write_shard_file(r1, 19, good);
    EXPECT_TRUE(load_into_one(dir).ok());  // the hand-written file itself is a valid shard
    struct Case {
        std::string key, value;
        std::vector<std::string> parts;
    };
    const std::vector<Case> cases = {
        {"format", "lathe-adamw", {"'format' is 'lathe-adamw'", "lathe-adamw-shard"}},
        {"range_begin", "x19", {"'range_begin' is 'x19'", "decimal"}},
        {"range_begin", "-1", {"'range_begin' is '-1'"}},
        {"range_begin", "20", {"range [20, 38)", "end at 19"}},
        {"range_end", "37", {"end at 37, not at their total 38"}},
        {"total", "40", {"total 40", "of total 38"}},
        {"used", "99999999999999999999", {"'used'"}},
        {"rank", "0", {"rank 0 of 2", "file name rank 1 of 2"}},
        {"world", "3", {"rank 1 of 3"}},
        {"range_end", "39", {"does not fit in total 38"}},
    };
    for (const Case& c : cases) {
        std::map<std::string, std::string> meta = good;
        meta[c.key] = c.value;
        // Tensors as long as the range says, so that the metadata is what is wrong.
        const bool shorter = (c.key == "range_end" && c.value == "37") || c.value == "20";
        write_shard_file(r1, shorter ? 18 : 19, meta);
        std::vector<std::string> parts = c.parts;
        parts.push_back(r1);
        expect_error(load_into_one(dir), StatusCode::kDataLoss, parts);
    }
    // A key missing.
    std::map<std::string, std::string> no_used = good;
    no_used.erase("used");
    write_shard_file(r1, 19, no_used);
    expect_error(load_into_one(dir), StatusCode::kDataLoss, {r1, "no 'used'"});
    // Tensors of another length than the range.
    write_shard_file(r1, 18, good);
    expect_error(load_into_one(dir), StatusCode::kDataLoss, {r1, "'exp_avg'", "19 f32 values"});
    // Not safetensors at all (truncated).
    ASSERT_TRUE(file_write_atomic(r1, "truncated").ok());
    expect_error(load_into_one(dir), StatusCode::kDataLoss, {r1});
    fs::remove_all(dir);
}

// Rank 0's check before a commit: the loader's checks without a range to fill.
TEST(OptimizerStateShards, CheckFindsWhatTheLoaderRefuses) {
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    const std::string dir = fresh_dir("check");
    expect_error(optimizer_state_check_checkpoint(dir, kUsed), StatusCode::kNotFound, {dir});
    save_shards(dir, 3, m, v);
    EXPECT_TRUE(optimizer_state_check_checkpoint(dir, kUsed).ok());
    expect_error(optimizer_state_check_checkpoint(dir, kUsed + 1), StatusCode::kDataLoss,
                 {"optimizer.rank-00000-of-00003.safetensors", "another model"});
    fs::remove(dir + "/optimizer.rank-00002-of-00003.safetensors");
    expect_error(optimizer_state_check_checkpoint(dir, kUsed), StatusCode::kNotFound,
                 {"optimizer.rank-00002-of-00003.safetensors"});
    fs::remove_all(dir);
    const std::string full = fresh_dir("check_full");
    ASSERT_TRUE(optimizer_state_write(full + "/optimizer.safetensors", m, v).ok());
    EXPECT_TRUE(optimizer_state_check_checkpoint(full, kUsed).ok());
    expect_error(optimizer_state_check_checkpoint(full, kUsed + 1), StatusCode::kDataLoss,
                 {full + "/optimizer.safetensors"});
    fs::remove_all(full);
}

TEST(OptimizerStateShards, FullFileShorterThanTheModelIsAnError) {
    const std::string dir = fresh_dir("short_full");
    const std::vector<float> m(size_t(kUsed - 1), 1.0f);
    ASSERT_TRUE(optimizer_state_write(dir + "/optimizer.safetensors", m, m).ok());
    expect_error(load_into_one(dir), StatusCode::kDataLoss,
                 {dir + "/optimizer.safetensors", "36 f32 values", "37 parameters"});
    fs::remove_all(dir);
}

// The range-list sets. A model of units (the entries before layer 0, each layer, those after the
// last) of the given canonical lengths, one after another from 0 as in the one-process arena. With
// W ranks each unit is padded to a multiple of granule * W and rank r owns chunk r of every unit:
// in canonical coordinates, the part of [u + r * c, u + (r + 1) * c) below the unit's end (empty
// for a chunk of padding only).
std::vector<FlatRange> unit_chunks(const std::vector<int64_t>& units, int64_t granule, int world,
                                   int rank) {
    std::vector<FlatRange> out;
    int64_t u = 0;
    for (const int64_t n : units) {
        const int64_t c = (n + granule * world - 1) / (granule * world) * granule;
        out.push_back({std::min(u + rank * c, u + n), std::min(u + (rank + 1) * c, u + n)});
        u += n;
    }
    return out;
}

int64_t units_used(const std::vector<int64_t>& units) {
    int64_t n = 0;
    for (const int64_t u : units) n += u;
    return n;
}

// A canonical moment of `n` elements, distinct bits in each, signs, a subnormal and a negative
// zero included.
std::vector<float> canonical(int64_t n, float scale) {
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = scale * (float(i) - 11.5f) / 7.0f;
    if (n > 5) {
        x[3] = -0.0f;
        x[5] = 1e-41f;
    }
    return x;
}

// The elements of `ranges` of `x`, concatenated in list order.
std::vector<float> gather(const std::vector<float>& x, const std::vector<FlatRange>& ranges) {
    std::vector<float> out;
    for (const FlatRange& r : ranges) out.insert(out.end(), x.begin() + r.begin, x.begin() + r.end);
    return out;
}

// Saves `m` and `v` (canonical, of units_used(units) elements) as the range-list set of `world`
// ranks into `dir`.
void save_list_set(const std::string& dir, const std::vector<int64_t>& units, int64_t granule,
                   int world, const std::vector<float>& m, const std::vector<float>& v) {
    for (int r = 0; r < world; ++r) {
        const std::vector<FlatRange> ranges = unit_chunks(units, granule, world, r);
        const Status s = optimizer_state_save_shard(gather(m, ranges), gather(v, ranges), ranges,
                                                    dir, r, world, units_used(units));
        ASSERT_TRUE(s.ok()) << s.to_string();
    }
}

// Loads every rank's unit chunks of a world of `world` from `dir` and compares them with the
// reference, bit for bit.
void expect_list_loads(const std::string& dir, const std::vector<int64_t>& units, int64_t granule,
                       int world, const std::vector<float>& m, const std::vector<float>& v) {
    for (int r = 0; r < world; ++r) {
        const std::vector<FlatRange> ranges = unit_chunks(units, granule, world, r);
        const std::vector<float> want_m = gather(m, ranges), want_v = gather(v, ranges);
        std::vector<float> gm(want_m.size(), 9.0f), gv(want_v.size(), 9.0f);  // garbage first
        const Status s = optimizer_state_load_ranges(dir, units_used(units), ranges, gm, gv);
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_TRUE(same_bits(gm, want_m)) << dir << " at rank " << r << " of " << world;
        EXPECT_TRUE(same_bits(gv, want_v)) << dir << " at rank " << r << " of " << world;
    }
}

TEST(OptimizerStateRanges, MetadataListsTheMergedRangesAndTheBytesAreTheHouseWriters) {
    const std::string dir = fresh_dir("ranges_meta");
    const std::vector<float> m = canonical(40, 1.0f), v = canonical(40, 0.5f);
    // Adjacent ranges merge, empty ones vanish.
    const std::vector<FlatRange> ranges = {{0, 5}, {5, 9}, {12, 12}, {20, 30}};
    ASSERT_TRUE(
        optimizer_state_save_shard(gather(m, ranges), gather(v, ranges), ranges, dir, 1, 3, 40)
            .ok());
    const std::string path = dir + "/optimizer.rank-00001-of-00003.safetensors";
    Result<SafetensorsFile> f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const std::map<std::string, std::string> want = {{"format", "lathe-adamw-ranges"},
                                                     {"ranges", "0-9,20-30"},
                                                     {"used", "40"},
                                                     {"rank", "1"},
                                                     {"world", "3"}};
    EXPECT_EQ(f->metadata(), want);
    ASSERT_NE(f->find("exp_avg"), nullptr);
    EXPECT_EQ(f->find("exp_avg")->shape, (std::vector<int64_t>{19}));
    EXPECT_EQ(f->find("exp_avg_sq")->shape, (std::vector<int64_t>{19}));
    // The bytes: the house writer's for the two concatenated moments and this metadata.
    const std::vector<float> cm = gather(m, ranges), cv = gather(v, ranges);
    const Shape shape{19};
    const std::vector<SafetensorsWriteTensor> ts = {
        safetensors_write_tensor("exp_avg", ConstTensorView(cm.data(), DType::kF32, shape)),
        safetensors_write_tensor("exp_avg_sq", ConstTensorView(cv.data(), DType::kF32, shape))};
    ASSERT_TRUE(safetensors_write_file(dir + "/ref.safetensors", ts, want).ok());
    EXPECT_EQ(slurp(path), slurp(dir + "/ref.safetensors"));
    // A rank that owns nothing writes an empty list and empty moments.
    ASSERT_TRUE(
        optimizer_state_save_shard({}, {}, std::vector<FlatRange>{{7, 7}}, dir, 2, 3, 40).ok());
    Result<SafetensorsFile> e =
        SafetensorsFile::open(dir + "/optimizer.rank-00002-of-00003.safetensors");
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->metadata().at("ranges"), "");
    EXPECT_EQ(e->find("exp_avg")->shape, (std::vector<int64_t>{0}));
    for (const fs::directory_entry& de : fs::directory_iterator(dir))
        EXPECT_EQ(de.path().filename().string().find(".tmp-"), std::string::npos) << de.path();
    fs::remove_all(dir);
}

// Units small enough for every chunk boundary to be seen (granule 4, a unit shorter than one
// chunk, so that some ranks own none of it) and units of the real granule, 64.
const std::vector<std::pair<std::vector<int64_t>, int64_t>>& unit_models() {
    static const std::vector<std::pair<std::vector<int64_t>, int64_t>> models = {
        {{13, 50, 50, 50, 7}, 4},
        {{300, 1000, 1000, 65}, 64},
    };
    return models;
}

TEST(OptimizerStateRanges, EveryWorldLoadsAtEveryOtherWorldBitForBit) {
    for (const auto& [units, granule] : unit_models()) {
        const int64_t used = units_used(units);
        const std::vector<float> m = canonical(used, 1.0f), v = canonical(used, 0.25f);
        for (int w : {1, 2, 3, 4, 8}) {
            const std::string dir = fresh_dir(fmt::format("ranges_w{}_g{}", w, granule));
            save_list_set(dir, units, granule, w, m, v);
            EXPECT_TRUE(optimizer_state_check_checkpoint(dir, used).ok());
            // The chunks of the interleaved layout do interleave: rank 0 holds several ranges.
            if (w > 1) {
                Result<SafetensorsFile> f =
                    SafetensorsFile::open(dir + "/" + optimizer_state_shard_name(0, w));
                ASSERT_TRUE(f.ok());
                EXPECT_NE(f->metadata().at("ranges").find(','), std::string::npos);
            }
            for (int to : {1, 2, 3, 4, 5, 8}) expect_list_loads(dir, units, granule, to, m, v);
            fs::remove_all(dir);
        }
    }
}

TEST(OptimizerStateRanges, RangesLoadInAnyOrderAndFromEveryKindOfState) {
    // kUsed = 37 in units that sum to it: the single-range sets and the full file hold the same
    // canonical vector.
    const std::vector<int64_t> units = {5, 16, 16};
    ASSERT_EQ(units_used(units), kUsed);
    const std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    for (int w : {1, 2, 3, 4}) {
        // A single-range set (its padding written as 7: never read).
        const std::string old_set = fresh_dir(fmt::format("ranges_from_old_w{}", w));
        save_shards(old_set, w, m, v, /*pad=*/7.0f);
        for (int to : {1, 2, 3, 5}) expect_list_loads(old_set, units, 2, to, m, v);
        // A range-list set through the single-range API (an optimizer over a padded arena).
        const std::string list_set = fresh_dir(fmt::format("ranges_to_old_w{}", w));
        save_list_set(list_set, units, 2, w, m, v);
        for (int to : {1, 2, 3, 4, 5}) expect_loads_at(list_set, to, padded(kUsed, to), m, v);
        expect_loads_at(list_set, 3, kUsed + 11, m, v);
        fs::remove_all(old_set);
        fs::remove_all(list_set);
    }
    // The full file, without and with padding (nonzero: never read).
    for (int64_t length : {kUsed, kUsed + 3}) {
        const std::string dir = fresh_dir(fmt::format("ranges_from_full_{}", length));
        ASSERT_TRUE(optimizer_state_write(dir + "/optimizer.safetensors",
                                          slice(m, {0, length}, 7.0f), slice(v, {0, length}, 7.0f))
                        .ok());
        for (int to : {1, 2, 4}) expect_list_loads(dir, units, 2, to, m, v);
        fs::remove_all(dir);
    }
    // Ranges in any order, empty ones and repeats included, from a set of 3.
    const std::string dir = fresh_dir("ranges_any_order");
    save_list_set(dir, units, 2, 3, m, v);
    const std::vector<FlatRange> ask = {{30, 37}, {0, 3}, {10, 10}, {3, 8}, {0, 37}, {36, 37}};
    const std::vector<float> want_m = gather(m, ask), want_v = gather(v, ask);
    std::vector<float> gm(want_m.size(), 9.0f), gv(want_v.size(), 9.0f);
    const Status s = optimizer_state_load_ranges(dir, kUsed, ask, gm, gv);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_TRUE(same_bits(gm, want_m));
    EXPECT_TRUE(same_bits(gv, want_v));
    fs::remove_all(dir);
}

Status load_all(const std::string& dir, int64_t used = kUsed) {
    std::vector<float> m(size_t(used), 0.0f), v(size_t(used), 0.0f);
    return optimizer_state_load_ranges(dir, used, std::vector<FlatRange>{{0, used}}, m, v);
}

// The loader and rank 0's check refuse alike.
void expect_both_refuse(const std::string& dir, StatusCode code,
                        const std::vector<std::string>& parts) {
    expect_error(load_all(dir), code, parts);
    expect_error(optimizer_state_check_checkpoint(dir, kUsed), code, parts);
}

std::map<std::string, std::string> list_meta(const std::string& ranges, int rank, int world) {
    return {{"format", "lathe-adamw-ranges"},
            {"ranges", ranges},
            {"used", std::to_string(kUsed)},
            {"rank", std::to_string(rank)},
            {"world", std::to_string(world)}};
}

TEST(OptimizerStateRanges, MalformedSetsAreErrorsNamingTheFile) {
    const std::string dir = fresh_dir("ranges_malformed");
    const std::string r0 = dir + "/optimizer.rank-00000-of-00002.safetensors";
    const std::string r1 = dir + "/optimizer.rank-00001-of-00002.safetensors";
    write_shard_file(r0, 20, list_meta("0-20", 0, 2));
    write_shard_file(r1, 17, list_meta("20-37", 1, 2));
    EXPECT_TRUE(load_all(dir).ok());  // the hand-written set itself is valid
    // Adjacent ranges in one file, and a rank holding nothing, are valid too.
    write_shard_file(r1, 17, list_meta("20-30,30-37", 1, 2));
    EXPECT_TRUE(load_all(dir).ok());
    write_shard_file(r0, 37, list_meta("0-37", 0, 2));
    write_shard_file(r1, 0, list_meta("", 1, 2));
    EXPECT_TRUE(load_all(dir).ok());
    write_shard_file(r0, 20, list_meta("0-20", 0, 2));

    struct Case {
        std::string key, value;
        int64_t n;  // the tensors' length
        std::vector<std::string> parts;
    };
    const std::vector<Case> cases = {
        // Overlap with the other file, gaps inside and at the end.
        {"ranges", "19-37", 18, {"range 19-37 overlaps range 0-20 of " + r0}},
        {"ranges", "21-37", 16, {dir, "[20, 21)", "before range 21-37 of " + r1}},
        {"ranges", "20-36", 16, {dir, "[36, 37)", "after range 20-36 of " + r1, "37 parameters"}},
        // Malformed lists.
        {"ranges", "20-38", 18, {"item 0 '20-38' ends past 'used' 37"}},
        {"ranges", "20-25,24-37", 18, {"item 1 '24-37' begins before item 0 '20-25' ends"}},
        {"ranges", "25-37,20-25", 17, {"item 1 '20-25' begins before item 0 '25-37' ends"}},
        {"ranges", "20-20,20-37", 17, {"item 0 is '20-20', an empty range"}},
        {"ranges", "30-20", 0, {"item 0 is '30-20', an empty range"}},
        {"ranges", "20..37", 17, {"item 0 is '20..37', not B-E"}},
        {"ranges", "20-37,", 17, {"item 1 is '', not B-E"}},
        {"ranges", "-37", 17, {"item 0 is '-37', not B-E"}},
        {"ranges", "20-", 17, {"item 0 is '20-', not B-E"}},
        {"ranges", " 20-37", 17, {"item 0 is ' 20-37', not B-E"}},
        {"ranges", "20-0x25", 17, {"item 0 is '20-0x25'"}},
        {"ranges", "20-99999999999999999999", 17, {"not B-E"}},
        // Another model, names and formats that disagree.
        {"used", "36", 17, {"written for a model of 36 parameters, this one has 37"}},
        {"used", "x", 17, {"'used' is 'x'", "decimal"}},
        {"rank", "0", 17, {"rank 0 of 2", "file name rank 1 of 2"}},
        {"world", "3", 17, {"rank 1 of 3"}},
        {"format", "lathe-adamw", 17, {"'format' is 'lathe-adamw'", "lathe-adamw-ranges"}},
        {"format",
         "lathe-adamw-shard",
         17,
         {"'format' is 'lathe-adamw-shard'",
          "optimizer.rank-00000-of-00002.safetensors is "
          "'lathe-adamw-ranges'"}},
        // Tensors of another length than the ranges.
        {"ranges", "20-37", 16, {"'exp_avg'", "17 f32 values"}},
    };
    for (const Case& c : cases) {
        std::map<std::string, std::string> meta = list_meta("20-37", 1, 2);
        meta[c.key] = c.value;
        write_shard_file(r1, c.n, meta);
        std::vector<std::string> parts = c.parts;
        parts.push_back(c.key == "ranges" && c.parts[0] == dir ? dir : r1);
        SCOPED_TRACE(c.key + "=" + c.value);
        expect_both_refuse(dir, StatusCode::kDataLoss, parts);
    }
    // Keys missing.
    for (const char* key : {"ranges", "used", "rank", "format"}) {
        std::map<std::string, std::string> meta = list_meta("20-37", 1, 2);
        meta.erase(key);
        write_shard_file(r1, 17, meta);
        SCOPED_TRACE(key);
        expect_both_refuse(dir, StatusCode::kDataLoss,
                           {r1, std::string(key) == "format" ? "'format' is missing"
                                                             : fmt::format("no '{}'", key)});
    }
    // No file holds anything.
    write_shard_file(r0, 0, list_meta("", 0, 2));
    write_shard_file(r1, 0, list_meta("", 1, 2));
    expect_both_refuse(dir, StatusCode::kDataLoss, {dir, "holds any element", "37 parameters"});
    // A file missing.
    write_shard_file(r0, 20, list_meta("0-20", 0, 2));
    fs::remove(r1);
    expect_both_refuse(dir, StatusCode::kNotFound, {dir, "incomplete", r1.substr(dir.size() + 1)});
    // Not safetensors at all.
    ASSERT_TRUE(file_write_atomic(r1, "truncated").ok());
    expect_both_refuse(dir, StatusCode::kDataLoss, {r1});
    // A single-range file first, a range-list one after it.
    write_shard_file(r1, 17, list_meta("20-37", 1, 2));
    write_shard_file(r0, 19,
                     {{"format", "lathe-adamw-shard"},
                      {"range_begin", "0"},
                      {"range_end", "19"},
                      {"total", "38"},
                      {"used", "37"},
                      {"rank", "0"},
                      {"world", "2"}});
    expect_both_refuse(dir, StatusCode::kDataLoss,
                       {r1, "'format' is 'lathe-adamw-ranges'", "is 'lathe-adamw-shard'"});
    // The full file beside a range-list set.
    write_shard_file(r0, 20, list_meta("0-20", 0, 2));
    ASSERT_TRUE(load_all(dir).ok());
    const std::vector<float> m = reference_moment(1.0f);
    ASSERT_TRUE(optimizer_state_write(dir + "/optimizer.safetensors", m, m).ok());
    expect_both_refuse(dir, StatusCode::kDataLoss, {dir, "holds both"});
    fs::remove_all(dir);

    // An overlap between files that are not neighbours by rank, found whatever their order.
    const std::string three = fresh_dir("ranges_overlap3");
    const std::string t0 = three + "/optimizer.rank-00000-of-00003.safetensors";
    const std::string t2 = three + "/optimizer.rank-00002-of-00003.safetensors";
    write_shard_file(t0, 10, list_meta("0-5,20-25", 0, 3));
    write_shard_file(three + "/optimizer.rank-00001-of-00003.safetensors", 22,
                     list_meta("5-20,30-37", 1, 3));
    write_shard_file(t2, 5, list_meta("25-30", 2, 3));
    ASSERT_TRUE(load_all(three).ok());
    write_shard_file(t2, 6, list_meta("24-30", 2, 3));
    expect_both_refuse(three, StatusCode::kDataLoss,
                       {t2, "range 24-30 overlaps range 20-25 of " + t0});
    fs::remove_all(three);
}

TEST(OptimizerStateRanges, NonFiniteMomentsAreErrorsNamingTheFileTensorAndElement) {
    const std::vector<int64_t> units = {5, 16, 16};
    std::vector<float> m = reference_moment(1.0f), v = reference_moment(0.25f);
    v[30] = std::numeric_limits<float>::quiet_NaN();
    v[20] = std::numeric_limits<float>::infinity();
    const std::string dir = fresh_dir("ranges_non_finite");
    save_list_set(dir, units, 2, 3, m, v);
    // The file holding element 20: the rank whose chunks cover it.
    std::string holder;
    for (int r = 0; r < 3; ++r)
        for (const FlatRange& c : unit_chunks(units, 2, 3, r))
            if (c.begin <= 20 && 20 < c.end) holder = dir + "/" + optimizer_state_shard_name(r, 3);
    ASSERT_FALSE(holder.empty());
    expect_error(load_all(dir), StatusCode::kDataLoss,
                 {holder + ": tensor 'exp_avg_sq': 2 of the 37 values read are not finite",
                  "the first at element 20 of the parameter vector (inf)", "earlier checkpoint"});
    // Ranges that miss the bad elements load; the headers alone pass rank 0's check.
    std::vector<float> gm(20), gv(20);
    EXPECT_TRUE(
        optimizer_state_load_ranges(dir, kUsed, std::vector<FlatRange>{{0, 20}}, gm, gv).ok());
    EXPECT_TRUE(optimizer_state_check_checkpoint(dir, kUsed).ok());
    fs::remove_all(dir);

    // The full file, into an optimizer and through optimizer_state_read; exp_avg named first.
    const std::string full = fresh_dir("full_non_finite");
    m[3] = -std::numeric_limits<float>::infinity();
    const std::string path = full + "/optimizer.safetensors";
    ASSERT_TRUE(optimizer_state_write(path, m, v).ok());
    expect_error(load_all(full), StatusCode::kDataLoss,
                 {path + ": tensor 'exp_avg': 1 of the 37 values read are not finite",
                  "element 3 of the parameter vector (-inf)"});
    std::vector<float> rm(10), rv(10);
    expect_error(optimizer_state_read(path, kUsed, {25, 35}, rm, rv), StatusCode::kDataLoss,
                 {path + ": tensor 'exp_avg_sq': 1 of the 10 values read are not finite",
                  "the first at element 30 (nan)"});
    fs::remove_all(full);
}

}  // namespace
}  // namespace lathe
