// Tests of ChatTemplate: loading tokenizer_config.json, the variables a template sees, and SFT
// labels. Rendering parity with Python jinja2 over many conversations and the comparison of
// labels with GPT-NeoX's build_chat() are in tests/test_chat_template.py.

#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

using Json = nlohmann::ordered_json;

const std::string kShared = LATHE_SHARED_DIR;

ChatTemplate from(const Json& config) {
    auto t = ChatTemplate::from_config(config.dump(), "test_config.json");
    EXPECT_TRUE(t.ok()) << t.status().message();
    return std::move(t).value();
}

Json conv(std::initializer_list<std::pair<const char*, const char*>> turns) {
    Json m = Json::array();
    for (const auto& [role, content] : turns) m.push_back({{"role", role}, {"content", content}});
    return m;
}

TEST(ChatTemplateLoad, SeesMessagesToolsSpecialTokensAndKwargs) {
    const ChatTemplate t = from({
        {"bos_token", {{"content", "<s>"}, {"special", true}}},
        {"eos_token", "</s>"},
        {"pad_token", nullptr},
        {"additional_special_tokens", {"<a>", {{"content", "<b>"}}}},
        {"chat_template",
         "{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
         "{{ tools is none }}|{{ documents is none }}|{{ pad_token is defined }}|"
         "{{ additional_special_tokens|join }}|{{ add_generation_prompt }}|{{ flag|default('-') "
         "}}{{ eos_token }}"},
    });
    EXPECT_EQ(t.bos_token(), "<s>");
    EXPECT_EQ(t.eos_token(), "</s>");
    auto r = t.render(conv({{"user", "hi"}}), true);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(*r, "<s>user=hi;True|True|False|<a><b>|True|-</s>");
    r = t.render(conv({{"user", "hi"}}), false, Json::array({{{"name", "f"}}}), Json{{"flag", 7}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(*r, "<s>user=hi;False|True|False|<a><b>|False|7</s>");
    // Variables lathe sets itself cannot be overridden.
    r = t.render(conv({{"user", "hi"}}), false, nullptr, Json{{"messages", 1}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'messages'"), std::string::npos);
    // messages must be an array.
    EXPECT_FALSE(t.render(Json::object(), false).ok());
}

TEST(ChatTemplateLoad, NamedTemplatesAndToolUse) {
    const Json config = {{"chat_template",
                          {{{"name", "default"}, {"template", "default"}},
                           {{"name", "tool_use"}, {"template", "tool_use"}},
                           {{"name", "rag"}, {"template", "rag"}}}}};
    const ChatTemplate t = from(config);
    EXPECT_EQ(*t.render(conv({}), false), "default");
    // transformers picks "tool_use" when tools are given.
    EXPECT_EQ(*t.render(conv({}), false, Json::array()), "tool_use");
    auto rag = ChatTemplate::from_config(config.dump(), "c.json", "rag");
    ASSERT_TRUE(rag.ok());
    EXPECT_EQ(*rag->render(conv({}), false, Json::array()), "rag");
    auto missing = ChatTemplate::from_config(config.dump(), "c.json", "nope");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
    EXPECT_NE(missing.status().message().find("'tool_use'"), std::string::npos);
}

TEST(ChatTemplateLoad, ErrorsNameTheFileAndKey) {
    auto r = ChatTemplate::from_config("[1, 2]", "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("c.json"), std::string::npos);
    r = ChatTemplate::from_config(R"({"chat_template": 5})", "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("chat_template"), std::string::npos);
    r = ChatTemplate::from_config(R"({"eos_token": 5, "chat_template": "x"})", "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'eos_token'"), std::string::npos);
    r = ChatTemplate::from_config(R"({"chat_template": "{% for %}"})", "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("c.json:chat_template', line 1"), std::string::npos)
        << r.status().message();

    // The shared Llama-2 config has no template: the error says how to give one.
    r = ChatTemplate::load(kShared + "/tokenizers/llama2.tokenizer_config.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos);
}

TEST(ChatTemplateLoad, TemplateBesideTheConfigAndOverrides) {
    namespace fs = std::filesystem;
    const fs::path dir =
        fs::temp_directory_path() / ("lathe_chat_template_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n";
    auto t = ChatTemplate::load((dir / "tokenizer_config.json").string());
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(*t->render(conv({{"user", "a"}, {"assistant", "b"}}), false), "a</s>b</s>");
    // with_template keeps the special tokens.
    auto other = t->with_template("[{{ eos_token }}]", "override.jinja");
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(*other->render(conv({}), false), "[</s>]");
    EXPECT_EQ(other->name(), "override.jinja");
    fs::remove_all(dir);
}

class ChatLabels : public ::testing::Test {
protected:
    void SetUp() override {
        auto tok = Tokenizer::load(kShared + "/tokenizers/qwen3.json");
        ASSERT_TRUE(tok.ok()) << tok.status().message();
        tok_.emplace(std::move(tok).value());
        auto t = ChatTemplate::load(kShared + "/tokenizers/qwen3.tokenizer_config.json");
        ASSERT_TRUE(t.ok()) << t.status().message();
        tmpl_.emplace(std::move(t).value());
    }

    // The text of the tokens that keep loss.
    std::string kept_text(const ChatEncoding& e) {
        std::vector<int32_t> kept;
        for (size_t i = 0; i < e.ids.size(); ++i)
            if (e.labels[i] != kChatIgnoreLabel) kept.push_back(e.ids[i]);
        return *tok_->decode(kept, false);
    }

    std::optional<Tokenizer> tok_;
    std::optional<ChatTemplate> tmpl_;
};

TEST_F(ChatLabels, AssistantTurnsKeepLossAndNothingIsAppended) {
    const Json msgs = conv({{"system", "Be brief."},
                            {"user", "Hi"},
                            {"assistant", "Hello!"},
                            {"user", "Bye"},
                            {"assistant", "Bye!"}});
    auto e = tmpl_->encode_with_labels(*tok_, msgs);
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_EQ(e->ids.size(), e->labels.size());
    // The tokens are the full rendering's: qwen3's template ends each turn with <|im_end|>\n
    // itself, so no eos_token follows.
    const std::vector<int32_t> full = *tok_->encode(*tmpl_->render(msgs, false), false);
    EXPECT_EQ(e->ids, full);
    EXPECT_EQ(kept_text(*e), "Hello!<|im_end|>\n<think>\n\n</think>\n\nBye!<|im_end|>\n");
    for (size_t i = 0; i < e->ids.size(); ++i)
        EXPECT_TRUE(e->labels[i] == kChatIgnoreLabel || e->labels[i] == e->ids[i]);
}

TEST_F(ChatLabels, Options) {
    const Json msgs =
        conv({{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Bye!"}});
    ChatEncodeOptions only_last;
    only_last.only_last_turn = true;
    auto e = tmpl_->encode_with_labels(*tok_, msgs, only_last);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(kept_text(*e), "<think>\n\n</think>\n\nBye!<|im_end|>\n");

    ChatEncodeOptions no_eos;
    no_eos.append_eos = false;
    e = tmpl_->encode_with_labels(*tok_, msgs, no_eos);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ids, *tok_->encode(*tmpl_->render(msgs, false), false));

    ChatEncodeOptions no_mask;
    no_mask.mask = false;
    e = tmpl_->encode_with_labels(*tok_, msgs, no_mask);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->labels, e->ids);

    ChatEncodeOptions user_role;  // train on the user's turns instead
    user_role.generation_role = "user";
    e = tmpl_->encode_with_labels(*tok_, msgs, user_role);
    ASSERT_TRUE(e.ok());
    // The assistant turn's rendering ends with a generation prompt that starts like the next
    // user header; the shared "<|im_start|>" goes to the user turn, as the first one's does.
    EXPECT_EQ(kept_text(*e), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n");

    // A conversation ending with the user: nothing appended, the last turn has no loss.
    const Json ends_with_user = conv({{"user", "Hi"}, {"assistant", "Yo"}, {"user", "?"}});
    e = tmpl_->encode_with_labels(*tok_, ends_with_user);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ids, *tok_->encode(*tmpl_->render(ends_with_user, false), false));
    EXPECT_EQ(e->labels.back(), kChatIgnoreLabel);
    EXPECT_EQ(kept_text(*e), "Yo<|im_end|>\n");
}

TEST_F(ChatLabels, EosFollowsOnlyATemplateThatDoesNotEndTheTurn) {
    // A plain-text template marks no end of turn: eos_token (<|im_end|>) is appended, with loss
    // when the last turn has it.
    auto plain = tmpl_->with_template(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "plain.jinja");
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    const int32_t eos = *tok_->token_to_id("<|im_end|>");
    const Json msgs = conv({{"user", "Hi"}, {"assistant", "Hello!"}});
    auto e = plain->encode_with_labels(*tok_, msgs);
    ASSERT_TRUE(e.ok()) << e.status().message();
    std::vector<int32_t> want = *tok_->encode("user: Hi\nassistant: Hello!\n", false);
    want.push_back(eos);
    EXPECT_EQ(e->ids, want);
    EXPECT_EQ(e->labels.back(), eos);
    EXPECT_EQ(kept_text(*e), "assistant: Hello!\n<|im_end|>");
    // --only-last keeps the loss of the last turn and of its eos.
    ChatEncodeOptions only_last;
    only_last.only_last_turn = true;
    e = plain->encode_with_labels(
        *tok_, conv({{"user", "Hi"}, {"assistant", "A"}, {"user", "B"}, {"assistant", "C"}}),
        only_last);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(kept_text(*e), "assistant: C\n<|im_end|>");
    // Ending with the user's turn: nothing to learn to stop, nothing appended.
    e = plain->encode_with_labels(*tok_, conv({{"user", "Hi"}}));
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ids, *tok_->encode("user: Hi\n", false));
    EXPECT_EQ(e->labels.back(), kChatIgnoreLabel);
    // --no-eos: never appended.
    ChatEncodeOptions no_eos;
    no_eos.append_eos = false;
    e = plain->encode_with_labels(*tok_, msgs, no_eos);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ids, *tok_->encode("user: Hi\nassistant: Hello!\n", false));
    // A template whose output ends in a special token followed by whitespace ends the turn itself.
    auto marked = tmpl_->with_template(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}<|endoftext|>\n \n{% endfor %}",
        "marked.jinja");
    ASSERT_TRUE(marked.ok());
    e = marked->encode_with_labels(*tok_, msgs);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ids, *tok_->encode("user: Hi<|endoftext|>\n \nassistant: Hello!<|endoftext|>\n \n",
                                    false));
}

TEST_F(ChatLabels, HistoryRewrittenByTheTemplate) {
    // qwen3 drops the first answer's reasoning once a later user turn exists.
    const Json msgs = conv({{"user", "2+2?"},
                            {"assistant", "<think>\nadd\n</think>\n\nIt is 4."},
                            {"user", "3+3?"},
                            {"assistant", "<think>\nadd again\n</think>\n\nIt is 6."}});
    auto e = tmpl_->encode_with_labels(*tok_, msgs);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(kept_text(*e),
              "It is 4.<|im_end|>\n<think>\nadd again\n</think>\n\nIt is 6.<|im_end|>\n");
}

TEST(ChatLabelsLlama3, TrailingGenerationHeaderCarriesNoLoss) {
    // The Llama-3 base template renders an assistant header after every conversation, even one
    // that ends with an assistant turn. The ids keep it; the last turn ends at its <|eot_id|>.
    auto tok = Tokenizer::load(kShared + "/tokenizers/llama3.json");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    auto tmpl = ChatTemplate::load(kShared + "/tokenizers/llama3.tokenizer_config.json");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    const Json msgs =
        conv({{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Bye!"}});
    auto e = tmpl->encode_with_labels(*tok, msgs);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(e->ids, *tok->encode(*tmpl->render(msgs, false), false));
    ASSERT_EQ(e->ids.size(), e->labels.size());
    std::vector<int32_t> kept;
    for (size_t i = 0; i < e->ids.size(); ++i)
        if (e->labels[i] != kChatIgnoreLabel) kept.push_back(e->ids[i]);
    EXPECT_EQ(*tok->decode(kept, false), "Hello!<|eot_id|>Bye!<|eot_id|>");
    // The trailing header's tokens are the last ones, and all are masked.
    const std::vector<int32_t> header =
        *tok->encode("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
    ASSERT_LT(header.size(), e->ids.size());
    for (size_t i = e->ids.size() - header.size(); i < e->ids.size(); ++i) {
        EXPECT_EQ(e->ids[i], header[i - (e->ids.size() - header.size())]);
        EXPECT_EQ(e->labels[i], kChatIgnoreLabel);
    }
    EXPECT_EQ(e->labels[e->ids.size() - header.size() - 1], *tok->token_to_id("<|eot_id|>"));
}

TEST_F(ChatLabels, BadConversations) {
    auto e = tmpl_->encode_with_labels(*tok_, Json::array());
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("no messages"), std::string::npos);
    e = tmpl_->encode_with_labels(*tok_, Json::array({{{"content", "x"}}}));
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("message 0"), std::string::npos);
}

}  // namespace
}  // namespace lathe
