#include "data/indexed_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

namespace lathe {
namespace {

std::string temp_dir() {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_indexed_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::string& s, size_t at, T v) {
    std::memcpy(s.data() + at, &v, sizeof(T));
}
template <typename T>
void push(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Writes documents (each a list of sequences) and commits; returns the prefix.
std::string write_dataset(const std::string& name, TokenDType dtype,
                          const std::vector<std::vector<std::vector<int32_t>>>& docs) {
    const std::string prefix = temp_dir() + "/" + name;
    auto w = IndexedDatasetWriter::create(prefix, dtype);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    for (const auto& doc : docs) {
        for (const auto& seq : doc) EXPECT_TRUE(w->add_sequence(seq).ok());
        w->end_document();
    }
    EXPECT_TRUE(w->finalize().ok());
    EXPECT_TRUE(w->commit().ok());
    return prefix;
}

// A small valid uint16 dataset: 3 documents, 4 sequences (one empty), 7 tokens.
std::string small_dataset(const std::string& name) {
    return write_dataset(name, TokenDType::kUInt16, {{{5, 6, 7}}, {{8}, {}}, {{65535, 0, 1}}});
}

TEST(TokenDType, CodesNamesSizesAndVocabRule) {
    EXPECT_EQ(static_cast<int>(TokenDType::kUInt16), 8);
    EXPECT_EQ(static_cast<int>(TokenDType::kInt32), 4);
    EXPECT_EQ(token_dtype_for_vocab(50257), TokenDType::kUInt16);
    EXPECT_EQ(token_dtype_for_vocab(65499), TokenDType::kUInt16);
    EXPECT_EQ(token_dtype_for_vocab(65500), TokenDType::kInt32);
    EXPECT_EQ(token_dtype_for_vocab(128256), TokenDType::kInt32);
    for (uint8_t code : {1, 2, 3, 4, 5, 8}) {
        auto d = token_dtype_from_code(code, "x.idx");
        ASSERT_TRUE(d.ok());
        EXPECT_EQ(static_cast<uint8_t>(*d), code);
    }
    EXPECT_EQ(token_dtype_size(TokenDType::kUInt16), 2u);
    EXPECT_EQ(token_dtype_size(TokenDType::kInt64), 8u);
    auto f6 = token_dtype_from_code(6, "x.idx");
    ASSERT_FALSE(f6.ok());
    EXPECT_NE(f6.status().message().find("GPT-NeoX reads it as float32, Megatron-LM as float64"),
              std::string::npos)
        << f6.status().message();
    EXPECT_FALSE(token_dtype_from_code(7, "x.idx").ok());
    EXPECT_FALSE(token_dtype_from_code(9, "x.idx").ok());
    EXPECT_FALSE(token_dtype_from_code(0, "x.idx").ok());
    EXPECT_TRUE(token_dtype_holds(TokenDType::kUInt16, 65535));
    EXPECT_FALSE(token_dtype_holds(TokenDType::kUInt16, 65536));
    EXPECT_FALSE(token_dtype_holds(TokenDType::kUInt16, -1));
    EXPECT_FALSE(token_dtype_holds(TokenDType::kInt8, 128));
}

TEST(IndexedDatasetWriter, WritesTheExactMMapIndexedDatasetBytes) {
    const std::string prefix = small_dataset("exact");
    // Expected .idx, built field by field from the format description.
    std::string idx("MMIDIDX\0\0", 9);
    push<uint64_t>(idx, 1);
    push<uint8_t>(idx, 8);
    push<uint64_t>(idx, 4);  // sequences
    push<uint64_t>(idx, 4);  // doc_idx entries = documents + 1
    for (int32_t s : {3, 1, 0, 3}) push<int32_t>(idx, s);
    for (int64_t p : {0, 6, 8, 8}) push<int64_t>(idx, p);
    for (int64_t d : {0, 1, 3, 4}) push<int64_t>(idx, d);
    EXPECT_EQ(read_bytes(prefix + ".idx"), idx);
    std::string bin;
    for (uint16_t t : {5, 6, 7, 8, 65535, 0, 1}) push<uint16_t>(bin, t);
    EXPECT_EQ(read_bytes(prefix + ".bin"), bin);
}

TEST(IndexedDataset, RoundTripEveryIntegerDtype) {
    std::mt19937 rng(11);
    for (TokenDType dtype : {TokenDType::kUInt8, TokenDType::kInt8, TokenDType::kInt16,
                             TokenDType::kUInt16, TokenDType::kInt32, TokenDType::kInt64}) {
        std::vector<std::vector<std::vector<int32_t>>> docs;
        for (int d = 0; d < 300; ++d) {
            std::vector<std::vector<int32_t>> doc;
            const int nseq = 1 + static_cast<int>(rng() % 3);
            for (int s = 0; s < nseq; ++s) {
                std::vector<int32_t> seq(rng() % 50);
                for (int32_t& t : seq) {
                    t = static_cast<int32_t>(rng() % 100);
                    if (dtype == TokenDType::kInt8 || dtype == TokenDType::kInt16 ||
                        dtype == TokenDType::kInt32 || dtype == TokenDType::kInt64) {
                        t -= 50;
                    }
                }
                doc.push_back(seq);
            }
            docs.push_back(doc);
        }
        const std::string prefix =
            write_dataset(std::string("rt_") + token_dtype_name(dtype), dtype, docs);
        auto ds = IndexedDataset::open(prefix);
        ASSERT_TRUE(ds.ok()) << ds.status().to_string();
        EXPECT_EQ(ds->dtype(), dtype);
        EXPECT_EQ(ds->document_count(), docs.size());
        EXPECT_TRUE(ds->warnings().empty());
        uint64_t seq_index = 0;
        uint64_t tokens = 0;
        for (size_t d = 0; d < docs.size(); ++d) {
            std::vector<int64_t> expected_doc;
            for (const auto& seq : docs[d]) {
                std::vector<int64_t> got;
                ds->read_sequence(seq_index, got);
                ASSERT_EQ(got, std::vector<int64_t>(seq.begin(), seq.end()));
                expected_doc.insert(expected_doc.end(), seq.begin(), seq.end());
                ++seq_index;
                tokens += seq.size();
            }
            std::vector<int64_t> got_doc;
            ds->read_document(d, got_doc);
            ASSERT_EQ(got_doc, expected_doc);
            ASSERT_EQ(ds->document_length(d), expected_doc.size());
        }
        EXPECT_EQ(ds->sequence_count(), seq_index);
        EXPECT_EQ(ds->token_count(), tokens);
    }
}

TEST(IndexedDataset, ReadWithOffsetAndLength) {
    auto ds = IndexedDataset::open(small_dataset("offset"));
    ASSERT_TRUE(ds.ok());
    int64_t out[2];
    ds->read(3, 1, 2, out);
    EXPECT_EQ(out[0], 0);
    EXPECT_EQ(out[1], 1);
}

TEST(IndexedDatasetWriter, ValueOutsideDtypeIsAnError) {
    auto w = IndexedDatasetWriter::create(temp_dir() + "/range", TokenDType::kUInt16);
    ASSERT_TRUE(w.ok());
    const std::vector<int32_t> bad = {1, 70000};
    Status s = w->add_sequence(bad);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(
        s.message().find("token 70000 (at position 1 of sequence 0) does not fit dtype uint16"),
        std::string::npos)
        << s.message();
}

TEST(IndexedDatasetWriter, NothingUnderFinalNamesUntilCommit) {
    const std::string prefix = temp_dir() + "/atomic";
    std::filesystem::remove(prefix + ".bin");
    std::filesystem::remove(prefix + ".idx");
    {
        auto w = IndexedDatasetWriter::create(prefix, TokenDType::kInt32);
        ASSERT_TRUE(w.ok());
        ASSERT_TRUE(w->add_document(std::vector<int32_t>{1, 2, 3}).ok());
        ASSERT_TRUE(w->finalize().ok());
        EXPECT_FALSE(std::filesystem::exists(prefix + ".bin"));
        EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
    }  // dropped without commit
    EXPECT_FALSE(std::filesystem::exists(prefix + ".bin"));
    EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
    for (const auto& e : std::filesystem::directory_iterator(temp_dir())) {
        EXPECT_EQ(e.path().filename().string().find("atomic."), std::string::npos)
            << "temporary left behind: " << e.path();
    }
}

TEST(IndexedDatasetWriter, CommitTogetherReplacesOldFiles) {
    const std::string a = small_dataset("pair");
    const std::string b = small_dataset("pair_label");
    auto wa = IndexedDatasetWriter::create(a, TokenDType::kInt32);
    auto wb = IndexedDatasetWriter::create(b, TokenDType::kInt32);
    ASSERT_TRUE(wa.ok() && wb.ok());
    ASSERT_TRUE(wa->add_document(std::vector<int32_t>{1, 2}).ok());
    ASSERT_TRUE(wb->add_document(std::vector<int32_t>{-100, 2}).ok());
    ASSERT_TRUE(wa->finalize().ok());
    ASSERT_TRUE(wb->finalize().ok());
    IndexedDatasetWriter* both[] = {&*wa, &*wb};
    ASSERT_TRUE(indexed_commit_together(both).ok());
    auto da = IndexedDataset::open(a);
    auto db = IndexedDataset::open(b);
    ASSERT_TRUE(da.ok() && db.ok());
    EXPECT_EQ(da->dtype(), TokenDType::kInt32);
    std::vector<int64_t> labels;
    db->read_document(0, labels);
    EXPECT_EQ(labels, (std::vector<int64_t>{-100, 2}));
}

// ---- validation: each corruption gives its own message naming the file ----

struct Corruption {
    const char* name;
    std::function<void(std::string& idx, std::string& bin)> apply;
    const char* expected;  // substring of the error
};

TEST(IndexedDataset, EveryValidationErrorNamesFileAndProblem) {
    // small_dataset: S = 4, D = 4; sizes at 34, pointers at 50, doc_idx at 82, idx length 114.
    const std::vector<Corruption> cases = {
        {"empty_idx", [](std::string& idx, std::string&) { idx.clear(); }, "an empty file"},
        {"magic", [](std::string& idx, std::string&) { idx[0] = 'X'; },
         "not a token index: expected the magic"},
        {"tntidx",
         [](std::string& idx, std::string&) { idx = std::string("TNTIDX\0\0", 8) + idx.substr(8); },
         "'lazy'/'cached' IndexedDataset"},
        {"short_header", [](std::string& idx, std::string&) { idx.resize(20); },
         "shorter than the 34-byte header"},
        {"version", [](std::string& idx, std::string&) { put<uint64_t>(idx, 9, 2); },
         "index version 2, expected 1"},
        {"float_dtype", [](std::string& idx, std::string&) { idx[17] = 6; },
         "is a floating-point type"},
        {"unknown_dtype", [](std::string& idx, std::string&) { idx[17] = 42; },
         "unknown dtype code 42"},
        {"truncated_idx", [](std::string& idx, std::string&) { idx.resize(idx.size() - 5); },
         "truncated: the header announces 4 sequences and 4 doc_idx entries"},
        {"huge_count",
         [](std::string& idx, std::string&) { put<uint64_t>(idx, 18, uint64_t{1} << 62); },
         "truncated: the header announces 4611686018427387904 sequences"},
        {"trailing_idx", [](std::string& idx, std::string&) { idx += "abc"; },
         "3 bytes after the arrays"},
        {"negative_size", [](std::string& idx, std::string&) { put<int32_t>(idx, 34 + 4, -1); },
         "sizes[1] = -1 is negative"},
        {"non_monotonic", [](std::string& idx, std::string&) { put<int64_t>(idx, 50 + 8 * 2, 2); },
         "pointers are not monotonic: pointers[2] = 2 is less than pointers[1] = 6"},
        {"gap", [](std::string& idx, std::string&) { put<int64_t>(idx, 50 + 8 * 1, 8); },
         "pointers[1] = 8, expected 6"},
        {"bin_truncated", [](std::string&, std::string& bin) { bin.resize(bin.size() - 2); },
         "the .bin is truncated"},
        {"bin_trailing", [](std::string&, std::string& bin) { bin += "zz"; },
         "the .bin has trailing bytes"},
        {"doc_idx_start", [](std::string& idx, std::string&) { put<int64_t>(idx, 82, 1); },
         "doc_idx[0] = 1, expected 0"},
        {"doc_idx_order", [](std::string& idx, std::string&) { put<int64_t>(idx, 82 + 16, 0); },
         "doc_idx is not monotonic: doc_idx[2] = 0 is less than doc_idx[1] = 1"},
        {"doc_idx_bounds", [](std::string& idx, std::string&) { put<int64_t>(idx, 82 + 24, 5); },
         "doc_idx[3] = 5 is beyond the 4 sequences"},
        {"doc_idx_empty",
         [](std::string& idx, std::string&) {
             put<uint64_t>(idx, 26, 0);
             idx.resize(idx.size() - 32);
         },
         "doc_idx is empty"},
    };
    const std::string good = small_dataset("good");
    const std::string good_idx = read_bytes(good + ".idx");
    const std::string good_bin = read_bytes(good + ".bin");
    ASSERT_EQ(good_idx.size(), 114u);
    ASSERT_TRUE(IndexedDataset::open(good).ok());
    for (const Corruption& c : cases) {
        std::string idx = good_idx;
        std::string bin = good_bin;
        c.apply(idx, bin);
        const std::string prefix = temp_dir() + "/bad_" + c.name;
        write_bytes(prefix + ".idx", idx);
        write_bytes(prefix + ".bin", bin);
        auto ds = IndexedDataset::open(prefix);
        ASSERT_FALSE(ds.ok()) << c.name;
        const std::string& msg = ds.status().message();
        EXPECT_NE(msg.find(c.expected), std::string::npos) << c.name << ": " << msg;
        EXPECT_NE(msg.find("bad_" + std::string(c.name)), std::string::npos)
            << c.name << " (no file name): " << msg;
    }
}

TEST(IndexedDataset, MissingFilesAreNotFound) {
    const std::string prefix = small_dataset("missing_bin");
    std::filesystem::remove(prefix + ".bin");
    auto a = IndexedDataset::open(prefix);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kNotFound);
    EXPECT_NE(a.status().message().find("missing_bin.bin"), std::string::npos);
    auto b = IndexedDataset::open(temp_dir() + "/nothing_here");
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("nothing_here.idx"), std::string::npos);
}

TEST(IndexedDataset, ShortDocIdxIsAWarningAndMultimodalModesAreAccepted) {
    // GPT-NeoX's merge_datasets.py: sizes extended, doc_idx not.
    const std::string prefix = small_dataset("merged");
    std::string idx = read_bytes(prefix + ".idx");
    put<uint64_t>(idx, 26, 2);  // doc_idx = [0, 1]
    idx.resize(idx.size() - 16);
    write_bytes(prefix + ".idx", idx);
    auto ds = IndexedDataset::open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    EXPECT_EQ(ds->document_count(), 1u);
    ASSERT_EQ(ds->warnings().size(), 1u);
    EXPECT_NE(ds->warnings()[0].find("doc_idx ends at sequence 1 of 4"), std::string::npos);

    const std::string mm = small_dataset("multimodal");
    std::string mm_idx = read_bytes(mm + ".idx");
    mm_idx += std::string(4, '\0');  // one int8 mode per sequence
    write_bytes(mm + ".idx", mm_idx);
    auto m = IndexedDataset::open(mm);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_TRUE(m->has_sequence_modes());
}

TEST(IndexedDataset, EmptyDatasetRoundTrips) {
    const std::string prefix = write_dataset("empty", TokenDType::kUInt16, {});
    auto ds = IndexedDataset::open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    EXPECT_EQ(ds->document_count(), 0u);
    EXPECT_EQ(ds->sequence_count(), 0u);
    EXPECT_EQ(ds->bin_bytes(), 0u);
}

}  // namespace
}  // namespace lathe
