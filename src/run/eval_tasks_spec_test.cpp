#include "run/eval_tasks_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace lathe {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The expected values are CPython 3.11's: random.Random(seed).getrandbits(32) and
// random.Random(seed).sample(range(n), k), run once and written here.
TEST(EvalTasksPyRandom, MatchesPythonWords) {
    PyRandom r(1234);
    EXPECT_EQ(r.next_u32(), 4150886329u);
    EXPECT_EQ(r.next_u32(), 3342196574u);
    EXPECT_EQ(r.next_u32(), 1892932127u);
    EXPECT_EQ(PyRandom(0).next_u32(), 3626764237u);
}

TEST(EvalTasksPyRandom, SampleMatchesPythonInBothBranches) {
    PyRandom r(1234);
    // n = 100 > 21: the branch with a set of picked indices; n = 10: the shrinking pool.
    EXPECT_EQ(r.sample(100, 3), (std::vector<int64_t>{99, 56, 14}));
    EXPECT_EQ(r.sample(10, 4), (std::vector<int64_t>{0, 1, 9, 5}));
    EXPECT_EQ(r.sample(1000, 8), (std::vector<int64_t>{709, 85, 100, 784, 363, 242, 17, 31}));
    // A negative seed seeds with |seed|; a seed above 2^32 with two words.
    EXPECT_EQ(PyRandom(-7).sample(30, 6), (std::vector<int64_t>{10, 4, 12, 20, 1, 2}));
    EXPECT_EQ(PyRandom((int64_t(1) << 40) + 5).sample(50, 2), (std::vector<int64_t>{32, 33}));
}

TEST(EvalTasksTemplate, RendersFieldsPathsAndJoin) {
    const ojson rec = ojson::parse(
        R"({"q": "Why?", "n": 3, "b": true, "z": null, "xs": ["a", "b"], "o": {"k": ["x", "y"]}})");
    EXPECT_EQ(*eval_template_render("Q: {{q}} {{ n }} {{b}} {{z}}", rec), "Q: Why? 3 True None");
    EXPECT_EQ(*eval_template_render("{{xs|join}}/{{ xs | join(', ') }}", rec), "ab/a, b");
    EXPECT_EQ(*eval_template_render("{{o.k[1]}}{{xs[0]}}", rec), "ya");
    EXPECT_FALSE(eval_template_render("{{missing}}", rec).ok());
    EXPECT_FALSE(eval_template_render("{{xs}}", rec).ok());  // a list needs join
    EXPECT_FALSE(eval_template_render("{{xs[2]}}", rec).ok());
    EXPECT_FALSE(eval_template_render("{{q", rec).ok());
    EXPECT_FALSE(eval_template_render("{{xs|upper}}", rec).ok());
}

class EvalTasksFiles : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("lathe_eval_tasks_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        write("d.jsonl",
              "{\"t\": \"one\", \"c\": [\"x\", \"y\"], \"a\": 1}\n"
              "{\"t\": \"two\", \"c\": [\"x\", \"y\"], \"a\": \"x\"}\n"
              "{\"t\": \"three\", \"c\": [\"x\", \"y\"], \"a\": 0}\n");
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string write(const std::string& name, const std::string& text) {
        std::ofstream(dir_ / name) << text;
        return (dir_ / name).string();
    }
    fs::path dir_;
};

TEST_F(EvalTasksFiles, BuildsContextsAsLmEval) {
    const std::string f = write("t.yaml",
                                "name: t\nkind: multiple_choice\ndata: d.jsonl\n"
                                "doc_to_text: \"Q: {{t}}\"\ndoc_to_choice: c\ndoc_to_target: a\n"
                                "num_fewshot: 1\nfewshot_sampler: first_n\ndescription: \"D. \"\n");
    auto spec = eval_task_load(f);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    auto recs = eval_task_read_records(spec->data);
    ASSERT_TRUE(recs.ok());
    auto docs = eval_task_build(*spec, *recs, *recs, true);
    ASSERT_TRUE(docs.ok()) << docs.status().message();
    ASSERT_EQ(docs->size(), 3u);
    // first_n without the record itself; the shot's answer is choices[a] or the target string.
    EXPECT_EQ((*docs)[0].context, "D. Q: two x\n\nQ: one");
    EXPECT_EQ((*docs)[1].context, "D. Q: one y\n\nQ: two");
    EXPECT_EQ((*docs)[0].gold, 1);
    EXPECT_EQ((*docs)[1].gold, 0);  // "x" is choice 0
}

TEST_F(EvalTasksFiles, ErrorsNameFileLineAndKey) {
    auto msg = [&](const std::string& yaml) {
        auto r = eval_task_load(write("bad.yaml", yaml));
        EXPECT_FALSE(r.ok());
        return r.ok() ? std::string() : r.status().message();
    };
    const std::string base =
        "name: t\nkind: multiple_choice\ndata: d.jsonl\ndoc_to_text: x\n"
        "doc_to_choice: c\ndoc_to_target: a\n";
    std::string m = msg(base + "num_fewshots: 2\n");
    EXPECT_NE(m.find("bad.yaml:7: unknown key 'num_fewshots'"), std::string::npos) << m;
    m = msg(base + "num_fewshot: -1\n");
    EXPECT_NE(m.find("bad.yaml:7: key 'num_fewshot' must be >= 0"), std::string::npos) << m;
    m = msg(base + "num_fewshot: two\n");
    EXPECT_NE(m.find("bad.yaml:7: key 'num_fewshot' must be an integer"), std::string::npos) << m;
    m = msg("name: t\nkind: choice\ndata: d.jsonl\ndoc_to_text: x\ndoc_to_target: a\n");
    EXPECT_NE(m.find("bad.yaml:2: key 'kind' is 'choice'"), std::string::npos) << m;
    m = msg("name: t\nkind: generate\ndata: d.jsonl\ndoc_to_text: x\n");
    EXPECT_NE(m.find("missing required key 'doc_to_target'"), std::string::npos) << m;
    m = msg("name: t\nkind: generate\ndata: nope.jsonl\ndoc_to_text: x\ndoc_to_target: a\n");
    EXPECT_NE(m.find("bad.yaml:3: key 'data': no file"), std::string::npos) << m;
    m = msg(base + "until: [x]\n");
    EXPECT_NE(m.find("bad.yaml:7: key 'until' applies to kind generate only"), std::string::npos)
        << m;
    m = msg("name: [t\n");
    EXPECT_NE(m.find("not valid YAML"), std::string::npos) << m;

    // A record whose target is outside its choices: the data file and the record.
    write("e.jsonl",
          "{\"t\": \"one\", \"c\": [\"x\"], \"a\": 0}\n{\"t\": \"two\", \"c\": [\"x\"], "
          "\"a\": 4}\n");
    auto spec = eval_task_load(write("e.yaml",
                                     "name: t\nkind: multiple_choice\ndata: e.jsonl\n"
                                     "doc_to_text: x\ndoc_to_choice: c\ndoc_to_target: a\n"));
    ASSERT_TRUE(spec.ok());
    auto recs = eval_task_read_records(spec->data);
    ASSERT_TRUE(recs.ok());
    auto docs = eval_task_build(*spec, *recs, *recs, true);
    ASSERT_FALSE(docs.ok());
    EXPECT_NE(docs.status().message().find("e.jsonl: record 2"), std::string::npos)
        << docs.status().message();
    EXPECT_NE(docs.status().message().find("target index 4 is outside the 1 choices"),
              std::string::npos)
        << docs.status().message();
    // A .jsonl line that is not an object.
    auto bad = eval_task_read_records(write("f.jsonl", "{\"a\": 1}\n[1, 2]\n"));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("f.jsonl:2:"), std::string::npos);
}

// Llama-3's vocabulary at 4096 tokens is 2.1 GB of f32 logits per request: one per call; short
// requests fill the budget up to --batch-size.
TEST(EvalTasksLogitsRows, BoundsTheHostLogitsBuffer) {
    const int64_t V = 128256;
    EXPECT_EQ(eval_tasks_logits_rows(8, 4096, V, kEvalTasksLogitsBudget), 1);
    EXPECT_EQ(eval_tasks_logits_rows(8, 512, V, kEvalTasksLogitsBudget), 4);  // 263 MB each
    EXPECT_EQ(eval_tasks_logits_rows(8, 64, V, kEvalTasksLogitsBudget), 8);
    for (int64_t T : {1, 100, 1000, 4096, 100000}) {
        const int64_t rows = eval_tasks_logits_rows(8, T, V, kEvalTasksLogitsBudget);
        EXPECT_GE(rows, 1);
        EXPECT_LE(rows, 8);
        EXPECT_LE(rows * T * V * 4, std::max(kEvalTasksLogitsBudget, T * V * 4)) << T;
    }
    EXPECT_EQ(eval_tasks_logits_rows(3, 10, 10, 0), 1);
    EXPECT_EQ(eval_tasks_logits_rows(3, 10, 10, 400), 1);
    EXPECT_EQ(eval_tasks_logits_rows(3, 10, 10, 799), 1);
    EXPECT_EQ(eval_tasks_logits_rows(3, 10, 10, 800), 2);
}

}  // namespace
}  // namespace lathe
