#pragma once
// `lathe eval bpb --checkpoint DIR --data FILE [--seq-len T]`: bits per byte of a corpus, a
// measure that does not depend on the tokenizer.
//
// Definition. The documents: each line of a .jsonl file is one ({"text": "..."}; blank lines
// skipped), any other file is one document (its whole text). Each document's text is encoded
// with the checkpoint's tokenizer.json without special tokens, ids = encode(text), and read as
// the sequence s = [p] + ids, p being config.json's bos_token_id (else its eos_token_id, the first
// of a list): every token of the document is predicted, the first from p alone. s is cut into
// windows of at most T + 1 tokens that overlap by one token (window w is s[w T, w T + T + 1));
// each window predicts its tokens 1.. from the tokens before them inside the window. Then
//   bpb = (sum over every predicted token of -ln p(token)) / (ln 2 * sum of the documents'
//         UTF-8 bytes).
// Documents whose text encodes to no token add their bytes and no loss.

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lathe {

struct EvalBpbRequest {
    std::string checkpoint;  // as eval loss's (resolve_checkpoint); needs tokenizer.json
    std::string data;        // .jsonl of {"text"} lines, or a text file
    int64_t seq_len = 512;   // T
    std::string device = "auto";
};

struct EvalBpbResult {
    double bpb = 0.0;
    double nats = 0.0;  // the summed loss
    int64_t bytes = 0, tokens = 0, documents = 0;
    std::string checkpoint;
};

// Errors: a checkpoint that does not load or has no tokenizer.json or neither bos_token_id nor
// eos_token_id, a data file that does not open, a .jsonl line (FILE:LINE) that is not an object
// with a string "text", a file that is not UTF-8 (FILE:LINE, the byte column and the byte; for a
// text file also its byte offset), T < 1 or beyond the model's context, a corpus of no bytes.
Result<EvalBpbResult> eval_bpb_run(const EvalBpbRequest& request);

// One JSON line (no newline): {bpb, nats, bytes, tokens, documents, seq_len, device, checkpoint,
// data}.
std::string eval_bpb_json(const EvalBpbRequest& request, const EvalBpbResult& result);

}  // namespace lathe
