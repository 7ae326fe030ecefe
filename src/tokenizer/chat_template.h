#pragma once
// Chat templates: a model's Jinja chat template (from tokenizer_config.json) rendered exactly as
// Hugging Face transformers' `apply_chat_template` renders it (jinja2 ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks, loopcontrols, HF's tojson/raise_exception/strftime_now), and a
// conversation turned into apply_chat_template's token ids plus supervised fine-tuning labels the
// way GPT-NeoX's tools/datasets/preprocess_data_with_chat_template.py masks them (its end token
// aside: see encode_with_labels).
//
// Conversations are nlohmann::ordered_json values (parse input with nlohmann::ordered_json::parse
// so that key order survives: `tojson` in a template prints keys in input order, as Python does).
// A ChatTemplate is immutable after loading; every const method is safe to call from many threads.

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

class Tokenizer;
namespace jinja {
class Template;
}

// The label of a token that carries no loss (GPT-NeoX / PyTorch ignore_index).
inline constexpr int32_t kChatIgnoreLabel = -100;

// Token ids and labels of one conversation; both vectors have the same length.
// labels[i] == ids[i] where token i carries loss, kChatIgnoreLabel where it does not.
struct ChatEncoding {
    std::vector<int32_t> ids;
    std::vector<int32_t> labels;
};

// GPT-NeoX's build_chat() switches (same defaults as its command line).
struct ChatEncodeOptions {
    std::string generation_role = "assistant";  // --generation-role: turns of this role keep loss
    bool mask = true;             // false = --no-mask: every token keeps loss, nothing appended
    bool only_last_turn = false;  // --only-last: only the final turn keeps loss
    // Append eos_token's id after a final generation-role turn that the template does not end
    // itself (see encode_with_labels); GPT-NeoX appends it after every conversation.
    bool append_eos = true;
};

class ChatTemplate {
public:
    // Loads tokenizer_config.json. `chat_template` may be a string or a list of
    // {"name", "template"} objects (then `template_name` picks one, "default" by default). When the
    // config has no chat_template, a sibling `chat_template.jinja` or `chat_template.json` (the
    // files newer transformers save) is used. bos/eos/unk/pad tokens may be strings or AddedToken
    // dicts ({"content": ...}). The template is parsed here: syntax errors come back with the
    // template's name, line and what was expected. Errors name the file and key.
    static Result<ChatTemplate> load(const std::string& tokenizer_config_path,
                                     const std::string& template_name = "default");
    // Same, from the config's JSON text; `source_name` names it in errors.
    static Result<ChatTemplate> from_config(std::string_view config_json_text,
                                            const std::string& source_name,
                                            const std::string& template_name = "default");
    // The same special tokens with another template source (e.g. `--chat-template FILE`, or a
    // config that has none). `template_name` names it in errors.
    Result<ChatTemplate> with_template(std::string_view template_source,
                                       const std::string& template_name) const;

    ChatTemplate(ChatTemplate&&) noexcept;
    ChatTemplate& operator=(ChatTemplate&&) noexcept;
    ~ChatTemplate();

    // Renders as transformers' apply_chat_template(messages, tools=tools, tokenize=False,
    // add_generation_prompt=...). The template sees `messages`, `tools` (none when null),
    // `add_generation_prompt`, the config's special tokens that are set (`bos_token`, `eos_token`,
    // `unk_token`, `pad_token`, ...), and each key of `extra_variables` (an object, may be null),
    // like apply_chat_template's **kwargs (e.g. {"enable_thinking": false}). `messages` must be
    // an array. raise_exception(), undefined values used where jinja2 raises, type errors and
    // sandbox violations come back as an error Status naming the template and line.
    Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& tools = nullptr,
                               const nlohmann::ordered_json& extra_variables = nullptr) const;

    // Tokens and labels of one conversation, following GPT-NeoX's build_chat(): for each turn i
    // the prefix messages[0..i] is rendered with add_generation_prompt = (the next turn's role is
    // the generation role); the tokens it adds beyond the previous prefix form turn i's segment;
    // segments of generation-role turns keep loss (their end-of-turn tokens included), all others
    // (system, user, tool, and the assistant header emitted by the generation prompt) get
    // kChatIgnoreLabel. Rendered text is tokenized with add_special=false (the template emits BOS
    // itself), so the ids are transformers' apply_chat_template(messages, tokenize=True).
    //
    // The template's output is used as it is. Only where it does not end the turn itself is
    // eos_token's id appended, labelled like the token before it, so that the model learns where
    // its reply stops: when the conversation ends with a generation-role turn and the rendering
    // does not end in a special token, whitespace aside (a plain-text template with no
    // end-of-turn marker). Templates that end each turn with a special token (<|im_end|>\n,
    // <|eot_id|>, </s>) get nothing appended, and neither does a conversation that ends with
    // another role's turn (no loss would follow). GPT-NeoX's chat script appends eos_token after
    // every conversation, which doubles qwen3's <|im_end|>.
    //
    // Templates that render a prefix of the conversation differently from the same turns inside
    // the whole conversation break GPT-NeoX's assumption that each prefix's tokens start the
    // next prefix's tokens: qwen3 drops an earlier assistant turn's reasoning once a later user
    // turn exists; the Llama-3 base template always appends the assistant header; and tokens
    // can merge across a turn boundary. GPT-NeoX then slices by token count and emits tokens of
    // no rendering at all. lathe instead always emits the tokens of the full rendering, and ends
    // turn i where its prefix rendering ends inside the full text: exactly there when the prefix
    // text is a prefix of the full text; otherwise after aligning the two (text the full
    // rendering dropped from an earlier turn is skipped; at the end, the longest rest of the
    // prefix that the full text continues with still belongs to turn i; an appended header
    // belongs to the next turn). A token belongs to the turn in which it starts. Where prefix
    // tokens do start the full tokens (the usual case), the result equals GPT-NeoX's exactly,
    // except after a final generation-role turn: what the template renders after that turn's
    // end-of-turn (the Llama-3 base template's trailing assistant header) carries no loss here,
    // where GPT-NeoX keeps it in the last turn. That turn ends where the rendering with one more
    // (probe) message appended parts from the full one, aligned as above; qwen3's "\n" after
    // <|im_end|> stays in the turn, as in every other turn. A template that rejects the probe
    // message leaves the last turn running to the end of the rendering.
    // Errors: a render error, a message that is not an object with a string `role`, a tokenizer
    // error, or an eos_token to append that is not in the vocabulary.
    Result<ChatEncoding> encode_with_labels(
        const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
        const ChatEncodeOptions& options = {}, const nlohmann::ordered_json& tools = nullptr,
        const nlohmann::ordered_json& extra_variables = nullptr) const;

    // The template source and its name ("<config>:chat_template" or the override's name).
    const std::string& source() const;
    const std::string& name() const;
    // The config's bos_token / eos_token (content), if set.
    const std::optional<std::string>& bos_token() const;
    const std::optional<std::string>& eos_token() const;

    struct Impl;

private:
    explicit ChatTemplate(std::unique_ptr<Impl> impl);
    static Result<ChatTemplate> build(std::string_view config_json_text,
                                      const std::string& source_name,
                                      const std::string& template_name,
                                      const std::string* config_path);
    std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
