// `lathe chat`: render conversations with a model's chat template, or turn them into SFT tokens
// and labels.
//
//   lathe chat render --tokenizer-config C [--chat-template F] [--template-name N]
//                     [--input F] [--add-generation-prompt] [--kwargs JSON] [--output F]
//   lathe chat encode --tokenizer T.json --tokenizer-config C [--chat-template F]
//                     [--template-name N] [--input F] [--kwargs JSON] [--output F]
//                     [--generation-role R] [--only-last] [--no-mask] [--no-eos]
//
// What render and encode write, and the input format: data/chat_jsonl.h.

#include <memory>

#include "cli/command.h"
#include "data/chat_jsonl.h"
#include "io/file.h"

namespace lathe {

namespace {

void add_template_options(CLI::App* cmd, ChatJsonlOptions& args) {
    cmd->add_option("--tokenizer-config", args.tokenizer_config,
                    "tokenizer_config.json: its chat_template and special tokens")
        ->required();
    cmd->add_option("--chat-template", args.chat_template,
                    "A Jinja template file used instead of the config's chat_template");
    cmd->add_option("--template-name", args.template_name,
                    "Which of the config's named chat templates to use (default: default)");
    cmd->add_option("--input", args.input,
                    "Input JSONL, one {\"messages\": [...]} per line ('-' = stdin)");
    cmd->add_option("--output", args.output, "Output JSONL, written atomically ('-' = stdout)");
    cmd->add_option("--kwargs", args.kwargs,
                    "JSON object of extra template variables for every line, e.g. "
                    "'{\"enable_thinking\": false}'");
}

}  // namespace

void cli_add_chat(CLI::App& parent, CommandAction& action) {
    CLI::App* chat = parent.add_subcommand(
        "chat", "Render conversations with a chat template, or encode them for SFT");
    chat->require_subcommand(1);
    auto args = std::make_shared<ChatJsonlOptions>();

    CLI::App* render = chat->add_subcommand(
        "render",
        "Render each conversation as transformers' apply_chat_template(tokenize=False) does");
    add_template_options(render, *args);
    render->add_flag("--add-generation-prompt", args->add_generation_prompt,
                     "End with the header that starts the assistant's reply");
    render->callback([args, &action] {
        action = [args]() -> Status {
            LATHE_RETURN_IF_ERROR(
                check_output_is_not_input("--output", args->output, "--input", args->input));
            return chat_jsonl_run(*args, ChatJsonlMode::kRender);
        };
    });

    CLI::App* encode = chat->add_subcommand(
        "encode",
        "Token ids and SFT labels per conversation (-100 = no loss), as GPT-NeoX builds them");
    add_template_options(encode, *args);
    encode->add_option("--tokenizer", args->tokenizer, "tokenizer.json")->required();
    encode->add_option("--generation-role", args->encode.generation_role,
                       "Turns of this role keep loss (default: assistant)");
    encode->add_flag("--only-last", args->encode.only_last_turn, "Only the last turn keeps loss");
    encode->add_flag(
        "--no-mask", [args](int64_t n) { args->encode.mask = n == 0; },
        "Every token keeps loss (labels = ids)");
    encode->add_flag("--no-eos", args->no_eos,
                     "Never append eos_token (by default it follows a final assistant turn "
                     "whose rendering does not end in a special token: a template that marks "
                     "no end of turn)");
    encode->callback([args, &action] {
        action = [args]() -> Status {
            LATHE_RETURN_IF_ERROR(
                check_output_is_not_input("--output", args->output, "--input", args->input));
            return chat_jsonl_run(*args, ChatJsonlMode::kEncode);
        };
    });
}

}  // namespace lathe
