#pragma once
// Task files of `lathe eval tasks` and the prompt construction that lm-evaluation-harness uses
// for them (its ConfigurableTask with plain-text prompts), so that the same task over the same
// records yields byte-identical request strings. docs/INFERENCE.md, "Eval tasks", is the user's
// description; this header is the definition.
//
// A task file is YAML, one task per file:
//   name: arc_style              # required; the key of the task in the summary
//   kind: multiple_choice        # required; multiple_choice | generate
//   data: items.jsonl            # required; relative to the YAML file's folder. .jsonl: one JSON
//                                # object per line; .json: an array of objects, or an object of
//                                # objects (its values in file order, each key as "_key")
//   fewshot_data: shots.jsonl    # optional; the few-shot pool (default: `data`, see below)
//   doc_to_text: "Question: {{question}}\nAnswer:"      # required
//   doc_to_choice: choices       # multiple_choice: a field holding a list of strings, or a
//                                # YAML list of strings
//   doc_to_target: answer        # required; a field or a template
//   description: ""              # template put before everything, no delimiter added
//   target_delimiter: " "        # between a question and its answer (and each choice)
//   fewshot_delimiter: "\n\n"    # after each few-shot answer
//   num_fewshot: 0
//   fewshot_seed: 1234           # lm-eval's default fewshot_random_seed
//   fewshot_sampler: random      # random | first_n
//   until: ["\n\n"]              # generate: stop strings (default [fewshot_delimiter])
//   max_gen_toks: 256            # generate: most new tokens
//   strip: false                 # generate: strip the generation's leading and trailing ASCII
//                                # whitespace (lm-eval's remove_whitespace filter)
//   ignore_case: false           # generate: exact_match compares ASCII-lowercased texts
//   ignore_punctuation: false    # generate: exact_match drops ASCII punctuation from both
//
// Templates: text with {{ PATH }} and {{ PATH | join("SEP") }} (or `| join`, SEP = ""); PATH is
// a field name followed by .name or [index] steps. A string renders as itself, an integer in
// decimal, true/false as True/False, null as None (Python's str()); lists only through join (of
// strings). A field reference (doc_to_text, doc_to_target, description) is a string without "{{"
// that names a field of the record; any other string is a template, as lm-eval decides by the
// dataset's features. doc_to_choice is a field (a list of strings) or a YAML list.
//
// Per record (lm-eval's fewshot_context and construct_requests, plain text):
//   target   doc_to_target: a field's value (integer or string), or the rendered template, read
//            as an integer when multiple_choice and it is all ASCII digits. multiple_choice: an
//            integer is an index into the choices, a string must be one of them (its first
//            position); generate: the string (an integer in decimal).
//   answer   the target's text: choices[target] for an index, else the target string.
//   context  description + for each few-shot record s: text(s) + target_delimiter + answer(s) +
//            fewshot_delimiter (just text(s) when answer(s) is empty) + text(record).
//   multiple_choice requests: (context, target_delimiter + choice) for each choice.
//   generate request: context, stop strings `until`.
// Few-shot records: one generator per task, Python's random.Random(fewshot_seed), drawn from in
// record order. Sampler random: from the pool (fewshot_data, else data), k = num_fewshot records
// by random.sample(pool, k); when the pool is `data` itself, random.sample(pool, k + 1) with every
// record equal to the evaluated one removed and the first k kept (and, when fewer than k remain,
// random.sample of the pool without those records). first_n: the first k of the pool (without
// records equal to the evaluated one when the pool is `data`).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

enum class EvalTaskKind { kMultipleChoice, kGenerate };

struct EvalTaskSpec {
    std::string file;  // the YAML path, for messages
    std::string name;
    EvalTaskKind kind = EvalTaskKind::kMultipleChoice;
    std::string data, fewshot_data;  // resolved paths; fewshot_data "" = data
    std::string doc_to_text, doc_to_target, description;
    std::string choice_field;                 // doc_to_choice as a field, or ""
    std::vector<std::string> choice_literal;  // doc_to_choice as a list
    std::string target_delimiter = " ", fewshot_delimiter = "\n\n";
    int64_t num_fewshot = 0;
    int64_t fewshot_seed = 1234;
    bool first_n = false;
    std::vector<std::string> until;
    int64_t max_gen_toks = 256;
    bool strip = false, ignore_case = false, ignore_punctuation = false;
};

// Reads and checks a task file. Errors name FILE:LINE and the key: unknown keys, missing required
// keys, wrong types, a kind or sampler outside its values, num_fewshot < 0, max_gen_toks < 1, a
// data file that does not exist.
Result<EvalTaskSpec> eval_task_load(const std::string& path);

// The records of a .jsonl / .json file (see above). Errors name FILE:LINE.
Result<std::vector<nlohmann::ordered_json>> eval_task_read_records(const std::string& path);

// Renders `tmpl` over `record`. Errors name the missing field or the value that does not render.
Result<std::string> eval_template_render(const std::string& tmpl,
                                         const nlohmann::ordered_json& record);

// One record, prepared: its choices (multiple_choice), the index of the gold choice or the gold
// string, and its prompt context.
struct EvalTaskDoc {
    std::vector<std::string> choices;
    int64_t gold = -1;      // multiple_choice
    std::string gold_text;  // generate: the target; multiple_choice: choices[gold]
    std::string context;
};

// Builds every record's EvalTaskDoc in order (the few-shot generator advances record by record,
// as in lm-eval). Errors name the data file, the record (1-based) and what is wrong.
Result<std::vector<EvalTaskDoc>> eval_task_build(const EvalTaskSpec& spec,
                                                 const std::vector<nlohmann::ordered_json>& records,
                                                 const std::vector<nlohmann::ordered_json>& pool,
                                                 bool pool_is_data);

// Python's random.Random(seed) (MT19937 seeded by init_by_array with the 32-bit words of |seed|)
// and the parts of it the few-shot sampler uses, bit for bit.
class PyRandom {
public:
    explicit PyRandom(int64_t seed);
    uint32_t next_u32();
    // random.getrandbits(k), 1 <= k <= 32.
    uint32_t getrandbits(int k);
    // random._randbelow(n), n >= 1.
    uint64_t randbelow(uint64_t n);
    // The indices random.sample(range(n), k) picks, in order (0 <= k <= n).
    std::vector<int64_t> sample(int64_t n, int64_t k);

private:
    void init_genrand(uint32_t s);
    uint32_t mt_[624];
    int index_ = 625;
};

// The host logits budget of one Model::logits call (bytes).
inline constexpr int64_t kEvalTasksLogitsBudget = int64_t(1) << 30;

// Requests per Model::logits call: min(batch_size, budget / (T * V * 4)), at least 1.
int64_t eval_tasks_logits_rows(int64_t batch_size, int64_t T, int64_t V, int64_t budget_bytes);

}  // namespace lathe
