#pragma once
// `lathe align run CONFIG.yaml`: every stage of vocabulary adaptation in order, from one YAML file
// (docs/ALIGN.md; schema below, io/config.h rules: an unknown key is an error naming the file,
// the line and the closest valid key).
//
//   1 terms    align/terms.h      the target tokenizer = a base tokenizer + mined terms
//   2 prepare  data/prepare.h     the corpus as token files under each tokenizer
//   3 embed    align/embed.h      token vectors for each token file
//   4 map      align/map.h        target id -> source id
//   5 apply    align/apply.h      the adapted checkpoint (when source.checkpoint is set)
//   6 eval     align/eval.h       alignment BLEU-1, tokens/byte, bits/byte (when eval.documents is
//   set)
//
// Every stage is resumable: each writes a manifest beside its main output (align/stage_cache.h)
// and is skipped, with a log line, while its inputs and settings are unchanged; `align.force`
// reruns them all. Outputs live under align.work_dir:
//   target/tokenizer.json (+ .terms.tsv, .new_tokens.json)   stage 1 (or target.tokenizer as given)
//   tokens/source.{bin,idx}, tokens/target.{bin,idx}           stage 2
//   vectors/source.txt, vectors/target.txt                     stage 3 (GloVe text format)
//   map/map.json (+ map.report.tsv)                            stage 4 (TokAlign's JSON map)
//   model/                                                     stage 5 (a Hugging Face folder)
//   eval.json                                                  stage 6
//
// Stage 1 mines terms.corpus when given, else corpus.inputs (stages 2-3 always read corpus.inputs):
// so the embeddings can learn from general plus domain text while the terms come from the domain
// text alone.
//
// The tokenizer that stage 1 adds terms to is target.tokenizer when given (e.g. a medical
// tokenizer trained with `lathe tokenizer train`), else source.tokenizer (the source vocabulary
// plus domain terms). With terms.enabled false, target.tokenizer is required and used as it is.

#include <atomic>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"

namespace lathe {

// The schema of the `align run` YAML (every key, default and help line).
ConfigSchema align_run_config_schema();

struct AlignRunOptions {
    int threads = 0;     // overrides align.threads when > 0
    bool force = false;  // overrides align.force when true
    bool show_progress = true;
    const std::atomic<bool>* cancel = nullptr;
};

// One line per stage for the summary: name, "ran" / "up to date" / "not configured", and details.
struct AlignStageOutcome {
    std::string stage;
    std::string state;
    std::string detail;
    double seconds = 0.0;
};

struct AlignRunReport {
    std::vector<AlignStageOutcome> stages;
    double seconds = 0.0;
};

// Runs the stages the configuration asks for, in order, stopping at the first error (returned
// with the stage's name in front). Before stage 1 writes anything, every input and setting is
// checked, each error naming the key and the file and line that set it: a configuration that
// names no target (terms disabled and no target.tokenizer); a work_dir that is a file or cannot be
// made; a corpus, terms, general or eval.documents file that is missing, a folder or unreadable;
// a tokenizer that does not load, or (with terms) one stage 1 cannot add terms to (not byte-level,
// or add_prefix_space); a source.checkpoint that does not resolve (resolve_checkpoint: a Hugging
// Face or lathe checkpoint folder, a run folder, RUN/checkpoints, RUN/checkpoints/latest), whose
// config.json lathe cannot read, whose embedding is smaller than source.tokenizer, or (with eval)
// that has no tokenizer.json or a max_position_embeddings below eval.seq_len; a number out of its
// range; a `cuda` device on a machine without a usable GPU. Then the errors of each stage.
Result<AlignRunReport> align_run_pipeline(const Config& config, const AlignRunOptions& options);

}  // namespace lathe
