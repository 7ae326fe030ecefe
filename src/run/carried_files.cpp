#include "run/carried_files.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "io/file.h"
#include "io/json.h"
#include "run/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace fs = std::filesystem;

namespace {

Status add_file(std::vector<CarriedFile>& out, const fs::path& from, std::string name) {
    LATHE_ASSIGN_OR_RETURN(std::string bytes, file_read_all(from.string()));
    out.push_back(CarriedFile{std::move(name), std::move(bytes)});
    return ok_status();
}

bool is_file(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
}

// The files of `folder`/kHfChatTemplateFolder, sorted by name.
Status add_chat_templates(std::vector<CarriedFile>& out, const fs::path& folder) {
    const fs::path templates = folder / kHfChatTemplateFolder;
    std::error_code ec;
    if (!fs::is_directory(templates, ec)) return ok_status();
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(templates, ec))
        if (e.is_regular_file()) files.push_back(e.path());
    if (ec) return io_error("{}: cannot list: {}", templates.string(), ec.message());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files)
        LATHE_RETURN_IF_ERROR(
            add_file(out, f, (fs::path(kHfChatTemplateFolder) / f.filename()).string()));
    return ok_status();
}

}  // namespace

Result<std::vector<CarriedFile>> carried_files_read(const std::string& folder,
                                                    std::span<const std::string_view> names) {
    std::vector<CarriedFile> out;
    for (std::string_view name : names) {
        const fs::path p = fs::path(folder) / name;
        if (is_file(p)) LATHE_RETURN_IF_ERROR(add_file(out, p, std::string(name)));
    }
    LATHE_RETURN_IF_ERROR(add_chat_templates(out, folder));
    // Files lathe has not read otherwise are checked on the way: carried as they are, a damaged
    // JSON file would reach the output (and the tools that load it) as if it were fine.
    for (const CarriedFile& f : out) {
        if (!f.name.ends_with(".json")) continue;
        const std::string problem = json_problem(f.bytes);
        if (!problem.empty()) {
            return invalid_argument_error(
                "{}: not valid JSON ({}); it is carried to the output as it is: fix or remove it",
                (fs::path(folder) / f.name).string(), problem);
        }
    }
    return out;
}

Result<std::vector<CarriedFile>> carried_tokenizer_files(const std::string& tokenizer_path,
                                                         int64_t model_max_length) {
    const fs::path src = tokenizer_path;
    const fs::path dir = src.parent_path();
    std::vector<CarriedFile> out;
    LATHE_RETURN_IF_ERROR(add_file(out, src, "tokenizer.json"));
    for (std::string_view name : kHfTokenizerFiles) {
        if (name == "tokenizer.json") continue;  // the tokenizer itself, under whatever name
        if (is_file(dir / name))
            LATHE_RETURN_IF_ERROR(add_file(out, dir / name, std::string(name)));
    }
    LATHE_RETURN_IF_ERROR(add_chat_templates(out, dir));
    const auto has = [&](std::string_view name) {
        return std::any_of(out.begin(), out.end(),
                           [&](const CarriedFile& f) { return f.name == name; });
    };
    if (has("tokenizer_config.json")) return out;
    // A tokenizer stored as NAME.json may have NAME.tokenizer_config.json beside it.
    const fs::path named = dir / (src.stem().string() + ".tokenizer_config.json");
    if (is_file(named)) {
        LATHE_RETURN_IF_ERROR(add_file(out, named, "tokenizer_config.json"));
        return out;
    }
    LATHE_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
    LATHE_ASSIGN_OR_RETURN(const TokenizerSpecialTokens specials,
                           tokenizer_special_tokens(tokenizer, tokenizer_path));
    out.push_back(CarriedFile{"tokenizer_config.json",
                              special_tokens_tokenizer_config(specials, model_max_length)});
    return out;
}

Status carried_files_write(const std::vector<CarriedFile>& files, const std::string& dir) {
    std::set<fs::path> subfolders;
    for (const CarriedFile& f : files) {
        const fs::path to = fs::path(dir) / f.name;
        const fs::path parent = to.parent_path();
        if (parent != fs::path(dir) && subfolders.insert(parent).second) {
            std::error_code ec;
            fs::create_directories(parent, ec);
            if (ec) return io_error("{}: cannot create: {}", parent.string(), ec.message());
        }
        LATHE_RETURN_IF_ERROR(file_write_atomic(to.string(), f.bytes));
    }
    for (const fs::path& sub : subfolders) LATHE_RETURN_IF_ERROR(folder_sync(sub.string()));
    return ok_status();
}

std::vector<std::string> carried_file_names(const std::vector<CarriedFile>& files) {
    std::vector<std::string> names;
    names.reserve(files.size());
    for (const CarriedFile& f : files) names.push_back(f.name);
    return names;
}

}  // namespace lathe
