// LLaMA-Factory alpaca and sharegpt records mapped onto chat messages (every field, the tag
// options, each kind of bad record), and `prepare` of such records with the shared Llama-3
// tokenizer: JSONL and a JSON array give the same files, bad records are counted per problem, and
// the conversations pack several to a training sample with per-document boundaries.
#include "data/sft_records.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/temp_files_test_util.h"
#include "data/gpt2_dataset.h"
#include "data/prepare.h"

namespace lathe {
namespace {

using Json = nlohmann::ordered_json;

const std::string kLlama3 = std::string(LATHE_SHARED_DIR) + "/tokenizers/llama3.json";

Json msg(const char* role, const char* content) {
    return Json{{"role", role}, {"content", content}};
}

Json alpaca(const char* record, RecordProblem* problem = nullptr, std::string* error = nullptr) {
    Json messages;
    RecordProblem p = RecordProblem::kText;
    const Status s = alpaca_to_messages(Json::parse(record), messages, p);
    if (problem != nullptr) *problem = s.ok() ? RecordProblem::kText : p;
    if (error != nullptr) *error = s.ok() ? "" : s.message();
    return s.ok() ? messages : Json();
}

Json sharegpt(const char* record, const SharegptTags& tags = {}, RecordProblem* problem = nullptr,
              std::string* error = nullptr, const std::string& key = "conversations") {
    Json messages;
    RecordProblem p = RecordProblem::kText;
    const Status s = sharegpt_to_messages(Json::parse(record), key, tags, messages, p);
    if (problem != nullptr) *problem = s.ok() ? RecordProblem::kText : p;
    if (error != nullptr) *error = s.ok() ? "" : s.message();
    return s.ok() ? messages : Json();
}

TEST(SftRecords, AlpacaMapsSystemHistoryInstructionAndInput) {
    EXPECT_EQ(alpaca(R"({"instruction": "Add.", "input": "2 3", "output": "5",
                         "system": "Be exact.", "history": [["Hi", "Hello"], ["1+1?", "2"]]})"),
              Json::array({msg("system", "Be exact."), msg("user", "Hi"), msg("assistant", "Hello"),
                           msg("user", "1+1?"), msg("assistant", "2"), msg("user", "Add.\n2 3"),
                           msg("assistant", "5")}));
    // An empty or absent input leaves the instruction alone; an empty instruction, the input.
    EXPECT_EQ(alpaca(R"({"instruction": "Say hi.", "input": "", "output": "hi"})"),
              Json::array({msg("user", "Say hi."), msg("assistant", "hi")}));
    EXPECT_EQ(alpaca(R"({"instruction": "Say hi.", "output": "hi", "history": null})"),
              Json::array({msg("user", "Say hi."), msg("assistant", "hi")}));
    EXPECT_EQ(alpaca(R"({"instruction": "", "input": "x", "output": "y", "system": ""})"),
              Json::array({msg("user", "x"), msg("assistant", "y")}));
    EXPECT_EQ(alpaca(R"({"instruction": "q", "output": "a", "history": []})"),
              Json::array({msg("user", "q"), msg("assistant", "a")}));
}

TEST(SftRecords, AlpacaBadRecordsNameTheFieldAndProblem) {
    struct Case {
        const char* record;
        RecordProblem problem;
        const char* says;
    };
    const Case cases[] = {
        {R"({"instruction": "q"})", RecordProblem::kMissingField, "no \"output\" field"},
        {R"({"instruction": "q", "output": null})", RecordProblem::kMissingField,
         "no \"output\" field"},
        {R"({"output": "a"})", RecordProblem::kMissingField, "no \"instruction\" field"},
        {R"({"instruction": "", "input": "", "output": "a"})", RecordProblem::kEmpty,
         "empty prompt"},
        {R"({"instruction": "q", "output": ""})", RecordProblem::kEmpty, "empty \"output\""},
        {R"({"instruction": "q", "output": 5})", RecordProblem::kWrongType,
         "field \"output\" is a number, expected a string"},
        {R"({"instruction": ["q"], "output": "a"})", RecordProblem::kWrongType,
         "field \"instruction\" is an array"},
        {R"({"instruction": "q", "output": "a", "system": 1})", RecordProblem::kWrongType,
         "field \"system\""},
        {R"({"instruction": "q", "output": "a", "history": "hi"})", RecordProblem::kWrongType,
         "field \"history\" is a string"},
        {R"({"instruction": "q", "output": "a", "history": [["a", "b"], ["c"]]})",
         RecordProblem::kWrongType,
         "history[1] is not a [prompt, response] pair of strings (it "
         "is an array of 1)"},
        {R"({"instruction": "q", "output": "a", "history": [["a", "b", "c"]]})",
         RecordProblem::kWrongType, "history[0] is not a [prompt, response] pair"},
        {R"({"instruction": "q", "output": "a", "history": [["a", 2]]})", RecordProblem::kWrongType,
         "history[0] is not a [prompt, response] pair"},
        {R"({"instruction": "q", "output": "a", "history": [["a", ""]]})", RecordProblem::kEmpty,
         "history[0] has an empty response"},
    };
    for (const Case& c : cases) {
        RecordProblem p;
        std::string error;
        EXPECT_TRUE(alpaca(c.record, &p, &error).is_null()) << c.record;
        EXPECT_EQ(p, c.problem) << c.record << ": " << error;
        EXPECT_NE(error.find(c.says), std::string::npos) << c.record << ": " << error;
    }
}

TEST(SftRecords, SharegptMapsTagsToRoles) {
    EXPECT_EQ(sharegpt(R"({"conversations": [
                  {"from": "system", "value": "Be brief."},
                  {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                  {"from": "user", "value": "Weather?"},
                  {"from": "function_call", "value": "{\"name\": \"weather\"}"},
                  {"from": "observation", "value": "sunny"},
                  {"from": "assistant", "value": "Sunny."}]})"),
              Json::array({msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello"),
                           msg("user", "Weather?"), msg("assistant", "{\"name\": \"weather\"}"),
                           msg("tool", "sunny"), msg("assistant", "Sunny.")}));
    // The system column serves when the first turn is not a system turn; a system turn wins.
    EXPECT_EQ(sharegpt(R"({"system": "Sys.", "conversations": [
                  {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"),
              Json::array({msg("system", "Sys."), msg("user", "q"), msg("assistant", "a")}));
    EXPECT_EQ(sharegpt(R"({"system": "Column.", "conversations": [
                  {"from": "system", "value": "Turn."},
                  {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"),
              Json::array({msg("system", "Turn."), msg("user", "q"), msg("assistant", "a")}));
    // An empty system turn adds no system message.
    EXPECT_EQ(sharegpt(R"({"conversations": [{"from": "system", "value": ""},
                  {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"),
              Json::array({msg("user", "q"), msg("assistant", "a")}));
}

TEST(SftRecords, SharegptRoleTagsRenameKeysAndTags) {
    SharegptTags tags;
    ASSERT_TRUE(sharegpt_tags_parse("role_tag=role,content_tag=content,user_tag=Q|asker,"
                                    "assistant_tag=A,system_tag=rules",
                                    tags)
                    .ok());
    EXPECT_EQ(sharegpt(R"({"messages": [{"role": "rules", "content": "r"},
                  {"role": "Q", "content": "q1"}, {"role": "A", "content": "a1"},
                  {"role": "asker", "content": "q2"}, {"role": "A", "content": "a2"}]})",
                       tags, nullptr, nullptr, "messages"),
              Json::array({msg("system", "r"), msg("user", "q1"), msg("assistant", "a1"),
                           msg("user", "q2"), msg("assistant", "a2")}));
    // The defaults of a renamed role are gone.
    RecordProblem p;
    std::string error;
    EXPECT_TRUE(sharegpt(R"({"messages": [{"role": "human", "content": "q"},
                  {"role": "A", "content": "a"}]})",
                         tags, &p, &error, "messages")
                    .is_null());
    EXPECT_EQ(p, RecordProblem::kUnknownRole) << error;
    EXPECT_NE(error.find("messages[0]: unknown role \"human\" (user: Q|asker, assistant: A"),
              std::string::npos)
        << error;

    for (const char* bad : {"user_tag", "user_tag=", "=x", "speaker=x", "role_tag=a|b",
                            "user_tag=x,assistant_tag=x", "user_tag=|"}) {
        SharegptTags t;
        const Status s = sharegpt_tags_parse(bad, t);
        EXPECT_FALSE(s.ok()) << bad;
        EXPECT_NE(s.message().find("--role-tags"), std::string::npos) << s.message();
    }
}

TEST(SftRecords, SharegptBadRecordsNameTheTurnAndProblem) {
    struct Case {
        const char* record;
        RecordProblem problem;
        const char* says;
    };
    const Case cases[] = {
        {R"({"messages": []})", RecordProblem::kMissingField, "no \"conversations\" field"},
        {R"({"conversations": {}})", RecordProblem::kWrongType,
         "field \"conversations\" is an object"},
        {R"({"conversations": []})", RecordProblem::kEmpty, "empty conversation"},
        {R"({"conversations": [{"from": "system", "value": "s"}]})", RecordProblem::kEmpty,
         "only a system turn"},
        {R"({"conversations": ["hi"]})", RecordProblem::kWrongType, "conversations[0] is a string"},
        {R"({"conversations": [{"value": "q"}]})", RecordProblem::kMissingField,
         "conversations[0] has no \"from\""},
        {R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt"}]})",
         RecordProblem::kMissingField, "conversations[1] has no \"value\""},
        {R"({"conversations": [{"from": "human", "value": ["q"]}]})", RecordProblem::kWrongType,
         "conversations[0].value is an array"},
        {R"({"conversations": [{"from": "bot", "value": "q"}]})", RecordProblem::kUnknownRole,
         "conversations[0]: unknown from \"bot\""},
        {R"({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]})",
         RecordProblem::kRoleOrder, "conversations[0]: \"gpt\" where a user turn belongs"},
        {R"({"conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q"},
             {"from": "gpt", "value": "a"}]})",
         RecordProblem::kRoleOrder, "conversations[1]: \"human\" where an assistant turn belongs"},
        {R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
             {"from": "human", "value": "q2"}]})",
         RecordProblem::kRoleOrder, "ends with a user-side turn"},
        {R"({"conversations": [{"from": "human", "value": "q"}, {"from": "system", "value": "s"}]})",
         RecordProblem::kRoleOrder, "conversations[1]: a \"system\" turn after the first turn"},
        {R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}]})",
         RecordProblem::kEmpty, "conversations[1]: empty \"value\""},
        {R"({"system": 3, "conversations": [{"from": "human", "value": "q"},
             {"from": "gpt", "value": "a"}]})",
         RecordProblem::kWrongType, "field \"system\" is a number"},
    };
    for (const Case& c : cases) {
        RecordProblem p;
        std::string error;
        EXPECT_TRUE(sharegpt(c.record, {}, &p, &error).is_null()) << c.record;
        EXPECT_EQ(p, c.problem) << c.record << ": " << error;
        EXPECT_NE(error.find(c.says), std::string::npos) << c.record << ": " << error;
    }
}

// ---------------------------------------------------------------------------------------------
// prepare with alpaca and sharegpt input

// Files of this test program under the temporary directory (core/temp_files_test_util.h).
const testutil::TempFiles& temp() {
    static const testutil::TempFiles files("lathe_sft_records_test");
    return files;
}

PrepareOptions sft_options(const std::string& input, const std::string& name,
                           PrepareFormat format) {
    PrepareOptions o;
    o.tokenizer_path = kLlama3;
    o.inputs = {input};
    o.output_prefix = temp().path(name);
    o.format = format;
    o.threads = 2;
    o.batch_bytes = 200;  // several batches, so that order across workers matters
    o.show_progress = false;
    return o;
}

std::vector<Json> alpaca_records(int n) {
    std::vector<Json> out;
    for (int i = 0; i < n; ++i) {
        Json r = {{"instruction", "Count to " + std::to_string(i % 7 + 1) + "."},
                  {"input", i % 3 == 0 ? "" : "in words"},
                  {"output", "Counting " + std::to_string(i) + " done."}};
        if (i % 4 == 1) r["system"] = "You count.";
        if (i % 5 == 2) r["history"] = Json::array({Json::array({"Ready?", "Yes."})});
        out.push_back(r);
    }
    return out;
}

TEST(SftPrepare, JsonlAndJsonArrayGiveTheSameFiles) {
    ASSERT_TRUE(std::filesystem::exists(kLlama3))
        << "no " << kLlama3 << " (required test data: ../shared, scripts/install-deps.sh)";
    const std::vector<Json> records = alpaca_records(20);
    std::string jsonl;
    for (const Json& r : records) jsonl += r.dump() + "\n";
    const Json array(records);
    const std::string a = temp().write("a.jsonl", jsonl);
    const std::string b = temp().write("b.json", "\n  " + array.dump(2) + "\n");
    auto ra = prepare_run(sft_options(a, "a", PrepareFormat::kAlpaca));
    ASSERT_TRUE(ra.ok()) << ra.status().to_string();
    auto rb = prepare_run(sft_options(b, "b", PrepareFormat::kAlpaca));
    ASSERT_TRUE(rb.ok()) << rb.status().to_string();
    EXPECT_EQ(ra->documents, 20u);
    EXPECT_EQ(rb->documents, 20u);
    EXPECT_EQ(ra->format, PrepareFormat::kAlpaca);
    for (const char* suffix : {".bin", ".idx", "_label.bin", "_label.idx"}) {
        EXPECT_EQ(testutil::read_whole_file(temp().path("a" + std::string(suffix))),
                  testutil::read_whole_file(temp().path("b" + std::string(suffix))))
            << suffix;
    }
    // An array input's bad record is named by its index.
    Json bad = array;
    bad[3].erase("output");
    const std::string c = temp().write("c.json", bad.dump());
    auto rc = prepare_run(sft_options(c, "c", PrepareFormat::kAlpaca));
    ASSERT_FALSE(rc.ok());
    EXPECT_NE(rc.status().message().find(c + "[3]: no \"output\" field"), std::string::npos)
        << rc.status().message();
    // A broken array is an error of the whole input.
    const std::string d = temp().write("d.json", "[{\"instruction\": \"q\", \"output\": \"a\"},");
    auto rd = prepare_run(sft_options(d, "d", PrepareFormat::kAlpaca));
    ASSERT_FALSE(rd.ok());
    EXPECT_NE(rd.status().message().find("starts with '[' but is not valid JSON"),
              std::string::npos)
        << rd.status().message();
}

TEST(SftPrepare, SkippedRecordsAreCountedPerProblem) {
    const std::string input = temp().write(
        "mixed.jsonl",
        R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"
        "\n"
        R"({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]})"
        "\n"
        R"({"conversations": [{"from": "human", "value": "q"}]})"
        "\n"
        R"({"conversations": [{"from": "bot", "value": "q"}, {"from": "gpt", "value": "a"}]})"
        "\n"
        R"({"dialog": []})"
        "\n"
        "{not json\n"
        R"({"conversations": [{"from": "human", "value": "a long question, )"
        R"(a long question, a long question"}, {"from": "gpt", "value": "ok"}]})"
        "\n");
    PrepareOptions o = sft_options(input, "mixed", PrepareFormat::kSharegpt);
    o.max_tokens = 20;
    o.on_error = OnError::kSkip;
    auto r = prepare_run(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->documents, 1u);
    EXPECT_EQ(r->skipped, 6u);
    const std::map<std::string, uint64_t> expected = {{"role order", 2},
                                                      {"unknown role", 1},
                                                      {"missing field", 1},
                                                      {"not JSON", 1},
                                                      {"too long", 1}};
    EXPECT_EQ(r->skipped_by_problem, expected);
    // Under kFail the first bad record stops the run, named by file and line.
    o.on_error = OnError::kFail;
    auto f = prepare_run(o);
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.status().message().find(input + ":2: conversations[0]: \"gpt\" where a user"),
              std::string::npos)
        << f.status().message();
    // Plain JSONL records are counted by problem too.
    const std::string plain_input =
        temp().write("plain.jsonl",
                     "{\"text\": \"fine\"}\n{\"text\": \n{\"body\": \"x\"}\n"
                     "{\"text\": 3}\n[1]\n{\"text\": \"\"}\n");
    PrepareOptions counted = sft_options(plain_input, "counted", PrepareFormat::kJsonl);
    counted.on_error = OnError::kSkip;
    auto c = prepare_run(counted);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->documents, 1u);
    const std::map<std::string, uint64_t> plain_expected = {
        {"not JSON", 1}, {"missing field", 1}, {"wrong type", 2}, {"empty", 1}};
    EXPECT_EQ(c->skipped_by_problem, plain_expected);
    // --seq-length is for conversation formats only.
    PrepareOptions plain = sft_options(input, "plain", PrepareFormat::kJsonl);
    plain.max_tokens = 20;
    auto p = prepare_run(plain);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("--seq-length applies to conversation formats"),
              std::string::npos);
}

TEST(SftPrepare, ConversationsPackIntoSamplesWithTheirOwnBoundariesAndLabels) {
    const std::vector<Json> records = alpaca_records(12);
    std::string jsonl;
    for (const Json& r : records) jsonl += r.dump() + "\n";
    const std::string input = temp().write("pack.jsonl", jsonl);
    auto run = prepare_run(sft_options(input, "pack", PrepareFormat::kAlpaca));
    ASSERT_TRUE(run.ok()) << run.status().to_string();
    auto tokens = open_indexed_token_documents(temp().path("pack"));
    ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
    auto labels = open_indexed_token_documents(temp().path("pack_label"));
    ASSERT_TRUE(labels.ok()) << labels.status().to_string();
    const std::span<const int32_t> sizes = (*tokens)->sizes();
    ASSERT_EQ(sizes.size(), 12u);
    std::vector<std::vector<int32_t>> doc_ids(12), doc_labels(12);
    int64_t total = 0;
    for (size_t d = 0; d < 12; ++d) {
        doc_ids[d].resize(size_t(sizes[d]));
        doc_labels[d].resize(size_t(sizes[d]));
        ASSERT_TRUE((*tokens)->read(int64_t(d), 0, doc_ids[d]).ok());
        ASSERT_TRUE((*labels)->read(int64_t(d), 0, doc_labels[d]).ok());
        total += sizes[d];
    }

    // Samples of 128 tokens: each conversation here has fewer, so samples hold several.
    IndexMappingRequest req;
    req.name = "train";
    req.data_prefix = temp().path("pack");
    req.documents = {0, 12};
    req.num_samples = total / 128;
    req.seq_length = 128;
    req.seed = 1234;
    auto ds = Gpt2Dataset::create(req, **tokens, &**labels, false);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    Sample s;
    int64_t whole_documents = 0;
    for (int64_t i = 0; i < (*ds)->size(); ++i) {
        ASSERT_TRUE((*ds)->get(s, i).ok());
        ASSERT_GE(s.documents.size(), 2u) << "sample " << i << " holds one conversation";
        for (size_t k = 0; k < s.documents.size(); ++k) {
            const DocumentSegment& seg = s.documents[k];
            const std::vector<int32_t>& ids = doc_ids[size_t(seg.document)];
            const std::vector<int32_t>& lab = doc_labels[size_t(seg.document)];
            // The first stretch may continue a conversation of the previous sample (its tail);
            // every later one starts its conversation.
            const int64_t offset = k == 0 ? int64_t(ids.size()) - seg.length : 0;
            if (k > 0 && k + 1 < s.documents.size()) {
                ASSERT_EQ(seg.length, int64_t(ids.size())) << "sample " << i;
                ++whole_documents;
            }
            for (int64_t t = 0; t < seg.length; ++t) {
                ASSERT_EQ(s.tokens[size_t(seg.start + t)], ids[size_t(offset + t)])
                    << "sample " << i << " document " << seg.document << " token " << t;
                ASSERT_EQ(s.labels[size_t(seg.start + t)], lab[size_t(offset + t)])
                    << "sample " << i << " document " << seg.document << " token " << t;
            }
        }
    }
    EXPECT_GT(whole_documents, 0);
}

}  // namespace
}  // namespace lathe
