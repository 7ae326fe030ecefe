// Fuzzes every reader of user files from real seed files (see fuzz_harness.h for the mutator and
// the budget). Each input must be accepted or rejected with a Status error; a crash, an escaped
// exception or a hang fails the test. Accepted inputs are also used, so that a reader that accepts
// a file and then fails on its contents is found too.

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "data/indexed_dataset.h"
#include "data/jsonl.h"
#include "fuzz/fuzz_harness.h"
#include "io/config.h"
#include "io/file.h"
#include "io/input.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe::fuzz {
namespace {

const std::string kShared = LATHE_SHARED_DIR;
const std::string kSource = LATHE_SOURCE_DIR;

std::string read_file(const std::string& path) {
    auto text = file_read_all(path);
    EXPECT_TRUE(text.ok()) << "a seed file is missing: " << text.status().to_string();
    return text.ok() ? *text : std::string();
}

// A folder of its own per test process, removed at the end; in memory (/dev/shm) where there is
// one, since every input is written as a file.
std::filesystem::path scratch_root() {
    std::error_code ec;
    if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
    return std::filesystem::temp_directory_path();
}

class ScratchDir {
public:
    explicit ScratchDir(const std::string& name)
        : path_(scratch_root() / ("lathe_fuzz_" + name + "_" + std::to_string(getpid()))) {
        std::filesystem::create_directories(path_);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    std::filesystem::path path_;
};

// Writes a new file (removing the old one first: ext4 flushes a file truncated and rewritten on
// close, which would make each input cost a disk write).
Status write_bytes(const std::string& path, std::string_view bytes) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return io_error("cannot write {}", path);
    return ok_status();
}

void expect_clean(const FuzzReport& r, const std::string& name) {
    EXPECT_TRUE(r.failure.empty()) << r.failure;
    if (std::getenv("LATHE_FUZZ_REPLAY") != nullptr) return;
    // The mutants must reach both verdicts, or the target tests nothing past its first check.
    EXPECT_GT(r.runs, r.accepted) << name << ": no mutated input was rejected";
    std::printf("%s: %llu inputs (%llu accepted) in %.1f s, seed %llu\n", name.c_str(),
                static_cast<unsigned long long>(r.runs),
                static_cast<unsigned long long>(r.accepted), r.seconds,
                static_cast<unsigned long long>(r.seed));
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

// A shared tokenizer cut to its first `keep` vocabulary entries (plus the added tokens) and the
// merges among them, with every other part as it is: small enough to load thousands of times.
std::string shrink_tokenizer(const std::string& path, int64_t keep) {
    nlohmann::json j = nlohmann::json::parse(read_file(path));
    std::unordered_set<std::string> added, kept;
    for (const auto& t : j["added_tokens"]) added.insert(t["content"].get<std::string>());
    nlohmann::json vocab = nlohmann::json::object();
    for (const auto& [token, id] : j["model"]["vocab"].items()) {
        if (id.get<int64_t>() < keep || added.count(token) > 0) {
            vocab[token] = id;
            kept.insert(token);
        }
    }
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& m : j["model"]["merges"]) {
        std::string a, b;
        if (m.is_string()) {
            const std::string s = m.get<std::string>();
            const size_t sp = s.find(' ');
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else {
            a = m[0].get<std::string>();
            b = m[1].get<std::string>();
        }
        if (kept.count(a) > 0 && kept.count(b) > 0 && kept.count(a + b) > 0) merges.push_back(m);
    }
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = merges;
    return j.dump(1);
}

std::vector<std::string> tokenizer_seeds() {
    std::vector<std::string> seeds;
    for (const char* name : {"gpt2", "llama2", "llama3", "qwen3", "gpt-neox-20b"}) {
        seeds.push_back(shrink_tokenizer(kShared + "/tokenizers/" + name + ".json", 600));
    }
    return seeds;
}

TEST(Fuzz, TokenizerJson) {
    FuzzTarget t;
    t.name = "tokenizer_json";
    t.seeds = tokenizer_seeds();
    t.dictionary = {"\"type\"",
                    "\"Split\"",
                    "\"Regex\"",
                    "\"String\"",
                    "\"pattern\"",
                    "\"Sequence\"",
                    "\"ByteLevel\"",
                    "\"Metaspace\"",
                    "\"Replace\"",
                    "\"NFC\"",
                    "\"NFKD\"",
                    "\"Prepend\"",
                    "\"Strip\"",
                    "\"TemplateProcessing\"",
                    "\"BPE\"",
                    "\"WordPiece\"",
                    "\"byte_fallback\": true",
                    "\"ignore_merges\"",
                    "\"id\": 2147483647",
                    "\"id\": -1",
                    "null",
                    "true",
                    "[]",
                    "{}",
                    "\"\"",
                    "\"(a)\"",
                    "\"(?=x)\"",
                    "\"\\\\p{L}+\"",
                    "\"\\ud800\"",
                    "\"<0x41>\"",
                    "\"special\": true",
                    "\"content\": \"<s>\"",
                    "\"single\"",
                    "\"pair\""};
    const std::vector<std::string> texts = {
        "Hello world, it's 2026!",         "  tabs\tand\nnewlines ",
        "naïve café — 日本語 🙂", "<|endoftext|><s></s>",
        std::string("\xff\xfe bad utf8"),  ""};
    t.run = [&](std::string_view input) -> Status {
        LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_json(input, "fuzz.json"));
        for (const std::string& text : texts) {
            auto ids = tok.encode(text, /*add_special=*/true);
            if (!ids.ok()) continue;
            auto back = tok.decode(*ids, /*skip_special=*/false);
            (void)back;
        }
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// ---------------------------------------------------------------------------------------------
// safetensors

TEST(Fuzz, Safetensors) {
    ScratchDir dir("safetensors");
    std::vector<float> f32(6, 1.5f);
    std::vector<uint16_t> bf16(4, 0x3f80);
    std::vector<int64_t> i64(1, 7);
    std::vector<uint8_t> u8(3, 9);
    const std::vector<SafetensorsWriteTensor> tensors = {
        {"model.embed_tokens.weight", SafetensorsDtype::kF32, {2, 3}, f32.data(), 24},
        {"lm_head.weight", SafetensorsDtype::kBF16, {4}, bf16.data(), 8},
        {"step", SafetensorsDtype::kI64, {}, i64.data(), 8},
        {"empty", SafetensorsDtype::kF32, {0, 5}, nullptr, 0},
        {"bytes", SafetensorsDtype::kU8, {3}, u8.data(), 3}};
    FuzzTarget t;
    t.name = "safetensors";
    for (size_t n : {size_t{1}, size_t{3}, tensors.size()}) {
        const std::string path = dir.file("seed.safetensors");
        ASSERT_TRUE(safetensors_write_file(path, std::span(tensors.data(), n),
                                           safetensors_default_metadata())
                        .ok());
        t.seeds.push_back(read_file(path));
    }
    // Two real checkpoints written by transformers (the small test fixtures).
    for (const char* model : {"gpt_neox_sequential", "llama_bias_packed"}) {
        t.seeds.push_back(
            read_file(kSource + "/tests/fixtures/models/" + model + "/model.safetensors"));
    }
    t.dictionary = {"\"dtype\"",
                    "\"shape\"",
                    "\"data_offsets\"",
                    "\"__metadata__\"",
                    "\"F32\"",
                    "\"BF16\"",
                    "\"F4\"",
                    "\"F6_E2M3\"",
                    "\"I64\"",
                    "\"BOOL\"",
                    "\"C64\"",
                    "[0, 0]",
                    "[18446744073709551615]",
                    "[-1]",
                    "[4294967296, 4294967296]",
                    "null",
                    "{}",
                    "[]",
                    "\"format\": 1"};
    const std::string path = dir.file("fuzz.safetensors");
    t.run = [&](std::string_view input) -> Status {
        LATHE_RETURN_IF_ERROR(write_bytes(path, input));
        LATHE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
        uint64_t sum = 0;
        for (const SafetensorsTensor& tensor : file.tensors()) {
            for (uint8_t b : tensor.bytes()) sum += b;
            auto view = tensor.view();
            (void)view;
            sum += tensor.numel();
            auto again = file.get(tensor.name);
            if (!again.ok()) return again.status();
        }
        (void)file.get("no such tensor");
        return sum == 0xffffffffffffffffULL ? internal_error("unreachable") : ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// ---------------------------------------------------------------------------------------------
// .idx/.bin token files. One input holds both files: an 8-byte length of the .idx, the .idx,
// then the .bin.

std::string pack_pair(const std::string& idx, const std::string& bin) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(idx.size()) >> (8 * i));
    return out + idx + bin;
}

TEST(Fuzz, IndexedDataset) {
    ScratchDir dir("indexed");
    FuzzTarget t;
    t.name = "indexed_dataset";
    for (TokenDType dtype : {TokenDType::kUInt16, TokenDType::kInt32, TokenDType::kUInt8}) {
        const std::string prefix = dir.file("seed");
        auto w = IndexedDatasetWriter::create(prefix, dtype);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        const std::vector<std::vector<int32_t>> docs = {
            {1, 2, 3}, {4}, {5, 6, 7, 8, 9}, {}, {10, 11}};
        for (const auto& d : docs) ASSERT_TRUE(w->add_document(d).ok());
        ASSERT_TRUE(w->add_sequence(std::vector<int32_t>{12, 13}).ok());
        ASSERT_TRUE(w->add_sequence(std::vector<int32_t>{14}).ok());
        ASSERT_TRUE(w->add_document(std::vector<int32_t>{15}).ok());
        ASSERT_TRUE(w->finalize().ok());
        ASSERT_TRUE(w->commit().ok());
        t.seeds.push_back(
            pack_pair(read_file(indexed_idx_path(prefix)), read_file(indexed_bin_path(prefix))));
    }
    t.dictionary = {std::string("MMIDIDX\0\0", 9), std::string("\x01\0\0\0\0\0\0\0", 8)};
    const std::string prefix = dir.file("fuzz");
    t.run = [&](std::string_view input) -> Status {
        uint64_t idx_len = 0;
        for (int i = 0; i < 8 && i < int(input.size()); ++i)
            idx_len |= uint64_t(static_cast<unsigned char>(input[i])) << (8 * i);
        const std::string_view rest = input.size() > 8 ? input.substr(8) : std::string_view();
        idx_len = std::min<uint64_t>(idx_len, rest.size());
        LATHE_RETURN_IF_ERROR(write_bytes(indexed_idx_path(prefix), rest.substr(0, idx_len)));
        LATHE_RETURN_IF_ERROR(write_bytes(indexed_bin_path(prefix), rest.substr(idx_len)));
        (void)indexed_read_header(indexed_idx_path(prefix));
        LATHE_ASSIGN_OR_RETURN(IndexedDataset ds, IndexedDataset::open(prefix));
        std::vector<int64_t> tokens;
        uint64_t total = 0;
        for (uint64_t i = 0; i < ds.sequence_count(); ++i) {
            tokens.clear();
            ds.read_sequence(i, tokens);
            total += tokens.size();
        }
        for (uint64_t k = 0; k < ds.document_count(); ++k) {
            tokens.clear();
            ds.read_document(k, tokens);
            if (tokens.size() != ds.document_length(k))
                return internal_error("document {} length disagrees", k);
        }
        if (total != ds.token_count()) return internal_error("token count disagrees");
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// ---------------------------------------------------------------------------------------------
// Text inputs (plain, gzip, zstd) cut into lines and blocks, and JSONL fields.

std::string gzip_bytes(const std::string& text) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&z, text.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
    z.avail_in = static_cast<uInt>(text.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string zstd_bytes(const std::string& text) {
    std::string out(ZSTD_compressBound(text.size()), '\0');
    const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

const std::string kText =
    "First line of the corpus.\r\nSecond line\n\n   \n\tThird block starts\nand goes on\n"
    "{\"text\": \"json-looking line\"}\nnaïve café 日本語\n\n\nlast line without newline";

TEST(Fuzz, TextInput) {
    ScratchDir dir("text");
    FuzzTarget t;
    t.name = "text_input";
    t.seeds = {kText,
               gzip_bytes(kText),
               gzip_bytes(kText) + gzip_bytes("second member\n"),
               zstd_bytes(kText),
               zstd_bytes(kText) + zstd_bytes("second frame\n"),
               ""};
    t.dictionary = {std::string("\x1f\x8b\x08\x00", 4),
                    std::string("\x28\xb5\x2f\xfd", 4),
                    std::string("\x50\x2a\x4d\x18", 4),
                    "\r\n",
                    "\n\n",
                    "\xfd\x37\x7a\x58\x5a",
                    "BZh"};
    const std::string path = dir.file("input.txt");
    t.run = [&](std::string_view input) -> Status {
        LATHE_RETURN_IF_ERROR(write_bytes(path, input));
        for (TextRecordFormat format : {TextRecordFormat::kLines, TextRecordFormat::kBlocks}) {
            LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(path));
            TextRecordReader reader(in, format, /*max_record_bytes=*/4096);
            TextRecord rec;
            uint64_t last_line = 0;
            for (;;) {
                LATHE_ASSIGN_OR_RETURN(const bool more, reader.next(rec));
                if (!more) break;
                if (rec.line <= last_line) return internal_error("record lines go backwards");
                last_line = rec.line;
            }
        }
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

TEST(Fuzz, JsonlFields) {
    FuzzTarget t;
    t.name = "jsonl";
    t.seeds = {
        R"({"text": "plain"})",
        R"({"id": 3, "meta": {"a": [1, 2.5, null, true]}, "text": "x\n\"q\"\\ \u00e9 \ud83d\ude00"})",
        R"({"text": "first", "text": "duplicate key, last wins"})",
        "  {\"text\" : \"spaces around\" }  \r",
        R"({"messages": [{"role": "user", "content": "hi"}], "text": ""})"};
    t.dictionary = {"\"text\"", "\\u0000", "\\ud800", "\\udc00", "\\\"",     "\\\\",
                    "null",     "true",    "1e999",   "-0.0",    "{",        "}",
                    "[",        "]",       ":",       ",",       "\xc3\x28", "\xed\xa0\x80"};
    JsonlFieldReader reader("text");
    t.run = [&](std::string_view input) -> Status {
        (void)reader.has_field(input, "messages");
        LATHE_ASSIGN_OR_RETURN(const std::string_view text, reader.extract(input));
        if (text.size() > input.size()) return internal_error("field longer than its line");
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// ---------------------------------------------------------------------------------------------
// YAML configs: the shipped configs, read with a schema of their own keys (types from the
// values), so that mutants reach the typing of every kind of value.

void add_keys(const YAML::Node& node, const std::string& prefix, ConfigSchema& schema) {
    for (const auto& kv : node) {
        const std::string name =
            prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
        const YAML::Node& v = kv.second;
        if (v.IsMap()) {
            add_keys(v, name, schema);
            continue;
        }
        if (schema.find(name) != nullptr) continue;
        ConfigType type = ConfigType::kString;
        if (v.IsSequence()) {
            bool numbers = v.size() > 0;
            for (const auto& item : v)
                numbers = numbers && item.IsScalar() &&
                          yaml_core_resolve(item.Scalar()).type >= YamlCoreType::kInt &&
                          yaml_core_resolve(item.Scalar()).type <= YamlCoreType::kFloat;
            type = numbers ? ConfigType::kFloatList : ConfigType::kStringList;
        } else if (v.IsScalar() && v.Tag() == "?") {
            switch (yaml_core_resolve(v.Scalar()).type) {
                case YamlCoreType::kInt:
                    type = ConfigType::kInt;
                    break;
                case YamlCoreType::kFloat:
                    type = ConfigType::kFloat;
                    break;
                case YamlCoreType::kBool:
                    type = ConfigType::kBool;
                    break;
                default:
                    break;
            }
        }
        schema.add({name, type, "", "fuzzed key"});
    }
}

TEST(Fuzz, YamlConfig) {
    FuzzTarget t;
    t.name = "yaml_config";
    ConfigSchema schema;
    for (const auto& entry : std::filesystem::directory_iterator(kSource + "/configs")) {
        if (entry.path().extension() != ".yaml") continue;
        t.seeds.push_back(read_file(entry.path().string()));
        add_keys(YAML::Load(t.seeds.back()), "", schema);
    }
    ASSERT_GE(t.seeds.size(), 3u);
    t.dictionary = {"&a ",      "*a",     "<<: ",
                    "!!int ",   "!!str ", "!!float ",
                    "!custom ", "? ",     "- ",
                    ": ",       "{",      "}",
                    "[",        "]",      "'",
                    "\"",       "|\n",    ">-\n",
                    "~",        "null",   ".inf",
                    ".nan",     "0x",     "0o",
                    "1e3",      "\t",     "%YAML 1.2\n---\n",
                    "---\n",    "...\n",  "#"};
    t.run = [&](std::string_view input) -> Status {
        LATHE_ASSIGN_OR_RETURN(Config cfg,
                               Config::load_text(schema, std::string(input), "fuzz.yaml"));
        // What an accepted file resolves to reads back the same.
        const std::string yaml = cfg.to_yaml();
        auto again = Config::load_text(schema, yaml, "resolved.yaml");
        if (!again.ok()) {
            return internal_error("the resolved config does not read back: {}\n{}",
                                  again.status().message(), yaml);
        }
        if (again->to_yaml() != yaml)
            return internal_error("the resolved config changes on reload");
        return ok_status();
    };
    const FuzzReport r = fuzz_run(t);
    expect_clean(r, t.name);
}

// ---------------------------------------------------------------------------------------------
// Chat templates (Jinja) from the shared tokenizer_config.json files, rendered with a
// conversation that uses every role.

TEST(Fuzz, ChatTemplate) {
    FuzzTarget t;
    t.name = "chat_template";
    std::vector<ChatTemplate> bases;
    // llama2's config has no chat_template: only the two that do.
    for (const char* name : {"llama3", "qwen3"}) {
        const std::string path = kShared + "/tokenizers/" + name + ".tokenizer_config.json";
        auto base = ChatTemplate::load(path);
        ASSERT_TRUE(base.ok()) << base.status().to_string();
        t.seeds.push_back(base->source());
        bases.push_back(std::move(*base));
    }
    t.dictionary = {"{{",
                    "}}",
                    "{%",
                    "%}",
                    "{#",
                    "#}",
                    "{%- ",
                    " -%}",
                    "endif",
                    "endfor",
                    "loop.index",
                    "messages",
                    "message['content']",
                    "raise_exception('x')",
                    "| tojson",
                    "| trim",
                    "| length",
                    "range(",
                    "namespace(",
                    "set ",
                    "if ",
                    "for ",
                    "in ",
                    "else",
                    "elif ",
                    "macro ",
                    "call ",
                    "not ",
                    " ~ ",
                    " + ",
                    " * 3",
                    "[::-1]",
                    "[1:]",
                    ".items()",
                    ".strip()",
                    "none",
                    "None",
                    "'",
                    "\""};
    const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello."},
        {"role": "user", "content": "And now?"}])");
    size_t which = 0;
    t.run = [&](std::string_view input) -> Status {
        const ChatTemplate& base = bases[which++ % bases.size()];
        LATHE_ASSIGN_OR_RETURN(ChatTemplate tpl, base.with_template(input, "fuzz.jinja"));
        LATHE_ASSIGN_OR_RETURN(std::string text,
                               tpl.render(messages, /*add_generation_prompt=*/true));
        (void)text;
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// tokenizer_config.json (special tokens, chat_template as a string or a list of named ones).
TEST(Fuzz, TokenizerConfig) {
    FuzzTarget t;
    t.name = "tokenizer_config";
    for (const char* name : {"llama2", "llama3", "qwen3"}) {
        t.seeds.push_back(read_file(kShared + "/tokenizers/" + name + ".tokenizer_config.json"));
    }
    // llama2's config has no template: give it one in the list form.
    nlohmann::json listed = nlohmann::json::parse(t.seeds[0]);
    listed["chat_template"] = {
        {{"name", "default"},
         {"template", "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}},
        {{"name", "tool_use"}, {"template", "{{ tools | tojson }}"}}};
    t.seeds[0] = listed.dump(2);
    t.dictionary = {"\"chat_template\"",
                    "\"eos_token\"",
                    "\"bos_token\"",
                    "\"content\"",
                    "\"name\"",
                    "\"template\"",
                    "\"default\"",
                    "null",
                    "[]",
                    "{}",
                    "\"\"",
                    "\"added_tokens_decoder\"",
                    "{{",
                    "{%",
                    "\\u0000"};
    const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
        R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])");
    t.run = [&](std::string_view input) -> Status {
        LATHE_ASSIGN_OR_RETURN(ChatTemplate tpl,
                               ChatTemplate::from_config(input, "tokenizer_config.json"));
        LATHE_ASSIGN_OR_RETURN(std::string text,
                               tpl.render(messages, /*add_generation_prompt=*/false));
        (void)text;
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// config.json of Hugging Face models (the fixtures of every supported family).
TEST(Fuzz, HfModelConfig) {
    FuzzTarget t;
    t.name = "hf_config";
    for (const auto& entry :
         std::filesystem::directory_iterator(kSource + "/tests/fixtures/models")) {
        const std::filesystem::path config = entry.path() / "config.json";
        if (std::filesystem::exists(config)) t.seeds.push_back(read_file(config.string()));
    }
    ASSERT_GE(t.seeds.size(), 5u);
    t.dictionary = {"\"model_type\"",
                    "\"llama\"",
                    "\"gpt2\"",
                    "\"gpt_neox\"",
                    "\"qwen2\"",
                    "\"mistral\"",
                    "\"rope_scaling\"",
                    "\"num_attention_heads\"",
                    "\"num_key_value_heads\"",
                    "\"head_dim\"",
                    "\"tie_word_embeddings\"",
                    "\"sliding_window\"",
                    "null",
                    "true",
                    "-1",
                    "0",
                    "2147483648",
                    "1e309"};
    t.run = [&](std::string_view input) -> Status {
        LATHE_ASSIGN_OR_RETURN(HfModelConfig config, hf_config_parse(input, "config.json"));
        LATHE_ASSIGN_OR_RETURN(std::string again, hf_config_to_json(config));
        (void)again;
        return ok_status();
    };
    expect_clean(fuzz_run(t), t.name);
}

// The mutator itself: deterministic for a seed, and it changes its input.
TEST(Fuzz, MutatorIsDeterministicAndMutates) {
    const std::vector<std::string> others = {"other input"};
    const std::vector<std::string> dict = {"TOKEN"};
    Mutator a(42), b(42);
    int changed = 0;
    for (int i = 0; i < 200; ++i) {
        std::string x = "0123456789 the quick brown fox", y = x;
        a.mutate(x, others, dict, 1 << 20);
        b.mutate(y, others, dict, 1 << 20);
        ASSERT_EQ(x, y);
        changed += x != "0123456789 the quick brown fox";
    }
    EXPECT_GT(changed, 150);
}

}  // namespace
}  // namespace lathe::fuzz
