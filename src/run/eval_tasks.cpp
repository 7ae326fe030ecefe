#include "run/eval_tasks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "infer/engine.h"
#include "infer/generate.h"
#include "io/file.h"
#include "io/json.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "run/eval_tasks_spec.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The first integer of config key `key` in `path` (an integer or a list), if any.
std::optional<std::vector<int32_t>> json_ids(const fs::path& path, const char* key) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    const nlohmann::json j = json_parse<nlohmann::json>(in);
    if (j.is_discarded() || !j.contains(key)) return std::nullopt;
    const nlohmann::json& v = j[key];
    std::vector<int32_t> out;
    if (v.is_number_integer()) out.push_back(v.get<int32_t>());
    if (v.is_array())
        for (const auto& e : v)
            if (e.is_number_integer()) out.push_back(e.get<int32_t>());
    if (out.empty()) return std::nullopt;
    return out;
}

// One log-likelihood request, tokenized.
struct LlRequest {
    std::vector<int32_t> input;  // what the model reads
    int64_t cont_len = 0;        // the last cont_len positions predict `cont`
    std::vector<int32_t> cont;
    double ll = 0.0;
    bool greedy = false;
};

// Unicode code points of UTF-8 text (Python's len of the decoded str).
int64_t code_points(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

constexpr const char* kSpace = " \t\n\r\f\v";

// exact_match's comparison form of a text: ASCII-lowercased and without ASCII punctuation
// (Python's string.punctuation) as the task asks.
std::string match_form(std::string s, const EvalTaskSpec& spec) {
    if (spec.ignore_case)
        for (char& c : s)
            if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    if (spec.ignore_punctuation) {
        static const std::string kPunct = R"(!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)";
        std::erase_if(s, [](char c) { return kPunct.find(c) != std::string::npos; });
    }
    return s;
}

// The first index of the largest value (numpy's argmax).
size_t argmax(const std::vector<double>& v) {
    size_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

EvalMetric mean_metric(const std::string& name, const std::vector<double>& xs) {
    EvalMetric m;
    m.name = name;
    const double n = double(xs.size());
    m.value = std::accumulate(xs.begin(), xs.end(), 0.0) / n;
    if (xs.size() > 1) {
        double ss = 0.0;
        for (double x : xs) ss += (x - m.value) * (x - m.value);
        m.stderr_ = std::sqrt(ss / (n - 1.0)) / std::sqrt(n);
    }
    return m;
}

struct Tokenized {
    std::vector<int32_t> ctx, cont;
};

// lm-eval's split of (context, continuation) into token ids (eval_tasks.h).
Result<Tokenized> encode_pair(const Tokenizer& tok, std::string context, std::string cont,
                              int32_t prefix) {
    Tokenized t;
    if (context.empty()) {
        LATHE_ASSIGN_OR_RETURN(t.cont, tok.encode(cont, false));
        if (t.cont.empty()) return t;
        if (t.cont[0] != prefix) {
            t.ctx = {prefix};
        } else {
            t.ctx = {t.cont[0]};
            t.cont.erase(t.cont.begin());
        }
        return t;
    }
    // Python's str.rstrip(): trailing Unicode whitespace; ASCII whitespace here covers what
    // task templates write (spaces, tabs, newlines).
    size_t end = context.size();
    while (end > 0 && std::string_view(" \t\n\r\f\v").find(context[end - 1]) != std::string::npos)
        --end;
    cont = context.substr(end) + cont;
    context.resize(end);
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> whole, tok.encode(context + cont, true));
    LATHE_ASSIGN_OR_RETURN(t.ctx, tok.encode(context, true));
    if (t.ctx.size() <= whole.size())
        t.cont.assign(whole.begin() + int64_t(t.ctx.size()), whole.end());
    return t;
}

// Log-likelihoods of `reqs`, in groups of at most eval_tasks_logits_rows requests so that the
// host logits buffer stays within kEvalTasksLogitsBudget (or one request's logits).
Status run_loglikelihoods(Model& model, std::vector<LlRequest>& reqs, int64_t batch_size,
                          int64_t vocab) {
    std::vector<size_t> order(reqs.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return reqs[a].input.size() > reqs[b].input.size();
    });
    std::vector<int32_t> tokens;
    std::vector<float> logits;
    for (size_t b0 = 0, b1 = 0; b0 < order.size(); b0 = b1) {
        const int64_t T = int64_t(reqs[order[b0]].input.size());  // the longest of the group
        const int64_t rows = eval_tasks_logits_rows(batch_size, T, vocab, kEvalTasksLogitsBudget);
        b1 = std::min(order.size(), b0 + size_t(rows));
        const int64_t B = int64_t(b1 - b0);
        tokens.assign(size_t(B * T), 0);  // right padding
        for (int64_t r = 0; r < B; ++r) {
            const std::vector<int32_t>& in = reqs[order[b0 + size_t(r)]].input;
            std::copy(in.begin(), in.end(), tokens.begin() + r * T);
        }
        logits.resize(size_t(B * T * vocab));
        ModelBatch batch;
        batch.tokens = ConstTensorView(tokens.data(), DType::kI32, Shape{B, T});
        model.logits(TensorView(logits.data(), DType::kF32, Shape{B, T, vocab}), batch);
        for (int64_t r = 0; r < B; ++r) {
            LlRequest& q = reqs[order[b0 + size_t(r)]];
            const int64_t n = int64_t(q.input.size());
            q.ll = 0.0;
            q.greedy = true;
            for (int64_t k = 0; k < q.cont_len; ++k) {
                const int64_t pos = n - q.cont_len + k;
                const float* row = logits.data() + (r * T + pos) * vocab;
                float mx = row[0];
                int64_t best = 0;
                for (int64_t v = 1; v < vocab; ++v) {
                    if (row[v] > mx) {
                        mx = row[v];
                        best = v;
                    }
                }
                double sum = 0.0;
                for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - double(mx));
                const int32_t target = q.cont[size_t(k)];
                q.ll += double(row[target]) - double(mx) - std::log(sum);
                if (best != target) q.greedy = false;
            }
        }
    }
    return ok_status();
}

struct LoadedTask {
    EvalTaskSpec spec;
    std::vector<EvalTaskDoc> docs;
    size_t first_request = 0;  // multiple_choice: its requests in the shared list
};

}  // namespace

Result<EvalTasksResult> eval_tasks_run(const EvalTasksRequest& r) {
    if (r.tasks.empty()) return invalid_argument_error("--tasks: give at least one task file");
    if (r.batch_size < 1)
        return invalid_argument_error("--batch-size must be >= 1, got {}", r.batch_size);
    if (r.limit < 0) return invalid_argument_error("--limit must be >= 0, got {}", r.limit);
    const Result<fs::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const fs::path dir = *resolved;
    LATHE_ASSIGN_OR_RETURN(const Tokenizer tok, checkpoint_tokenizer(dir));
    auto config = model_config_from_hf_file(dir.string());
    if (!config.ok()) return config.status().with_context("--checkpoint");
    const int64_t L = config->max_position_embeddings, V = config->vocab_size;
    std::optional<std::vector<int32_t>> prefix_ids = json_ids(dir / "config.json", "bos_token_id");
    if (!prefix_ids) prefix_ids = json_ids(dir / "config.json", "eos_token_id");
    std::optional<std::vector<int32_t>> eos =
        json_ids(dir / "generation_config.json", "eos_token_id");
    if (!eos) eos = json_ids(dir / "config.json", "eos_token_id");

    // Tasks, prompts and tokenized requests, before the model is made.
    std::vector<LoadedTask> tasks;
    std::vector<LlRequest> reqs;
    std::vector<std::vector<int32_t>> gen_prompts;  // all generate tasks' prompts, in order
    int64_t longest = 1, longest_prompt = 1, max_gen = 1;
    for (const std::string& file : r.tasks) {
        LoadedTask t;
        LATHE_ASSIGN_OR_RETURN(t.spec, eval_task_load(file));
        for (const LoadedTask& o : tasks) {
            if (o.spec.name == t.spec.name)
                return invalid_argument_error("{}: task name '{}' is also the name of {}", file,
                                              t.spec.name, o.spec.file);
        }
        LATHE_ASSIGN_OR_RETURN(std::vector<ojson> records, eval_task_read_records(t.spec.data));
        std::vector<ojson> pool_records;
        const bool pool_is_data = t.spec.fewshot_data.empty();
        if (!pool_is_data) {
            LATHE_ASSIGN_OR_RETURN(pool_records, eval_task_read_records(t.spec.fewshot_data));
        }
        const std::vector<ojson>& pool = pool_is_data ? records : pool_records;
        LATHE_ASSIGN_OR_RETURN(t.docs, eval_task_build(t.spec, records, pool, pool_is_data));
        if (r.limit > 0 && int64_t(t.docs.size()) > r.limit) t.docs.resize(size_t(r.limit));
        t.first_request =
            t.spec.kind == EvalTaskKind::kMultipleChoice ? reqs.size() : gen_prompts.size();
        for (size_t d = 0; d < t.docs.size(); ++d) {
            const EvalTaskDoc& doc = t.docs[d];
            auto where = [&](const Status& s) {
                return s.with_context(fmt::format("{}: record {}", t.spec.data, d + 1));
            };
            if (t.spec.kind == EvalTaskKind::kGenerate) {
                auto ids = tok.encode(doc.context, true);
                if (!ids.ok()) return where(ids.status());
                if (ids->empty())
                    return where(invalid_argument_error("the prompt encodes to no token"));
                const int64_t keep = L - t.spec.max_gen_toks;
                if (keep < 1)
                    return invalid_argument_error(
                        "{}: max_gen_toks {} leaves no room in the model's {}-token context",
                        t.spec.file, t.spec.max_gen_toks, L);
                if (int64_t(ids->size()) > keep) ids->erase(ids->begin(), ids->end() - keep);
                longest_prompt = std::max<int64_t>(longest_prompt, int64_t(ids->size()));
                max_gen = std::max(max_gen, t.spec.max_gen_toks);
                gen_prompts.push_back(std::move(*ids));
                continue;
            }
            for (const std::string& choice : doc.choices) {
                if (choice.empty())
                    return where(invalid_argument_error(
                        "a choice is empty (acc_norm divides by its length)"));
                if (!prefix_ids && doc.context.empty())
                    return where(failed_precondition_error(
                        "an empty context needs config.json's bos_token_id or eos_token_id"));
                auto p = encode_pair(tok, doc.context, t.spec.target_delimiter + choice,
                                     prefix_ids ? (*prefix_ids)[0] : 0);
                if (!p.ok()) return where(p.status());
                if (p->cont.empty())
                    return where(invalid_argument_error("choice '{}' encodes to no token", choice));
                if (int64_t(p->cont.size()) > L)
                    return where(invalid_argument_error(
                        "choice '{}' has {} tokens, more than the model's context {}", choice,
                        p->cont.size(), L));
                LlRequest q;
                q.cont = p->cont;
                q.cont_len = int64_t(p->cont.size());
                std::vector<int32_t> all = p->ctx;
                all.insert(all.end(), p->cont.begin(), p->cont.end());
                if (int64_t(all.size()) > L + 1) all.erase(all.begin(), all.end() - (L + 1));
                all.pop_back();
                for (int32_t id : all) {
                    if (id < 0 || id >= V)
                        return where(invalid_argument_error(
                            "token id {} is outside the model's vocabulary ({})", id, V));
                }
                q.input = std::move(all);
                longest = std::max<int64_t>(longest, int64_t(q.input.size()));
                reqs.push_back(std::move(q));
            }
        }
        tasks.push_back(std::move(t));
    }

    ModelShape shape;
    shape.batch = reqs.empty() ? 1 : std::min<int64_t>(r.batch_size, int64_t(reqs.size()));
    shape.seq_len = reqs.empty() ? 1 : longest;
    shape.training = false;
    LATHE_ASSIGN_OR_RETURN(ComputeDevice device, ComputeDevice::open(r.device, "--device"));
    LATHE_ASSIGN_OR_RETURN(Model model,
                           model_create_loaded(*config, shape, device.context(), dir.string()));
    if (!reqs.empty()) LATHE_RETURN_IF_ERROR(run_loglikelihoods(model, reqs, shape.batch, V));

    std::vector<GenerateResult> gens;
    if (!gen_prompts.empty()) {
        EngineLimits limits;
        limits.max_sequences = std::min<int64_t>(r.batch_size, int64_t(gen_prompts.size()));
        limits.max_len = std::min<int64_t>(L, longest_prompt + max_gen);
        limits.prefill_chunk = std::min<int64_t>(256, limits.max_len);
        LATHE_ASSIGN_OR_RETURN(InferenceEngine engine, InferenceEngine::create(model, limits));
        const Detokenizer detok = [&tok](std::span<const int32_t> ids) {
            return tok.decode(ids, true);
        };
        std::string eos_text;
        if (eos) {
            const int32_t e = (*eos)[0];
            LATHE_ASSIGN_OR_RETURN(eos_text, tok.decode(std::span<const int32_t>(&e, 1), false));
        }
        // Generate task by task (each has its own stop strings and token budget).
        for (const LoadedTask& t : tasks) {
            if (t.spec.kind != EvalTaskKind::kGenerate) continue;
            GenerateOptions o;
            o.sampling.temperature = 0.0;
            o.max_new_tokens = t.spec.max_gen_toks;
            if (eos) o.stop_ids = *eos;
            o.stop_strings = t.spec.until;
            if (!eos_text.empty()) o.stop_strings.push_back(eos_text);
            o.batch_size = limits.max_sequences;
            const std::vector<std::vector<int32_t>> prompts(
                gen_prompts.begin() + int64_t(t.first_request),
                gen_prompts.begin() + int64_t(t.first_request + t.docs.size()));
            LATHE_ASSIGN_OR_RETURN(std::vector<GenerateResult> g,
                                   generate(engine, prompts, o, detok));
            for (GenerateResult& x : g) {
                // lm-eval decodes every new token (special ones skipped) and cuts the text
                // before the first occurrence of each stop string in turn.
                LATHE_ASSIGN_OR_RETURN(x.text, tok.decode(x.ids, true));
                for (const std::string& s : o.stop_strings) {
                    if (s.empty()) continue;
                    const size_t at = x.text.find(s);
                    if (at != std::string::npos) x.text.resize(at);
                }
                if (t.spec.strip) {
                    const size_t b = x.text.find_first_not_of(kSpace);
                    x.text = b == std::string::npos
                                 ? std::string()
                                 : x.text.substr(b, x.text.find_last_not_of(kSpace) - b + 1);
                }
                gens.push_back(std::move(x));
            }
        }
    }

    // Scores and per-example lines.
    EvalTasksResult out;
    out.checkpoint = dir.string();
    std::string lines;
    size_t gen_at = 0;
    for (const LoadedTask& t : tasks) {
        EvalTaskResult tr;
        tr.name = t.spec.name;
        tr.file = t.spec.file;
        tr.records = int64_t(t.docs.size());
        if (t.spec.kind == EvalTaskKind::kMultipleChoice) {
            tr.kind = "multiple_choice";
            std::vector<double> acc, acc_norm;
            size_t q = t.first_request;
            for (size_t d = 0; d < t.docs.size(); ++d) {
                const EvalTaskDoc& doc = t.docs[d];
                std::vector<double> lls, norm;
                std::vector<bool> greedy;
                std::vector<int64_t> cont_tokens;
                for (const std::string& c : doc.choices) {
                    cont_tokens.push_back(reqs[q].cont_len);
                    lls.push_back(reqs[q].ll);
                    greedy.push_back(reqs[q].greedy);
                    norm.push_back(reqs[q].ll / double(code_points(c)));
                    ++q;
                }
                acc.push_back(int64_t(argmax(lls)) == doc.gold ? 1.0 : 0.0);
                acc_norm.push_back(int64_t(argmax(norm)) == doc.gold ? 1.0 : 0.0);
                if (!r.samples.empty()) {
                    ojson j;
                    j["task"] = t.spec.name;
                    j["index"] = d;
                    j["context"] = doc.context;
                    j["choices"] = doc.choices;
                    j["gold"] = doc.gold;
                    j["loglikelihoods"] = lls;
                    j["is_greedy"] = greedy;
                    j["continuation_tokens"] = cont_tokens;
                    j["acc"] = acc.back();
                    j["acc_norm"] = acc_norm.back();
                    lines += j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";
                }
            }
            tr.metrics = {mean_metric("acc", acc), mean_metric("acc_norm", acc_norm)};
        } else {
            tr.kind = "generate";
            std::vector<double> em;
            for (size_t d = 0; d < t.docs.size(); ++d) {
                const GenerateResult& g = gens[gen_at++];
                em.push_back(match_form(g.text, t.spec) == match_form(t.docs[d].gold_text, t.spec)
                                 ? 1.0
                                 : 0.0);
                if (!r.samples.empty()) {
                    ojson j;
                    j["task"] = t.spec.name;
                    j["index"] = d;
                    j["context"] = t.docs[d].context;
                    j["target"] = t.docs[d].gold_text;
                    j["generation"] = g.text;
                    j["ids"] = g.ids;
                    j["exact_match"] = em.back();
                    lines += j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";
                }
            }
            tr.metrics = {mean_metric("exact_match", em)};
        }
        out.tasks.push_back(std::move(tr));
    }
    if (!r.samples.empty()) {
        const Status s = file_write_atomic(r.samples, lines);
        if (!s.ok()) return s.with_context("--samples");
    }
    if (!r.output.empty()) {
        const Status s = file_write_atomic(r.output, eval_tasks_json(r, out) + "\n");
        if (!s.ok()) return s.with_context("--output");
    }
    return out;
}

std::string eval_tasks_json(const EvalTasksRequest& request, const EvalTasksResult& result) {
    ojson j;
    j["checkpoint"] = result.checkpoint;
    j["device"] = request.device;
    ojson tasks = ojson::object();
    for (const EvalTaskResult& t : result.tasks) {
        ojson o;
        o["kind"] = t.kind;
        o["file"] = t.file;
        o["records"] = t.records;
        for (const EvalMetric& m : t.metrics) {
            o[m.name] = m.value;
            o[m.name + "_stderr"] = m.stderr_ < 0 ? ojson(nullptr) : ojson(m.stderr_);
        }
        tasks[t.name] = o;
    }
    j["tasks"] = tasks;
    return j.dump();
}

}  // namespace lathe
