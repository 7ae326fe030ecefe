#include "align/map.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "align/stage_cache.h"
#include "core/check.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/json.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"
#include "ops/cuda/cuda_state.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace {

using Json = nlohmann::json;

// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
// bytes (controls, space, 0x7F-0xA0, 0xAD) take the code points 256, 257, ... in byte order.
struct ByteLevelTable {
    std::array<char32_t, 256> to_char{};
    std::unordered_map<char32_t, uint8_t> to_byte;
    ByteLevelTable() {
        char32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable =
                (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            to_char[b] = printable ? char32_t(b) : next++;
            to_byte[to_char[b]] = uint8_t(b);
        }
    }
};

const ByteLevelTable& byte_level_table() {
    static const ByteLevelTable table;
    return table;
}

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// Collects every "type" string (and Replace patterns) under a decoder / pre_tokenizer node.
void collect_types(const Json& node, std::vector<std::string>& types, bool& replaces_metaspace) {
    if (node.is_object()) {
        auto t = node.find("type");
        if (t != node.end() && t->is_string()) types.push_back(t->get<std::string>());
        if (t != node.end() && t->is_string() && t->get<std::string>() == "Replace") {
            auto p = node.find("pattern");
            if (p != node.end() && p->is_object()) {
                auto s = p->find("String");
                if (s != p->end() && s->is_string() && s->get<std::string>() == kMetaspace)
                    replaces_metaspace = true;
            }
        }
        for (const auto& [key, value] : node.items()) {
            if (value.is_structured()) collect_types(value, types, replaces_metaspace);
        }
    } else if (node.is_array()) {
        for (const Json& v : node) collect_types(v, types, replaces_metaspace);
    }
}

// Parses "<0xNN>" into its byte.
std::optional<uint8_t> parse_byte_fallback(std::string_view s) {
    if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return std::nullopt;
    unsigned v = 0;
    auto [p, ec] = std::from_chars(s.data() + 3, s.data() + 5, v, 16);
    if (ec != std::errc() || p != s.data() + 5) return std::nullopt;
    return uint8_t(v);
}

std::string escape_tsv(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '\t':
                out += "\\t";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\\':
                out += "\\\\";
                break;
            default:
                out += c;
        }
    }
    return out;
}

// Merges the scores of one tile row (ties to the lower column: columns are visited in order and
// only a strictly larger score displaces).
inline void top2_merge_row(AlignTop2& t, const float* scores, int64_t n, int64_t col0) {
    for (int64_t j = 0; j < n; ++j) {
        const float s = scores[j];
        if (t.best < 0 || s > t.best_score) {
            t.second = t.best;
            t.second_score = t.best_score;
            t.best = int32_t(col0 + j);
            t.best_score = s;
        } else if (t.second < 0 || s > t.second_score) {
            t.second = int32_t(col0 + j);
            t.second_score = s;
        }
    }
}

// Unit-length copies of the rows (a zero row stays zero).
std::vector<float> unit_rows(const float* rows, int64_t n, int64_t dim) {
    std::vector<float> out(rows, rows + n * dim);
    for (int64_t i = 0; i < n; ++i) {
        float* r = out.data() + i * dim;
        double ss = 0.0;
        for (int64_t k = 0; k < dim; ++k) ss += double(r[k]) * r[k];
        const double norm = std::sqrt(ss);
        if (norm > 0.0) {
            for (int64_t k = 0; k < dim; ++k) r[k] = float(r[k] / norm);
        }
    }
    return out;
}

}  // namespace

// ---- tokenizers ----

Result<AlignTokenizer> align_load_tokenizer(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_json(text, path));
    AlignTokenizer out{std::move(tok), path, TokenSpelling::kPlain, std::nullopt, {}, {}};
    Json j = json_parse<Json>(text);
    if (j.is_discarded() || !j.is_object())
        return invalid_argument_error("{}: not a JSON object", path);
    // Stages index per-id tables with int32 ids.
    if (out.tokenizer.vocab_size() > std::numeric_limits<int32_t>::max()) {
        return invalid_argument_error(
            "{}: its largest token id is {}; align's per-id tables hold at most 2^31 - 1 ids", path,
            out.tokenizer.vocab_size() - 1);
    }
    const int32_t V = static_cast<int32_t>(out.tokenizer.vocab_size());
    out.added.assign(size_t(V), 0);
    out.special.assign(size_t(V), 0);
    if (auto a = j.find("added_tokens"); a != j.end() && a->is_array()) {
        for (size_t i = 0; i < a->size(); ++i) {
            const Json& e = (*a)[i];
            if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer()) {
                return invalid_argument_error(
                    "{}: added_tokens[{}]: expected an object with an integer id", path, i);
            }
            const int64_t id = e["id"].get<int64_t>();
            if (id < 0 || id >= V) continue;
            out.added[size_t(id)] = 1;
            if (e.value("special", false)) out.special[size_t(id)] = 1;
        }
    }
    std::vector<std::string> types;
    bool replaces_metaspace = false;
    for (const char* key : {"decoder", "pre_tokenizer"}) {
        if (auto n = j.find(key); n != j.end()) collect_types(*n, types, replaces_metaspace);
    }
    bool byte_fallback = false;
    if (auto m = j.find("model"); m != j.end() && m->is_object()) {
        if (auto bf = m->find("byte_fallback"); bf != m->end() && bf->is_boolean())
            byte_fallback = bf->get<bool>();
        if (auto u = m->find("unk_token"); u != m->end() && u->is_string()) {
            out.unk_id = out.tokenizer.token_to_id(u->get<std::string>());
        }
    }
    const auto has = [&](std::string_view t) {
        return std::find(types.begin(), types.end(), t) != types.end();
    };
    if (has("ByteLevel")) {
        out.spelling = TokenSpelling::kByteLevel;
    } else if (has("Metaspace") || replaces_metaspace || byte_fallback) {
        out.spelling = TokenSpelling::kSentencePiece;
    }
    return out;
}

std::optional<std::string> align_token_bytes(const AlignTokenizer& tok, int32_t id) {
    std::optional<std::string> entry = tok.tokenizer.id_to_token(id);
    if (!entry) return std::nullopt;
    if ((size_t(id) < tok.added.size() && tok.added[size_t(id)]) ||
        tok.spelling == TokenSpelling::kPlain) {
        return entry;
    }
    if (tok.spelling == TokenSpelling::kSentencePiece) {
        if (auto b = parse_byte_fallback(*entry)) return std::string(1, char(*b));
        std::string out;
        for (size_t i = 0; i < entry->size();) {
            if (entry->compare(i, kMetaspace.size(), kMetaspace) == 0) {
                out += ' ';
                i += kMetaspace.size();
            } else {
                out += (*entry)[i++];
            }
        }
        return out;
    }
    // Byte level: every character must be one of the 256 byte characters.
    if (!utf8::is_valid(*entry)) return std::nullopt;
    const ByteLevelTable& table = byte_level_table();
    std::string out;
    for (size_t i = 0; i < entry->size();) {
        int len = 1;
        const char32_t cp = utf8::decode(*entry, i, &len);
        i += size_t(len);
        auto it = table.to_byte.find(cp);
        if (it == table.to_byte.end()) return std::nullopt;
        out += char(it->second);
    }
    return out;
}

namespace {

// The source id of one raw byte in the source's own spelling, if it has one.
std::optional<int32_t> source_byte_id(const AlignTokenizer& source, uint8_t b) {
    if (source.spelling == TokenSpelling::kByteLevel) {
        return source.tokenizer.token_to_id(utf8::encode(byte_level_table().to_char[b]));
    }
    if (source.spelling == TokenSpelling::kSentencePiece) {
        return source.tokenizer.token_to_id(fmt::format("<0x{:02X}>", b));
    }
    return std::nullopt;
}

}  // namespace

std::vector<int32_t> align_fvt_pieces(const AlignTokenizer& target, int32_t target_id,
                                      const AlignTokenizer& source) {
    std::vector<int32_t> pieces;
    std::optional<std::string> bytes = align_token_bytes(target, target_id);
    if (!bytes || bytes->empty()) return pieces;
    if (utf8::is_valid(*bytes) &&
        source.tokenizer.encode(*bytes, /*add_special=*/false, pieces).ok() && !pieces.empty()) {
        return pieces;
    }
    pieces.clear();
    for (char c : *bytes) {
        std::optional<int32_t> id = source_byte_id(source, uint8_t(c));
        if (!id) return {};
        pieces.push_back(*id);
    }
    return pieces;
}

// ---- top-2 ----

void align_top2_cpu(std::span<AlignTop2> out, const float* A, int64_t M, const float* B, int64_t N,
                    int64_t K, int64_t tile_rows, int64_t tile_cols) {
    LATHE_CHECK(int64_t(out.size()) == M, "top2: {} outputs for {} rows", out.size(), M);
    LATHE_CHECK(tile_rows > 0 && tile_cols > 0, "top2 tiles {}x{}", tile_rows, tile_cols);
    LATHE_CHECK(N <= std::numeric_limits<int32_t>::max(), "top2: {} columns exceed int32", N);
    for (AlignTop2& t : out) t = AlignTop2{};
    const int64_t row_tiles = (M + tile_rows - 1) / tile_rows;
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        std::vector<float> scores(size_t(tile_rows * std::min(tile_cols, std::max<int64_t>(N, 1))));
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t rt = 0; rt < row_tiles; ++rt) {
            const int64_t r0 = rt * tile_rows, r1 = std::min(M, r0 + tile_rows);
            for (int64_t c0 = 0; c0 < N; c0 += tile_cols) {
                const int64_t c1 = std::min(N, c0 + tile_cols);
                // scores (r1-r0, c1-c0) = A[r0:r1] · B[c0:c1]ᵀ; inside this parallel region the
                // BLAS wrapper runs serially (single-threaded BLAS, no nested pool).
                cpu::sgemm_strided(false, true, r1 - r0, c1 - c0, K, 1.0f, A + r0 * K, K,
                                   B + c0 * K, K, 0.0f, scores.data(), c1 - c0);
                for (int64_t i = r0; i < r1; ++i) {
                    top2_merge_row(out[size_t(i)], scores.data() + (i - r0) * (c1 - c0), c1 - c0,
                                   c0);
                }
            }
        }
    }
    for (AlignTop2& t : out) {
        if (t.best < 0) t.best_score = -std::numeric_limits<float>::infinity();
        if (t.second < 0) t.second_score = -std::numeric_limits<float>::infinity();
    }
}

#if !defined(LATHE_HAVE_CUDA)
bool align_top2_cuda_available() {
    return false;
}
#endif

namespace {

// align_top2_cuda on GPU 0, with a CUDA state of its own for the stage (streams, cuBLASLt handle,
// workspace: created once here, released when the top-2 is on the host).
Status align_top2_on_gpu(std::span<AlignTop2> out, const float* A, int64_t M, const float* B,
                         int64_t N, int64_t K) {
#ifdef LATHE_HAVE_CUDA
    if (!align_top2_cuda_available()) {
        return failed_precondition_error(
            "align map --device cuda: no GPU is visible; use --device cpu or auto");
    }
    CudaState state(0);
    return align_top2_cuda(state.context(), out, A, M, B, N, K);
#else
    (void)out, (void)A, (void)M, (void)B, (void)N, (void)K;
    return unimplemented_error(
        "align map --device cuda: this build has no CUDA (nvcc was not found "
        "when it was configured); use --device cpu");
#endif
}

}  // namespace

// ---- decisions, files ----

std::string_view align_decision_name(AlignDecision d) {
    switch (d) {
        case AlignDecision::kGold:
            return "gold";
        case AlignDecision::kTerm:
            return "term";
        case AlignDecision::kFvt:
            return "fvt";
        case AlignDecision::kAligned:
            return "aligned";
        case AlignDecision::kThreshold:
            return "threshold";
    }
    return "?";
}

std::optional<AlignDecision> align_decision_from_name(std::string_view name) {
    for (AlignDecision d : {AlignDecision::kGold, AlignDecision::kTerm, AlignDecision::kFvt,
                            AlignDecision::kAligned, AlignDecision::kThreshold}) {
        if (align_decision_name(d) == name) return d;
    }
    return std::nullopt;
}

Result<TokenVectors> align_load_vectors(const std::string& path, int32_t vocab_size) {
    LATHE_ASSIGN_OR_RETURN(TokenVectors v, vectors_read_text(path));
    for (int32_t id : v.ids) {
        if (id < 0 || id >= vocab_size) {
            return invalid_argument_error(
                "{}: token id {} is outside the tokenizer's vocabulary of {} ids: these "
                "vectors belong to another tokenizer",
                path, id, vocab_size);
        }
    }
    return v;
}

std::vector<int32_t> align_gold_map(const AlignTokenizer& source, const AlignTokenizer& target,
                                    AlignMatch match) {
    const int32_t Vt = target.tokenizer.vocab_size();
    const int32_t Vs = source.tokenizer.vocab_size();
    std::vector<int32_t> gold(size_t(Vt), -1);
    for (int32_t t = 0; t < Vt; ++t) {
        std::optional<std::string> s = target.tokenizer.id_to_token(t);
        if (!s) continue;
        if (std::optional<int32_t> src = source.tokenizer.token_to_id(*s)) gold[size_t(t)] = *src;
    }
    if (match == AlignMatch::kByteLevelAware) {
        std::unordered_map<std::string, int32_t> by_bytes;
        for (int32_t s = 0; s < Vs; ++s) {
            if (size_t(s) < source.special.size() && source.special[size_t(s)]) continue;
            if (std::optional<std::string> b = align_token_bytes(source, s); b && !b->empty()) {
                by_bytes.emplace(std::move(*b), s);  // the lowest id wins for a repeated spelling
            }
        }
        for (int32_t t = 0; t < Vt; ++t) {
            if (gold[size_t(t)] >= 0 ||
                (size_t(t) < target.special.size() && target.special[size_t(t)]))
                continue;
            std::optional<std::string> b = align_token_bytes(target, t);
            if (!b || b->empty()) continue;
            if (auto it = by_bytes.find(*b); it != by_bytes.end()) gold[size_t(t)] = it->second;
        }
    }
    return gold;
}

Result<AlignMapResult> align_map_compute(const AlignTokenizer& source, const AlignTokenizer& target,
                                         const TokenVectors& source_vectors,
                                         const TokenVectors& target_vectors,
                                         std::span<const int32_t> terms,
                                         const AlignMapRequest& request) {
    using Clock = std::chrono::steady_clock;
    const int32_t Vt = target.tokenizer.vocab_size();
    const int32_t Vs = source.tokenizer.vocab_size();
    AlignMapResult result;
    result.entries.assign(size_t(Vt), AlignEntry{});

    // 1. Gold pairs (target id -> source id).
    const std::vector<int32_t> gold = align_gold_map(source, target, request.match);
    for (int32_t t = 0; t < Vt; ++t) {
        if (gold[size_t(t)] < 0) continue;
        if (source.tokenizer.id_to_token(gold[size_t(t)]) == target.tokenizer.id_to_token(t))
            ++result.gold_exact;
    }
    for (int32_t g : gold) result.gold += g >= 0 ? 1 : 0;
    if (result.gold == 0) {
        return failed_precondition_error(
            "{} and {} share no token (match {}): there is no gold pair to take "
            "pivots from; try --match byte-level-aware if one is byte-level BPE and "
            "the other SentencePiece",
            source.path, target.path,
            request.match == AlignMatch::kExact ? "exact" : "byte-level-aware");
    }

    // Rows of each vector set by token id.
    std::vector<int32_t> src_row(size_t(Vs), -1), tgt_row(size_t(Vt), -1);
    for (size_t r = 0; r < source_vectors.ids.size(); ++r)
        src_row[size_t(source_vectors.ids[r])] = int32_t(r);
    for (size_t r = 0; r < target_vectors.ids.size(); ++r)
        tgt_row[size_t(target_vectors.ids[r])] = int32_t(r);

    // 2. Pivots: seeded shuffle of the gold pairs, the first `pivots` with vectors on both sides.
    std::vector<int32_t> gold_targets;
    for (int32_t t = 0; t < Vt; ++t) {
        if (gold[size_t(t)] >= 0) gold_targets.push_back(t);
    }
    std::mt19937_64 rng(request.seed);
    std::shuffle(gold_targets.begin(), gold_targets.end(), rng);
    std::vector<int32_t> pivot_t, pivot_s;
    int64_t with_vectors = 0;
    for (int32_t t : gold_targets) {
        if (tgt_row[size_t(t)] < 0 || src_row[size_t(gold[size_t(t)])] < 0) continue;
        ++with_vectors;
        if (int64_t(pivot_t.size()) < request.pivots) {
            pivot_t.push_back(t);
            pivot_s.push_back(gold[size_t(t)]);
        }
    }
    if (pivot_t.empty()) {
        return failed_precondition_error(
            "no pivots: of {} gold pairs none has a vector on both sides ({} target, "
            "{} source vectors); were the vectors trained on token streams of these "
            "two tokenizers?",
            result.gold, target_vectors.ids.size(), source_vectors.ids.size());
    }
    if (int64_t(pivot_t.size()) < request.pivots) {
        log_warning(
            "align map: only {} gold pairs have vectors on both sides; using {} pivots instead of "
            "{}",
            with_vectors, pivot_t.size(), request.pivots);
    }
    result.pivots = int64_t(pivot_t.size());
    const int64_t P = result.pivots;

    // 3. Relative representations: rel = unit(x) · unit(pivots)ᵀ.
    const auto relative = [&](const TokenVectors& vs, const std::vector<int32_t>& row_of,
                              const std::vector<int32_t>& pivot_ids) {
        const int64_t n = int64_t(vs.ids.size()), d = vs.dim;
        std::vector<float> unit = unit_rows(vs.values.data(), n, d);
        std::vector<float> piv(size_t(P * d));
        for (int64_t p = 0; p < P; ++p) {
            const float* r = unit.data() + int64_t(row_of[size_t(pivot_ids[size_t(p)])]) * d;
            std::copy(r, r + d, piv.data() + p * d);
        }
        std::vector<float> rel(size_t(n * P));
        cpu::sgemm(false, true, n, P, d, 1.0f, unit.data(), piv.data(), 0.0f, rel.data());
        if (request.similarity == AlignSimilarity::kCosine) rel = unit_rows(rel.data(), n, P);
        return rel;
    };
    const std::vector<float> rel_t = relative(target_vectors, tgt_row, pivot_t);
    const std::vector<float> rel_s = relative(source_vectors, src_row, pivot_s);

    // 4. Top-2 per target row over all source rows.
    const int64_t Mt = int64_t(target_vectors.ids.size()), Ns = int64_t(source_vectors.ids.size());
    std::vector<AlignTop2> top(static_cast<size_t>(Mt));
    bool use_cuda = request.device == AlignDevice::kCuda ||
                    (request.device == AlignDevice::kAuto && align_top2_cuda_available());
    log_info(
        "align map: {} gold pairs, {} pivots; best source token for {} target x {} source vectors "
        "on {}",
        result.gold, P, Mt, Ns, use_cuda ? "cuda" : "cpu");
    const auto t0 = Clock::now();
    if (use_cuda) {
        LATHE_RETURN_IF_ERROR(align_top2_on_gpu(top, rel_t.data(), Mt, rel_s.data(), Ns, P));
    } else {
        align_top2_cpu(top, rel_t.data(), Mt, rel_s.data(), Ns, P);
    }
    result.seconds_top2 = std::chrono::duration<double>(Clock::now() - t0).count();
    result.device = use_cuda ? "cuda" : "cpu";
    log_info("align map: top-2 done in {:.2f} s", result.seconds_top2);

    // 5. Decisions.
    std::vector<uint8_t> is_term(size_t(Vt), 0);
    for (int32_t t : terms) {
        if (t >= 0 && t < Vt) is_term[size_t(t)] = 1;
    }
    for (int32_t t = 0; t < Vt; ++t) {
        AlignEntry& e = result.entries[size_t(t)];
        if (gold[size_t(t)] >= 0) {
            e = {gold[size_t(t)], AlignDecision::kGold, 0.0f};
            continue;
        }
        const auto first_piece = [&]() {
            std::vector<int32_t> pieces = align_fvt_pieces(target, t, source);
            return pieces.empty() ? (source.unk_id ? *source.unk_id : 0) : pieces.front();
        };
        if (is_term[size_t(t)]) {
            e = {first_piece(), AlignDecision::kTerm, 0.0f};
            ++result.terms;
            continue;
        }
        const int32_t row = tgt_row[size_t(t)];
        if (row < 0) {
            e = {first_piece(), AlignDecision::kFvt, 0.0f};
            ++result.fvt;
            continue;
        }
        const AlignTop2& tp = top[size_t(row)];
        int32_t pick = tp.best;
        float score = tp.best_score;
        if (source.unk_id && source_vectors.ids[size_t(pick)] == *source.unk_id && tp.second >= 0) {
            pick = tp.second;
            score = tp.second_score;
        }
        e = {source_vectors.ids[size_t(pick)], AlignDecision::kAligned, score};
        if (request.threshold && double(score) < *request.threshold) {
            e.decision = AlignDecision::kThreshold;
            ++result.below_threshold;
        } else {
            ++result.aligned;
        }
    }
    return result;
}

std::string align_report_path(const std::string& map_path) {
    if (ends_with(map_path, ".json"))
        return map_path.substr(0, map_path.size() - 5) + ".report.tsv";
    return map_path + ".report.tsv";
}

Result<std::vector<int32_t>> align_read_terms(const std::string& path,
                                              const AlignTokenizer& target) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    std::vector<int32_t> ids;
    int64_t line_no = 0;
    for (std::string_view line : split(text, '\n')) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        const std::string_view term = line.substr(0, line.find('\t'));
        if (line_no == 1 && term == "term") continue;  // header
        std::optional<int32_t> id = target.tokenizer.token_to_id(term);
        if (!id) {
            // A term stored as a vocabulary entry is spelled in the model's spelling: encode it.
            auto enc = target.tokenizer.encode(term, /*add_special=*/false);
            if (enc.ok() && enc.value().size() == 1) id = enc.value().front();
        }
        if (!id) {
            return invalid_argument_error(
                "{}:{}: the term '{}' is not one token of {} (was the target tokenizer "
                "made from these terms?)",
                path, line_no, escape_for_message(term), target.path);
        }
        ids.push_back(*id);
    }
    return ids;
}

Result<AlignMapResult> align_map_run(const AlignMapRequest& request) {
    if (request.pivots <= 0)
        return invalid_argument_error("--pivots must be positive, got {}", request.pivots);
    if (request.output.empty()) return invalid_argument_error("--output is required");
    // The output folders now, not after minutes of compute.
    for (const std::string& out : {request.output, request.report}) {
        const std::filesystem::path parent = std::filesystem::path(out).parent_path();
        std::error_code ec;
        if (!out.empty() && !parent.empty() && !std::filesystem::create_directories(parent, ec) &&
            ec) {
            return io_error("{}: cannot create the folder: {}", parent.string(), ec.message());
        }
    }
    LATHE_ASSIGN_OR_RETURN(AlignTokenizer source, align_load_tokenizer(request.source_tokenizer));
    LATHE_ASSIGN_OR_RETURN(AlignTokenizer target, align_load_tokenizer(request.target_tokenizer));
    const std::string report =
        request.report.empty() ? align_report_path(request.output) : request.report;
    StageFingerprint fp("map");
    fp.add_setting("pivots", request.pivots);
    fp.add_setting("seed", request.seed);
    fp.add_setting("match", request.match == AlignMatch::kExact ? "exact" : "byte-level-aware");
    fp.add_setting("similarity", request.similarity == AlignSimilarity::kDot ? "dot" : "cosine");
    fp.add_setting("threshold",
                   request.threshold ? fmt::format("{:.17g}", *request.threshold) : "none");
    fp.add_setting("report", report);
    LATHE_RETURN_IF_ERROR(fp.add_input("source_tokenizer", request.source_tokenizer));
    LATHE_RETURN_IF_ERROR(fp.add_input("target_tokenizer", request.target_tokenizer));
    LATHE_RETURN_IF_ERROR(fp.add_input("source_vectors", request.source_vectors));
    LATHE_RETURN_IF_ERROR(fp.add_input("target_vectors", request.target_vectors));
    if (!request.terms.empty()) LATHE_RETURN_IF_ERROR(fp.add_input("terms", request.terms));
    if (!request.force && stage_up_to_date(request.output, fp)) {
        AlignMapResult skipped;
        skipped.output = request.output;
        skipped.report = report;
        skipped.skipped = true;
        return skipped;
    }
    LATHE_ASSIGN_OR_RETURN(
        TokenVectors sv, align_load_vectors(request.source_vectors, source.tokenizer.vocab_size()));
    LATHE_ASSIGN_OR_RETURN(
        TokenVectors tv, align_load_vectors(request.target_vectors, target.tokenizer.vocab_size()));
    std::vector<int32_t> terms;
    if (!request.terms.empty()) {
        LATHE_ASSIGN_OR_RETURN(terms, align_read_terms(request.terms, target));
    }
    LATHE_ASSIGN_OR_RETURN(AlignMapResult result,
                           align_map_compute(source, target, sv, tv, terms, request));
    result.output = request.output;
    result.report = report;

    std::string json = "{\n";
    std::string tsv = "target_id\ttoken\tdecision\tsource_id\tsource_token\tsimilarity\n";
    for (size_t t = 0; t < result.entries.size(); ++t) {
        const AlignEntry& e = result.entries[t];
        json += fmt::format("\t\"{}\": {}{}\n", t, e.source_id,
                            t + 1 < result.entries.size() ? "," : "");
        tsv += fmt::format("{}\t{}\t{}\t{}\t{}\t{:.6g}\n", t,
                           escape_tsv(target.tokenizer.id_to_token(int32_t(t)).value_or("")),
                           align_decision_name(e.decision), e.source_id,
                           escape_tsv(source.tokenizer.id_to_token(e.source_id).value_or("")),
                           e.similarity);
    }
    json += "}\n";
    LATHE_RETURN_IF_ERROR(file_write_atomic(result.output, json));
    LATHE_RETURN_IF_ERROR(file_write_atomic(result.report, tsv));
    LATHE_RETURN_IF_ERROR(stage_write_manifest(result.output, fp, {result.output, result.report}));
    return result;
}

Result<std::vector<int32_t>> align_read_map(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    Json j = json_parse<Json>(text);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument_error(
            "{}: expected a JSON object {{\"target_id\": source_id, ...}} (TokAlign's "
            "map format)",
            path);
    }
    std::vector<int32_t> map(j.size(), -1);
    for (const auto& [key, value] : j.items()) {
        int64_t t = -1;
        auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), t);
        if (ec != std::errc() || p != key.data() + key.size() || t < 0) {
            return invalid_argument_error("{}: key '{}' is not a target token id", path,
                                          escape_for_message(key));
        }
        if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
            value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
            return invalid_argument_error("{}: \"{}\": expected a non-negative integer source id",
                                          path, key);
        }
        if (t >= int64_t(map.size())) {
            return invalid_argument_error(
                "{}: target id {} but only {} entries: every id from 0 to the largest "
                "must have one",
                path, t, map.size());
        }
        map[size_t(t)] = int32_t(value.get<int64_t>());
    }
    for (size_t t = 0; t < map.size(); ++t) {
        if (map[t] < 0) return invalid_argument_error("{}: target id {} has no entry", path, t);
    }
    return map;
}

Result<std::vector<AlignDecision>> align_read_report(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    std::vector<AlignDecision> out;
    int64_t line_no = 0;
    for (std::string_view line : split(text, '\n')) {
        ++line_no;
        if (line.empty() || line_no == 1) continue;
        std::vector<std::string_view> f = split(line, '\t');
        if (f.size() < 4)
            return invalid_argument_error("{}:{}: expected 6 tab-separated fields", path, line_no);
        int64_t t = -1;
        auto [p, ec] = std::from_chars(f[0].data(), f[0].data() + f[0].size(), t);
        if (ec != std::errc() || t != int64_t(out.size())) {
            return invalid_argument_error("{}:{}: expected target id {}, got '{}'", path, line_no,
                                          out.size(), escape_for_message(f[0]));
        }
        std::optional<AlignDecision> d = align_decision_from_name(f[2]);
        if (!d) {
            return invalid_argument_error(
                "{}:{}: unknown decision '{}' (gold, term, fvt, aligned, threshold)", path, line_no,
                escape_for_message(f[2]));
        }
        out.push_back(*d);
    }
    return out;
}

std::string align_map_result_json(const AlignMapResult& r) {
    return fmt::format(
        "{{\"output\": {}, \"report\": {}, \"target_tokens\": {}, \"gold\": {}, "
        "\"gold_exact\": {}, \"terms\": {}, \"fvt\": {}, \"aligned\": {}, \"threshold\": {}, "
        "\"pivots\": {}, \"device\": \"{}\", \"seconds_top2\": {:.3f}, \"skipped\": {}}}",
        Json(r.output).dump(), Json(r.report).dump(), r.entries.size(), r.gold, r.gold_exact,
        r.terms, r.fvt, r.aligned, r.below_threshold, r.pivots, r.device, r.seconds_top2,
        r.skipped);
}

}  // namespace lathe
