#include "run/eval_tasks_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "io/json.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// clang-format off
const std::set<std::string> kKeys = {
    "name", "kind", "data", "fewshot_data", "doc_to_text", "doc_to_choice", "doc_to_target",
    "description", "target_delimiter", "fewshot_delimiter", "num_fewshot", "fewshot_seed",
    "fewshot_sampler", "until", "max_gen_toks", "strip", "ignore_case", "ignore_punctuation"};
// clang-format on

std::string where(const std::string& file, const YAML::Node& n) {
    return n.Mark().is_null() ? file : fmt::format("{}:{}", file, n.Mark().line + 1);
}

Result<std::string> get_string(const std::string& file, const YAML::Node& n,
                               const std::string& key) {
    if (!n.IsScalar())
        return invalid_argument_error("{}: key '{}' must be a string", where(file, n), key);
    return n.as<std::string>();
}

Result<int64_t> get_int(const std::string& file, const YAML::Node& n, const std::string& key) {
    if (n.IsScalar()) {
        const std::string s = n.as<std::string>();
        int64_t v = 0;
        size_t used = 0;
        try {
            v = std::stoll(s, &used, 10);
        } catch (...) {
            used = 0;
        }
        if (used == s.size() && !s.empty()) return v;
    }
    return invalid_argument_error("{}: key '{}' must be an integer", where(file, n), key);
}

Result<bool> get_bool(const std::string& file, const YAML::Node& n, const std::string& key) {
    if (n.IsScalar()) {
        const std::string s = n.as<std::string>();
        if (s == "true" || s == "True" || s == "TRUE") return true;
        if (s == "false" || s == "False" || s == "FALSE") return false;
    }
    return invalid_argument_error("{}: key '{}' must be true or false", where(file, n), key);
}

Result<std::vector<std::string>> get_strings(const std::string& file, const YAML::Node& n,
                                             const std::string& key) {
    if (!n.IsSequence())
        return invalid_argument_error("{}: key '{}' must be a list of strings", where(file, n),
                                      key);
    std::vector<std::string> out;
    for (const YAML::Node& e : n) {
        if (!e.IsScalar())
            return invalid_argument_error("{}: key '{}' must be a list of strings", where(file, e),
                                          key);
        out.push_back(e.as<std::string>());
    }
    return out;
}

// Python's str() of a scalar JSON value, as Jinja renders it; an error for others.
Result<std::string> render_value(const ojson& v, const std::string& path) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return v.dump();
    if (v.is_boolean()) return std::string(v.get<bool>() ? "True" : "False");
    if (v.is_null()) return std::string("None");
    return invalid_argument_error(
        "'{}' is {} (templates render strings, integers, booleans and null; a list through "
        "| join)",
        path, v.type_name());
}

Result<const ojson*> lookup(const ojson& record, std::string_view path) {
    const ojson* cur = &record;
    size_t i = 0;
    auto ident = [&](size_t from) {
        size_t j = from;
        while (j < path.size() &&
               (std::isalnum(static_cast<unsigned char>(path[j])) || path[j] == '_'))
            ++j;
        return j;
    };
    bool first = true;
    while (i < path.size()) {
        if (first || path[i] == '.') {
            const size_t from = first ? i : i + 1;
            const size_t to = ident(from);
            if (to == from) return invalid_argument_error("'{}': not a field path", path);
            const std::string name(path.substr(from, to - from));
            if (!cur->is_object() || !cur->contains(name))
                return invalid_argument_error("no field '{}' (in '{}')", name, path);
            cur = &(*cur)[name];
            i = to;
            first = false;
        } else if (path[i] == '[') {
            const size_t close = path.find(']', i);
            if (close == std::string_view::npos)
                return invalid_argument_error("'{}': not a field path", path);
            const std::string idx(path.substr(i + 1, close - i - 1));
            size_t used = 0;
            int64_t k = -1;
            try {
                k = std::stoll(idx, &used);
            } catch (...) {
                used = 0;
            }
            if (used != idx.size() || idx.empty() || k < 0)
                return invalid_argument_error("'{}': index '{}' is not a number", path, idx);
            if (!cur->is_array() || k >= int64_t(cur->size()))
                return invalid_argument_error("'{}': index {} out of range", path, k);
            cur = &(*cur)[size_t(k)];
            i = close + 1;
        } else {
            return invalid_argument_error("'{}': not a field path", path);
        }
    }
    return cur;
}

std::string trim(std::string_view s) {
    const size_t b = s.find_first_not_of(" \t\n");
    if (b == std::string_view::npos) return "";
    const size_t e = s.find_last_not_of(" \t\n");
    return std::string(s.substr(b, e - b + 1));
}

// A field reference: no "{{" and a field of the record.
bool is_field(const std::string& s, const ojson& record) {
    return s.find("{{") == std::string::npos && record.is_object() && record.contains(s);
}

bool all_digits(const std::string& s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

Result<std::string> eval_template_render(const std::string& tmpl, const ojson& record) {
    std::string out;
    size_t i = 0;
    while (i < tmpl.size()) {
        const size_t open = tmpl.find("{{", i);
        if (open == std::string::npos) {
            out.append(tmpl, i, std::string::npos);
            break;
        }
        out.append(tmpl, i, open - i);
        const size_t close = tmpl.find("}}", open + 2);
        if (close == std::string::npos)
            return invalid_argument_error("template: '{{{{' without '}}}}'");
        const std::string expr = tmpl.substr(open + 2, close - open - 2);
        const size_t bar = expr.find('|');
        const std::string path = trim(expr.substr(0, bar));
        LATHE_ASSIGN_OR_RETURN(const ojson* v, lookup(record, path));
        if (bar == std::string::npos) {
            LATHE_ASSIGN_OR_RETURN(std::string s, render_value(*v, path));
            out += s;
        } else {
            const std::string filter = trim(expr.substr(bar + 1));
            std::string sep;
            if (filter != "join") {
                const bool call = filter.rfind("join(", 0) == 0 && filter.back() == ')';
                const std::string arg = call ? trim(filter.substr(5, filter.size() - 6)) : "";
                if (!call || arg.size() < 2 || (arg.front() != '"' && arg.front() != '\'') ||
                    arg.back() != arg.front())
                    return invalid_argument_error(
                        "template: filter '{}' (only join or join(\"SEP\") are known)", filter);
                sep = arg.substr(1, arg.size() - 2);
            }
            if (!v->is_array())
                return invalid_argument_error("'{}' is {}, join needs a list", path,
                                              v->type_name());
            for (size_t k = 0; k < v->size(); ++k) {
                if (k) out += sep;
                LATHE_ASSIGN_OR_RETURN(std::string s, render_value((*v)[k], path));
                out += s;
            }
        }
        i = close + 2;
    }
    return out;
}

Result<EvalTaskSpec> eval_task_load(const std::string& path) {
    YAML::Node root;
    try {
        root = YAML::LoadFile(path);
    } catch (const YAML::BadFile&) {
        return not_found_error("--tasks {}: cannot open", path);
    } catch (const YAML::Exception& e) {
        return invalid_argument_error("{}:{}: not valid YAML: {}", path, e.mark.line + 1, e.msg);
    }
    if (!root.IsMap())
        return invalid_argument_error("{}: a task file is a YAML map (name, kind, data, ...)",
                                      path);
    EvalTaskSpec s;
    s.file = path;
    const fs::path base = fs::path(path).parent_path();
    for (const auto& kv : root) {
        const std::string key = kv.first.as<std::string>();
        if (!kKeys.count(key)) {
            std::string known;
            for (const std::string& k : kKeys) known += (known.empty() ? "" : ", ") + k;
            return invalid_argument_error("{}: unknown key '{}' (known: {})", where(path, kv.first),
                                          key, known);
        }
    }
    auto need = [&](const char* key) -> Status {
        if (!root[key]) return invalid_argument_error("{}: missing required key '{}'", path, key);
        return ok_status();
    };
    for (const char* key : {"name", "kind", "data", "doc_to_text", "doc_to_target"})
        LATHE_RETURN_IF_ERROR(need(key));
    LATHE_ASSIGN_OR_RETURN(s.name, get_string(path, root["name"], "name"));
    LATHE_ASSIGN_OR_RETURN(const std::string kind, get_string(path, root["kind"], "kind"));
    if (kind == "multiple_choice") {
        s.kind = EvalTaskKind::kMultipleChoice;
    } else if (kind == "generate") {
        s.kind = EvalTaskKind::kGenerate;
    } else {
        return invalid_argument_error(
            "{}: key 'kind' is '{}'; expected multiple_choice or generate",
            where(path, root["kind"]), kind);
    }
    auto data_path = [&](const char* key, std::string& out) -> Status {
        LATHE_ASSIGN_OR_RETURN(const std::string p, get_string(path, root[key], key));
        const fs::path full = fs::path(p).is_absolute() ? fs::path(p) : base / p;
        if (!fs::is_regular_file(full))
            return not_found_error("{}: key '{}': no file {}", where(path, root[key]), key,
                                   full.string());
        out = full.string();
        return ok_status();
    };
    LATHE_RETURN_IF_ERROR(data_path("data", s.data));
    if (root["fewshot_data"]) LATHE_RETURN_IF_ERROR(data_path("fewshot_data", s.fewshot_data));
    LATHE_ASSIGN_OR_RETURN(s.doc_to_text, get_string(path, root["doc_to_text"], "doc_to_text"));
    LATHE_ASSIGN_OR_RETURN(s.doc_to_target,
                           get_string(path, root["doc_to_target"], "doc_to_target"));
    if (root["description"]) {
        LATHE_ASSIGN_OR_RETURN(s.description, get_string(path, root["description"], "description"));
    }
    if (root["target_delimiter"]) {
        LATHE_ASSIGN_OR_RETURN(s.target_delimiter,
                               get_string(path, root["target_delimiter"], "target_delimiter"));
    }
    if (root["fewshot_delimiter"]) {
        LATHE_ASSIGN_OR_RETURN(s.fewshot_delimiter,
                               get_string(path, root["fewshot_delimiter"], "fewshot_delimiter"));
    }
    if (root["num_fewshot"]) {
        LATHE_ASSIGN_OR_RETURN(s.num_fewshot, get_int(path, root["num_fewshot"], "num_fewshot"));
        if (s.num_fewshot < 0)
            return invalid_argument_error("{}: key 'num_fewshot' must be >= 0",
                                          where(path, root["num_fewshot"]));
    }
    if (root["fewshot_seed"]) {
        LATHE_ASSIGN_OR_RETURN(s.fewshot_seed, get_int(path, root["fewshot_seed"], "fewshot_seed"));
    }
    if (root["fewshot_sampler"]) {
        LATHE_ASSIGN_OR_RETURN(const std::string v,
                               get_string(path, root["fewshot_sampler"], "fewshot_sampler"));
        if (v != "random" && v != "first_n")
            return invalid_argument_error(
                "{}: key 'fewshot_sampler' is '{}'; expected random or first_n",
                where(path, root["fewshot_sampler"]), v);
        s.first_n = v == "first_n";
    }
    if (s.kind == EvalTaskKind::kMultipleChoice) {
        if (!root["doc_to_choice"])
            return invalid_argument_error(
                "{}: missing required key 'doc_to_choice' (kind multiple_choice)", path);
        const YAML::Node c = root["doc_to_choice"];
        if (c.IsSequence()) {
            LATHE_ASSIGN_OR_RETURN(s.choice_literal, get_strings(path, c, "doc_to_choice"));
            if (s.choice_literal.empty())
                return invalid_argument_error("{}: key 'doc_to_choice' is an empty list",
                                              where(path, c));
        } else {
            LATHE_ASSIGN_OR_RETURN(s.choice_field, get_string(path, c, "doc_to_choice"));
        }
        for (const char* key :
             {"until", "max_gen_toks", "strip", "ignore_case", "ignore_punctuation"}) {
            if (root[key])
                return invalid_argument_error("{}: key '{}' applies to kind generate only",
                                              where(path, root[key]), key);
        }
    } else {
        if (root["doc_to_choice"])
            return invalid_argument_error(
                "{}: key 'doc_to_choice' applies to kind multiple_choice only",
                where(path, root["doc_to_choice"]));
        if (root["until"]) {
            if (root["until"].IsScalar()) {
                s.until = {root["until"].as<std::string>()};
            } else {
                LATHE_ASSIGN_OR_RETURN(s.until, get_strings(path, root["until"], "until"));
            }
        } else {
            s.until = {s.fewshot_delimiter};
        }
        if (root["strip"]) {
            LATHE_ASSIGN_OR_RETURN(s.strip, get_bool(path, root["strip"], "strip"));
        }
        if (root["ignore_case"]) {
            LATHE_ASSIGN_OR_RETURN(s.ignore_case,
                                   get_bool(path, root["ignore_case"], "ignore_case"));
        }
        if (root["ignore_punctuation"]) {
            LATHE_ASSIGN_OR_RETURN(s.ignore_punctuation, get_bool(path, root["ignore_punctuation"],
                                                                  "ignore_punctuation"));
        }
        if (root["max_gen_toks"]) {
            LATHE_ASSIGN_OR_RETURN(s.max_gen_toks,
                                   get_int(path, root["max_gen_toks"], "max_gen_toks"));
            if (s.max_gen_toks < 1)
                return invalid_argument_error("{}: key 'max_gen_toks' must be >= 1",
                                              where(path, root["max_gen_toks"]));
        }
    }
    return s;
}

Result<std::vector<ojson>> eval_task_read_records(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found_error("{}: cannot open", path);
    std::vector<ojson> out;
    if (fs::path(path).extension() == ".jsonl") {
        std::string line;
        for (int64_t n = 1; std::getline(in, line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            ojson j = json_parse<ojson>(line);
            if (j.is_discarded() || !j.is_object())
                return invalid_argument_error("{}:{}: expected one JSON object per line", path, n);
            out.push_back(std::move(j));
        }
    } else {
        std::ostringstream all;
        all << in.rdbuf();
        ojson j = json_parse<ojson>(all.str());
        if (j.is_discarded())
            return invalid_argument_error("{}: not valid JSON (or use .jsonl)", path);
        if (j.is_array()) {
            for (size_t i = 0; i < j.size(); ++i) {
                if (!j[i].is_object())
                    return invalid_argument_error("{}: element {} is not an object", path, i);
                out.push_back(j[i]);
            }
        } else if (j.is_object()) {
            for (auto it = j.begin(); it != j.end(); ++it) {
                if (!it.value().is_object())
                    return invalid_argument_error("{}: value of '{}' is not an object", path,
                                                  it.key());
                ojson rec = it.value();
                rec["_key"] = it.key();
                out.push_back(std::move(rec));
            }
        } else {
            return invalid_argument_error("{}: expected an array or an object of records", path);
        }
    }
    if (out.empty()) return invalid_argument_error("{}: no records", path);
    return out;
}

namespace {

// The record's choices, target value and answer text.
struct Resolved {
    std::vector<std::string> choices;
    ojson target;  // integer or string
    std::string answer;
};

Result<Resolved> resolve(const EvalTaskSpec& s, const ojson& rec) {
    Resolved r;
    const bool mc = s.kind == EvalTaskKind::kMultipleChoice;
    if (mc) {
        if (!s.choice_literal.empty()) {
            r.choices = s.choice_literal;
        } else {
            if (!rec.contains(s.choice_field))
                return invalid_argument_error("doc_to_choice: no field '{}'", s.choice_field);
            const ojson& c = rec[s.choice_field];
            if (!c.is_array() || c.empty())
                return invalid_argument_error("doc_to_choice: field '{}' is not a list",
                                              s.choice_field);
            for (const ojson& e : c) {
                if (!e.is_string())
                    return invalid_argument_error(
                        "doc_to_choice: field '{}' holds a {}, not a string", s.choice_field,
                        e.type_name());
                r.choices.push_back(e.get<std::string>());
            }
        }
    }
    if (is_field(s.doc_to_target, rec)) {
        r.target = rec[s.doc_to_target];
        if (!r.target.is_number_integer() && !r.target.is_string())
            return invalid_argument_error(
                "doc_to_target: field '{}' is {}, not an integer or "
                "a string",
                s.doc_to_target, r.target.type_name());
    } else {
        LATHE_ASSIGN_OR_RETURN(const std::string t, eval_template_render(s.doc_to_target, rec));
        if (mc && all_digits(t) && t.size() < 18) {
            r.target = std::stoll(t);
        } else {
            r.target = t;
        }
    }
    if (r.target.is_number_integer()) {
        if (mc) {
            const int64_t k = r.target.get<int64_t>();
            if (k < 0 || k >= int64_t(r.choices.size()))
                return invalid_argument_error("target index {} is outside the {} choices", k,
                                              r.choices.size());
            r.answer = r.choices[size_t(k)];
        } else {
            r.answer = r.target.dump();
        }
    } else {
        r.answer = r.target.get<std::string>();
    }
    return r;
}

// doc_to_text: a field's string, or the rendered template.
Result<std::string> doc_text(const EvalTaskSpec& s, const ojson& rec) {
    if (!is_field(s.doc_to_text, rec)) return eval_template_render(s.doc_to_text, rec);
    const ojson& v = rec[s.doc_to_text];
    if (!v.is_string()) {
        return invalid_argument_error(
            "field '{}' is {}; doc_to_text must give a string (lm-eval reads an integer as one "
            "context per choice, which lathe does not support)",
            s.doc_to_text, v.type_name());
    }
    return v.get<std::string>();
}

}  // namespace

Result<std::vector<EvalTaskDoc>> eval_task_build(const EvalTaskSpec& s,
                                                 const std::vector<ojson>& records,
                                                 const std::vector<ojson>& pool,
                                                 bool pool_is_data) {
    const std::string& pool_file = s.fewshot_data.empty() ? s.data : s.fewshot_data;
    // Few-shot turns of the pool, prepared once.
    std::vector<std::string> shot_text;
    if (s.num_fewshot > 0) {
        const int64_t need = s.num_fewshot + (pool_is_data && !s.first_n ? 1 : 0);
        if (int64_t(pool.size()) < need) {
            return invalid_argument_error("{}: num_fewshot {} needs {} records in {}, which has {}",
                                          s.file, s.num_fewshot, need, pool_file, pool.size());
        }
        shot_text.reserve(pool.size());
        for (size_t i = 0; i < pool.size(); ++i) {
            auto res = resolve(s, pool[i]);
            if (!res.ok())
                return res.status().with_context(fmt::format("{}: record {}", pool_file, i + 1));
            auto q = doc_text(s, pool[i]);
            if (!q.ok())
                return q.status().with_context(
                    fmt::format("{}: record {}: doc_to_text", pool_file, i + 1));
            // lm-eval writes no answer (and no delimiters) for an empty string target.
            const bool has_answer =
                !(res->target.is_string() && res->target.get<std::string>().empty());
            shot_text.push_back(
                has_answer ? *q + s.target_delimiter + res->answer + s.fewshot_delimiter : *q);
        }
    }
    PyRandom rng(s.fewshot_seed);
    std::vector<EvalTaskDoc> docs;
    docs.reserve(records.size());
    for (size_t d = 0; d < records.size(); ++d) {
        const ojson& rec = records[d];
        auto ctx = [&](const Status& st) {
            return st.with_context(fmt::format("{}: record {}", s.data, d + 1));
        };
        auto res = resolve(s, rec);
        if (!res.ok()) return ctx(res.status());
        EvalTaskDoc doc;
        doc.choices = res->choices;
        if (s.kind == EvalTaskKind::kMultipleChoice) {
            if (res->target.is_number_integer()) {
                doc.gold = res->target.get<int64_t>();
            } else {
                const auto it = std::find(doc.choices.begin(), doc.choices.end(), res->answer);
                if (it == doc.choices.end())
                    return ctx(invalid_argument_error("target '{}' is not one of the choices",
                                                      res->answer));
                doc.gold = it - doc.choices.begin();
            }
            doc.gold_text = doc.choices[size_t(doc.gold)];
        } else {
            doc.gold_text = res->answer;
        }
        auto desc = is_field(s.description, rec) ? render_value(rec[s.description], s.description)
                                                 : eval_template_render(s.description, rec);
        if (!desc.ok()) return ctx(desc.status().with_context("description"));
        doc.context = *desc;
        if (s.num_fewshot > 0) {
            const int64_t k = s.num_fewshot;
            std::vector<int64_t> picked;
            auto keep = [&](int64_t i) { return !pool_is_data || pool[size_t(i)] != rec; };
            if (s.first_n) {
                for (int64_t i = 0; i < int64_t(pool.size()) && int64_t(picked.size()) < k; ++i)
                    if (keep(i)) picked.push_back(i);
            } else if (!pool_is_data) {
                picked = rng.sample(int64_t(pool.size()), k);
            } else {
                for (int64_t i : rng.sample(int64_t(pool.size()), k + 1))
                    if (keep(i) && int64_t(picked.size()) < k) picked.push_back(i);
                if (int64_t(picked.size()) < k) {
                    std::vector<int64_t> rest;
                    for (int64_t i = 0; i < int64_t(pool.size()); ++i)
                        if (keep(i)) rest.push_back(i);
                    if (int64_t(rest.size()) < k)
                        return ctx(invalid_argument_error(
                            "only {} records of the pool differ from it; num_fewshot is {}",
                            rest.size(), k));
                    picked.clear();
                    for (int64_t j : rng.sample(int64_t(rest.size()), k))
                        picked.push_back(rest[size_t(j)]);
                }
            }
            if (int64_t(picked.size()) < k)
                return ctx(invalid_argument_error(
                    "only {} records of the pool differ from it; num_fewshot is {}", picked.size(),
                    k));
            for (int64_t i : picked) doc.context += shot_text[size_t(i)];
        }
        auto q = doc_text(s, rec);
        if (!q.ok()) return ctx(q.status().with_context("doc_to_text"));
        doc.context += *q;
        docs.push_back(std::move(doc));
    }
    return docs;
}

// Python's _random module: the reference MT19937 generator of Matsumoto and Nishimura.
void PyRandom::init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < 624; ++i)
        mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + uint32_t(i);
    index_ = 624;
}

PyRandom::PyRandom(int64_t seed) {
    // random.seed(int): the key is |seed| as 32-bit words, least significant first ([0] for 0).
    uint64_t a = seed < 0 ? uint64_t(0) - uint64_t(seed) : uint64_t(seed);
    std::vector<uint32_t> key;
    do {
        key.push_back(uint32_t(a & 0xffffffffu));
        a >>= 32;
    } while (a != 0);
    init_genrand(19650218u);
    const int n = 624;
    int i = 1, j = 0;
    const int len = int(key.size());
    for (int k = std::max(n, len); k > 0; --k) {
        mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[size_t(j)] +
                 uint32_t(j);
        ++i;
        ++j;
        if (i >= n) {
            mt_[0] = mt_[n - 1];
            i = 1;
        }
        if (j >= len) j = 0;
    }
    for (int k = n - 1; k > 0; --k) {
        mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
        ++i;
        if (i >= n) {
            mt_[0] = mt_[n - 1];
            i = 1;
        }
    }
    mt_[0] = 0x80000000u;
    index_ = 624;
}

uint32_t PyRandom::next_u32() {
    constexpr int n = 624, m = 397;
    constexpr uint32_t upper = 0x80000000u, lower = 0x7fffffffu, matrix = 0x9908b0dfu;
    if (index_ >= n) {
        for (int k = 0; k < n; ++k) {
            const uint32_t y = (mt_[k] & upper) | (mt_[(k + 1) % n] & lower);
            mt_[k] = mt_[(k + m) % n] ^ (y >> 1) ^ ((y & 1u) ? matrix : 0u);
        }
        index_ = 0;
    }
    uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint32_t PyRandom::getrandbits(int k) {
    LATHE_CHECK(k >= 1 && k <= 32, "getrandbits: k = {}", k);
    return next_u32() >> (32 - k);
}

uint64_t PyRandom::randbelow(uint64_t n) {
    LATHE_CHECK(n >= 1 && n <= 0xffffffffull, "randbelow: n = {}", n);
    int k = 0;
    while ((n >> k) != 0) ++k;  // n.bit_length()
    uint64_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
}

std::vector<int64_t> PyRandom::sample(int64_t n, int64_t k) {
    LATHE_CHECK(k >= 0 && k <= n, "sample: k = {} of n = {}", k, n);
    std::vector<int64_t> result(size_t(k), 0);
    // Python chooses between a shrinking pool and a set of picked indices by this size.
    int64_t setsize = 21;
    if (k > 5)
        setsize += int64_t(std::pow(4.0, std::ceil(std::log(double(k * 3)) / std::log(4.0))));
    if (n <= setsize) {
        std::vector<int64_t> pool(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) pool[size_t(i)] = i;
        for (int64_t i = 0; i < k; ++i) {
            const int64_t j = int64_t(randbelow(uint64_t(n - i)));
            result[size_t(i)] = pool[size_t(j)];
            pool[size_t(j)] = pool[size_t(n - i - 1)];
        }
    } else {
        std::set<int64_t> selected;
        for (int64_t i = 0; i < k; ++i) {
            int64_t j = int64_t(randbelow(uint64_t(n)));
            while (selected.count(j)) j = int64_t(randbelow(uint64_t(n)));
            selected.insert(j);
            result[size_t(i)] = j;
        }
    }
    return result;
}

int64_t eval_tasks_logits_rows(int64_t batch_size, int64_t T, int64_t V, int64_t budget_bytes) {
    LATHE_CHECK(batch_size >= 1 && T >= 1 && V >= 1 && budget_bytes >= 0,
                "logits rows: batch {}, T {}, V {}, budget {}", batch_size, T, V, budget_bytes);
    const int64_t per_request = T * V * int64_t(sizeof(float));
    return std::clamp<int64_t>(budget_bytes / per_request, 1, batch_size);
}

}  // namespace lathe
