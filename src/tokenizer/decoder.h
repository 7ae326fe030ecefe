#pragma once
// Decoders ("decoder" of tokenizer.json): turn the list of token strings back into text, exactly
// as HF's Decoder::decode_chain does (internal to src/tokenizer). Supported "type"s:
//   ByteLevel        tokens mapped back to bytes (a token with a character outside the byte
//                    alphabet is taken as its own UTF-8), all joined, then invalid UTF-8 replaced
//                    with U+FFFD (Rust's from_utf8_lossy)
//   Metaspace        the replacement character becomes ' ' (dropped in the first token unless
//                    prepend_scheme is "never")
//   Replace          pattern (String or Regex) replaced in each token
//   ByteFallback     runs of <0xHH> tokens become the bytes they name (one U+FFFD per byte when
//                    the run is not valid UTF-8)
//   Fuse             all tokens joined into one
//   Strip {content, start, stop}  up to start/stop copies of content cut from each end
//   BPEDecoder {suffix}, WordPiece {prefix, cleanup}, Sequence {decoders}

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_node.h"

namespace lathe {

class Decoder {
public:
    virtual ~Decoder() = default;
    // HF decode_chain: rewrites the token list in place. A Replace pattern that gives up on a
    // token throws RegexLimitExceeded (regex.h); decode() returns it as a Status.
    virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
    // HF decode: decode_chain, then the tokens joined. Errors: a Replace pattern that gives up
    // on a token (it backtracks too far); the message names the pattern and says what to do.
    Result<std::string> decode(std::vector<std::string> tokens) const;
};

// Builds a decoder from a non-null "decoder" node. Errors name the JSON path.
Result<std::unique_ptr<Decoder>> decoder_from_node(const JsonNode& node);

}  // namespace lathe
