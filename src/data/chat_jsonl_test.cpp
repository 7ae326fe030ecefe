// chat_jsonl_run with the shared Qwen3 tokenizer and template: render and encode write what
// ChatTemplate gives for each line, a line's chat_template_kwargs override the run's, a template
// file replaces the config's, and a bad line is an error naming the file and line.
#include "data/chat_jsonl.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/temp_files_test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

using Json = nlohmann::ordered_json;

const std::string kShared = LATHE_SHARED_DIR;
const std::string kQwen3 = kShared + "/tokenizers/qwen3.json";
const std::string kQwen3Config = kShared + "/tokenizers/qwen3.tokenizer_config.json";

const testutil::TempFiles kTemp("lathe_chat_jsonl_test");

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<std::string> out;
    for (std::string line; std::getline(f, line);) out.push_back(line);
    return out;
}

const Json kConversation = Json::parse(
    R"([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}])");

ChatJsonlOptions options(const std::string& input, const std::string& output) {
    ChatJsonlOptions o;
    o.tokenizer_config = kQwen3Config;
    o.tokenizer = kQwen3;
    o.input = input;
    o.output = output;
    return o;
}

TEST(ChatJsonl, RenderWritesTheTemplatesTextWithKwargs) {
    ASSERT_TRUE(std::filesystem::exists(kQwen3Config)) << "no " << kQwen3Config;
    const std::string in = kTemp.write(
        "render.jsonl",
        Json{{"messages", kConversation}}.dump() + "\n" +
            Json{{"messages", kConversation}, {"chat_template_kwargs", {{"enable_thinking", true}}}}
                .dump() +
            "\n");
    ChatJsonlOptions o = options(in, kTemp.path("render_out.jsonl"));
    o.kwargs = R"({"enable_thinking": false})";
    o.add_generation_prompt = true;
    Status s = chat_jsonl_run(o, ChatJsonlMode::kRender);
    ASSERT_TRUE(s.ok()) << s.message();

    auto tmpl = chat_jsonl_load_template(o);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    const auto off = tmpl->render(kConversation, true, nullptr, Json{{"enable_thinking", false}});
    const auto on = tmpl->render(kConversation, true, nullptr, Json{{"enable_thinking", true}});
    ASSERT_TRUE(off.ok() && on.ok());
    EXPECT_NE(*off, *on);  // the kwarg matters, so the override below is seen
    const std::vector<std::string> lines = read_lines(o.output);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(Json::parse(lines[0])["text"], *off);
    EXPECT_EQ(Json::parse(lines[1])["text"], *on);
    EXPECT_NE(off->find("<|im_start|>user\nWhat is 2+2?<|im_end|>"), std::string::npos) << *off;
}

TEST(ChatJsonl, EncodeWritesIdsAndLabels) {
    ASSERT_TRUE(std::filesystem::exists(kQwen3)) << "no " << kQwen3;
    const std::string in =
        kTemp.write("encode.jsonl", Json{{"messages", kConversation}}.dump() + "\n");
    ChatJsonlOptions o = options(in, kTemp.path("encode_out.jsonl"));
    Status s = chat_jsonl_run(o, ChatJsonlMode::kEncode);
    ASSERT_TRUE(s.ok()) << s.message();

    auto tok = Tokenizer::load(kQwen3);
    auto tmpl = chat_jsonl_load_template(o);
    ASSERT_TRUE(tok.ok() && tmpl.ok());
    ChatEncodeOptions eo;
    eo.append_eos = true;
    auto enc = tmpl->encode_with_labels(*tok, kConversation, eo);
    ASSERT_TRUE(enc.ok()) << enc.status().message();
    const std::vector<std::string> lines = read_lines(o.output);
    ASSERT_EQ(lines.size(), 1u);
    const Json got = Json::parse(lines[0]);
    EXPECT_EQ(got["ids"].get<std::vector<int32_t>>(), enc->ids);
    EXPECT_EQ(got["labels"].get<std::vector<int32_t>>(), enc->labels);
    EXPECT_NE(enc->ids, enc->labels);  // the user turn is masked
}

TEST(ChatJsonl, TemplateFileReplacesTheConfigs) {
    ASSERT_TRUE(std::filesystem::exists(kQwen3Config)) << "no " << kQwen3Config;
    ChatJsonlOptions o =
        options(kTemp.write("plain.jsonl", Json{{"messages", kConversation}}.dump() + "\n"),
                kTemp.path("plain_out.jsonl"));
    o.chat_template = kTemp.write(
        "plain.jinja", "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
    ASSERT_TRUE(chat_jsonl_run(o, ChatJsonlMode::kRender).ok());
    const std::vector<std::string> lines = read_lines(o.output);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(Json::parse(lines[0])["text"], "[user] What is 2+2?\n[assistant] 4\n");
}

TEST(ChatJsonl, BadLineNamesFileAndLine) {
    ASSERT_TRUE(std::filesystem::exists(kQwen3Config)) << "no " << kQwen3Config;
    const std::string in =
        kTemp.write("bad.jsonl", Json{{"messages", kConversation}}.dump() + "\n{\"msgs\": []}\n");
    ChatJsonlOptions o = options(in, kTemp.path("bad_out.jsonl"));
    std::filesystem::remove(o.output);
    Status s = chat_jsonl_run(o, ChatJsonlMode::kRender);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(), in + ":2: no 'messages' field");
    EXPECT_FALSE(std::filesystem::exists(o.output));

    o.kwargs = "[1]";
    s = chat_jsonl_run(o, ChatJsonlMode::kRender);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "--kwargs must be a JSON object, got: [1]");
}

}  // namespace
}  // namespace lathe
