#pragma once
// The special tokens of a tokenizer (beginning and end of sequence, padding, unknown), and the
// model files that must agree with them: config.json's bos/eos/pad_token_id (from which
// generation_config.json is made, and by which transformers' generate stops) and
// tokenizer_config.json (by which AutoTokenizer knows its eos/bos/pad/unk tokens).
//
// Where the tokens come from, in this order:
//   1. the tokenizer_config.json that belongs with the tokenizer (prepare_find_tokenizer_config:
//      NAME.tokenizer_config.json or tokenizer_config.json beside NAME.json): its bos_token,
//      eos_token, pad_token and unk_token (strings or AddedToken objects), each looked up in the
//      tokenizer's vocabulary; null or absent means the tokenizer has none.
//   2. without one, the tokenizer.json itself: eos is "<|endoftext|>" when the vocabulary has it
//      (the document end `lathe prepare --append-eod` writes, as GPT-NeoX's HFTokenizer), else a
//      special token the post-processor appends after a text; bos is a special token the
//      post-processor puts before a text, else "<|endoftext|>" (GPT-2's and GPT-NeoX's own
//      tokenizers use that one token for bos, eos and unk); unk is the BPE model's unk_token;
//      no pad.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/hf_config.h"

namespace lathe {

class Tokenizer;

// The files a Hugging Face model folder carries for its tokenizer and generation defaults, copied
// byte for byte into every model folder lathe writes (convert's output, the trainer's checkpoints)
// from where they sit: the fast tokenizer (tokenizer.json) and its config, special tokens and
// added tokens; the chat template in whichever file transformers keeps it; the slow tokenizer's
// vocabulary (vocab.json + merges.txt, or a SentencePiece tokenizer.model), which
// AutoTokenizer(use_fast=False) and conversions to other runtimes read; and generation_config.json
// (the eos ids and sampling defaults of generate).
inline constexpr std::string_view kHfTokenizerFiles[] = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
};
// transformers 5 stores extra named chat templates as files in this folder.
inline constexpr std::string_view kHfChatTemplateFolder = "additional_chat_templates";

struct SpecialToken {
    std::string content;
    int32_t id = 0;
};

struct TokenizerSpecialTokens {
    std::optional<SpecialToken> bos, eos, pad, unk;
    // The tokenizer_config.json they were read from, when there is one ("" otherwise).
    std::string config_path;
    // Where they came from, in words, for messages.
    std::string source;
};

// The special tokens of `tokenizer` (loaded from `tokenizer_path`), found as the file comment
// says. A token that tokenizer_config.json names but the vocabulary lacks is left out, with a
// warning naming the file and key. Errors: kIoError / kInvalidArgument for an unreadable or
// malformed tokenizer_config.json or tokenizer.json, naming the file.
Result<TokenizerSpecialTokens> tokenizer_special_tokens(const Tokenizer& tokenizer,
                                                        const std::string& tokenizer_path);

// How special_ids_apply treats the ids config.json already has.
enum class SpecialIdsMode : uint8_t {
    // A model new to this tokenizer (trained from scratch): each id is the tokenizer's; where the
    // tokenizer has no such token, an id of the config (a transformers class default) is kept
    // only if it names a special token of the tokenizer or one of `specials`.
    kFromTokenizer,
    // A model given a new vocabulary (align apply), whose config's ids the caller has carried
    // over into it: each id is the tokenizer's; where the tokenizer has no such token, the
    // carried id stays as it is.
    kFromTokenizerElseCarried,
    // A model that came with its config.json (a Hugging Face model, a checkpoint): an id is kept
    // when it names a special token of the tokenizer, or one of `specials` (a config may rightly
    // differ from tokenizer_config.json, e.g. several eos ids for an instruct model); an id that
    // names an ordinary token or none (transformers' class defaults, such as Llama's 1 and 2,
    // written for a tokenizer that does not have them there) is replaced by the tokenizer's, or
    // removed. A missing id stays missing.
    kKeepValid,
};

// Sets hf.bos_token_id, hf.eos_token_ids and hf.pad_token_id from `specials` as `mode` says.
// Returns one line per id changed ("eos_token_id 2 ('!') -> 0 ('<|endoftext|>')"), for the log.
std::vector<std::string> special_ids_apply(HfModelConfig& hf, const Tokenizer& tokenizer,
                                           const TokenizerSpecialTokens& specials,
                                           SpecialIdsMode mode);

// The tokenizer_config.json text for a tokenizer that has none: tokenizer_class
// PreTrainedTokenizerFast, the bos/eos/pad/unk tokens of `specials` (those the tokenizer has),
// model_max_length (the model's context), clean_up_tokenization_spaces false; sorted keys,
// indent 2, a trailing newline.
std::string special_tokens_tokenizer_config(const TokenizerSpecialTokens& specials,
                                            int64_t model_max_length);

// For a checkpoint folder `dir` holding tokenizer.json and config.json: when `dir` has no
// tokenizer_config.json, writes one (special_tokens_tokenizer_config, the model's
// max_position_embeddings), atomically, and returns true. Does nothing and returns false when
// one exists or there is no tokenizer.json. Errors: those of reading the tokenizer and the
// config, kIoError from writing.
Result<bool> special_tokens_write_tokenizer_config(const std::string& dir);

}  // namespace lathe
