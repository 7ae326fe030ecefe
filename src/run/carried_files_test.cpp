#include "run/carried_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/file.h"
#include "run/special_tokens.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

const std::string kTokenizers = std::string(LATHE_SHARED_DIR) + "/tokenizers";

std::string slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

void put(const fs::path& path, const std::string& bytes) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
}

class CarriedFiles : public ::testing::Test {
protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() / ("carried_files_test_" + std::to_string(::getpid()));
        fs::remove_all(root_);
        fs::create_directories(root_ / "src");
    }
    void TearDown() override { fs::remove_all(root_); }
    fs::path dir(const std::string& name) {
        fs::create_directories(root_ / name);
        return root_ / name;
    }
    fs::path root_;
};

// A tokenizer without a tokenizer_config.json: the config made at read time is, byte for byte,
// what special_tokens_write_tokenizer_config writes into a checkpoint folder holding the
// tokenizer and the model's config.json.
TEST_F(CarriedFiles, AMadeTokenizerConfigIsWhatTheCheckpointFolderWouldGet) {
    const fs::path tok = root_ / "src" / "gpt2.json";
    fs::copy_file(kTokenizers + "/gpt2.json", tok);
    Result<std::vector<CarriedFile>> files = carried_tokenizer_files(tok.string(), 1024);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    EXPECT_EQ(carried_file_names(*files),
              (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
    const fs::path out = dir("out");
    ASSERT_TRUE(carried_files_write(*files, out.string()).ok());
    EXPECT_EQ(slurp(out / "tokenizer.json"), slurp(tok));

    const fs::path ref = dir("ref");
    fs::copy_file(tok, ref / "tokenizer.json");
    put(ref / "config.json",
        R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
            "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 1024})");
    Result<bool> wrote = special_tokens_write_tokenizer_config(ref.string());
    ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
    ASSERT_TRUE(*wrote);
    EXPECT_EQ(slurp(out / "tokenizer_config.json"), slurp(ref / "tokenizer_config.json"));
}

// NAME.json with NAME.tokenizer_config.json, a slow tokenizer's merges and two chat templates:
// each carried under its checkpoint name, with the bytes as read even after the sources change.
TEST_F(CarriedFiles, NamedConfigExtrasAndTemplatesAreKeptAsRead) {
    const fs::path src = root_ / "src";
    fs::copy_file(kTokenizers + "/llama2.json", src / "llama2.json");
    put(src / "llama2.tokenizer_config.json", "{\"named\": true}\n");
    put(src / "merges.txt", "a b\n");
    put(src / "additional_chat_templates" / "tool.jinja", "{{ tool }}");
    put(src / "additional_chat_templates" / "rag.jinja", "{{ rag }}");
    put(src / "README.md", "not a tokenizer file");
    Result<std::vector<CarriedFile>> files =
        carried_tokenizer_files((src / "llama2.json").string(), 4096);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    EXPECT_EQ(carried_file_names(*files),
              (std::vector<std::string>{
                  "tokenizer.json", "merges.txt", "additional_chat_templates/rag.jinja",
                  "additional_chat_templates/tool.jinja", "tokenizer_config.json"}));
    const std::string tokenizer_bytes = slurp(src / "llama2.json");
    put(src / "merges.txt", "changed\n");
    put(src / "llama2.tokenizer_config.json", "{}\n");
    for (const char* name : {"ckpt1", "ckpt2"}) {
        const fs::path out = dir(name);
        ASSERT_TRUE(carried_files_write(*files, out.string()).ok());
        EXPECT_EQ(slurp(out / "tokenizer.json"), tokenizer_bytes);
        EXPECT_EQ(slurp(out / "merges.txt"), "a b\n");
        EXPECT_EQ(slurp(out / "tokenizer_config.json"), "{\"named\": true}\n");
        EXPECT_EQ(slurp(out / "additional_chat_templates" / "rag.jinja"), "{{ rag }}");
        EXPECT_EQ(slurp(out / "additional_chat_templates" / "tool.jinja"), "{{ tool }}");
        EXPECT_FALSE(fs::exists(out / "README.md"));
    }
}

TEST_F(CarriedFiles, ReadTakesTheNamedFilesThatExistInOrder) {
    const fs::path src = root_ / "src";
    put(src / "LICENSE", "license");
    put(src / "tokenizer.json", "{}");
    fs::create_directories(src / "README.md");  // a folder of that name is not carried
    const std::string_view names[] = {"README.md", "tokenizer.json", "vocab.json", "LICENSE"};
    Result<std::vector<CarriedFile>> files = carried_files_read(src.string(), names);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    EXPECT_EQ(carried_file_names(*files), (std::vector<std::string>{"tokenizer.json", "LICENSE"}));
    EXPECT_EQ((*files)[1].bytes, "license");
}

TEST_F(CarriedFiles, AMissingTokenizerIsAnErrorNamingIt) {
    const std::string path = (root_ / "src" / "absent.json").string();
    Result<std::vector<CarriedFile>> files = carried_tokenizer_files(path, 16);
    ASSERT_FALSE(files.ok());
    EXPECT_NE(files.status().message().find(path), std::string::npos) << files.status().to_string();
}

}  // namespace
}  // namespace lathe
