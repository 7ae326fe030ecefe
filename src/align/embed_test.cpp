#include "align/embed.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "align/cooccur.h"
#include "align/embed_test_util.h"
#include "align/vectors.h"
#include "ops/device_info.h"

namespace lathe {
namespace {

EmbedOptions small_options(const std::string& tokens, const std::string& output,
                           EmbedMethod method) {
    EmbedOptions o;
    o.tokens = tokens;
    o.output = output;
    o.method = method;
    o.dim = 8;
    o.window = 3;
    o.min_count = 2;
    o.iters = 3;
    o.threads = 2;
    o.device = EmbedDevice::kCpu;
    return o;
}

TEST(Embed, WritesOneVectorPerVocabularyTokenAndResumes) {
    const auto docs = embedtest::zipf_docs(200, 30, 120, 9);
    const auto data = embedtest::write_docs("embed_stage", docs);
    for (EmbedMethod method : {EmbedMethod::kGlove, EmbedMethod::kSgns}) {
        const std::string out =
            embedtest::temp_dir() + "/vectors_" + embed_method_name(method) + ".txt";
        EmbedOptions o = small_options(data.prefix(), out, method);
        auto first = embed_tokens(o);
        ASSERT_TRUE(first.ok()) << first.status().to_string();
        EXPECT_FALSE(first->skipped);
        EXPECT_EQ(first->documents, 200);
        auto vectors = vectors_read_text(out);
        ASSERT_TRUE(vectors.ok()) << vectors.status().to_string();
        EXPECT_EQ(vectors->dim, 8);
        EXPECT_EQ(vectors->size(), first->vocab);
        // Exactly the ids seen at least min_count times, most frequent first.
        auto vocab = embed_count_vocab(data, 2, 1);
        ASSERT_TRUE(vocab.ok());
        EXPECT_EQ(vectors->ids, vocab->token_of_row);

        // Unchanged inputs and settings: skipped, file untouched.
        const auto mtime = std::filesystem::last_write_time(out);
        auto again = embed_tokens(o);
        ASSERT_TRUE(again.ok());
        EXPECT_TRUE(again->skipped);
        EXPECT_EQ(std::filesystem::last_write_time(out), mtime);
        // Threads and device do not change what is computed: still up to date.
        o.threads = 1;
        EXPECT_TRUE(embed_tokens(o)->skipped);
        // A setting that changes the result runs again.
        o.dim = 6;
        auto rerun = embed_tokens(o);
        ASSERT_TRUE(rerun.ok());
        EXPECT_FALSE(rerun->skipped);
        EXPECT_EQ(vectors_read_text(out)->dim, 6);
    }
}

TEST(Embed, BadSettingsAndInputsAreClearErrors) {
    const auto data = embedtest::write_docs("embed_bad", {{1, 2, 3}, {1, 2}});
    const std::string out = embedtest::temp_dir() + "/bad.txt";
    struct Case {
        std::function<void(EmbedOptions&)> edit;
        const char* expect;
    };
    const Case cases[] = {
        {[](EmbedOptions& o) { o.dim = 0; }, "--dim 0"},
        {[](EmbedOptions& o) { o.iters = 0; }, "--iters 0"},
        {[](EmbedOptions& o) { o.min_count = 0; }, "--min-count 0"},
        {[](EmbedOptions& o) { o.x_max = -1; }, "--x-max"},
        {[](EmbedOptions& o) { o.min_count = 50; }, "lower --min-count"},
        {[](EmbedOptions& o) { o.tokens += "_missing"; }, "_missing"},
    };
    for (const Case& c : cases) {
        EmbedOptions o = small_options(data.prefix(), out, EmbedMethod::kGlove);
        c.edit(o);
        auto r = embed_tokens(o);
        ASSERT_FALSE(r.ok()) << c.expect;
        EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
            << r.status().message() << " (wanted: " << c.expect << ")";
    }
    EXPECT_FALSE(embed_method_from_name("word2vec").ok());
    EXPECT_FALSE(embed_device_from_name("gpu").ok());
    if (gpu_environment_probe(0).devices.empty()) {  // CI: --device cuda is an error
        EmbedOptions o = small_options(data.prefix(), out, EmbedMethod::kGlove);
        o.device = EmbedDevice::kCuda;
        auto r = embed_tokens(o);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find("--device cuda"), std::string::npos);
    }
}

}  // namespace
}  // namespace lathe
