#pragma once
// Skip-gram with negative sampling (Mikolov et al. 2013) as fastText's `skipgram` trains it,
// without subwords (a token id is one "word"; fastText's character n-grams over digit strings are
// a flaw of the reference pipeline). CPU twin here (the specification); CUDA in sgns.cu when built.
//
// Per epoch e, per document (windows never cross documents; fastText cuts its text lines into
// chunks of 1024 words and adds a "</s>" word per line, lathe does neither):
//   1. subsampling: position p is kept when u(e, p) <= sqrt(t / f) + t / f, f = count / tokens
//      (fastText's pdiscard, t = subsample); dropped tokens take no position.
//   2. for each kept position q (centre w): b uniform in [1, window] (word2vec's dynamic window);
//      for each kept neighbour at distance 1..b inside the document (context c), one update:
//        h = in[w];  grad = 0
//        for target t in [c, n_1 .. n_k]   (k = negative; n_i drawn from counts^0.5, as
//                                           fastText's table; a draw equal to c is redrawn)
//          s = sigmoid(out[t] . h);  a = lr_now * (label - s)      (label 1 for c, 0 otherwise)
//          grad += a * out[t];  out[t] += a * h;  loss -= log(label ? s : 1 - s)
//        in[w] += grad
//   lr_now = lr * (1 - progress), progress = tokens processed / (epochs * tokens), tokens counted
//   before subsampling, as fastText does.
// Initialisation (fastText): in uniform in [-1/D, 1/D), out = 0. Output vectors: in.
// sigmoid and log come from 512-step tables over [-8, 8] and (0, 1] (fastText's, so the two
// backends compute exactly the same numbers); dot products are summed in warp order (glove.h).
//
// Random numbers are counter-based (align/embed_random.h): the draws for a position depend on
// (seed, epoch, position) only, so a single-threaded CPU epoch and a one-warp CUDA epoch agree
// bitwise. More threads / warps run Hogwild (racy updates, as fastText's threads): the name says
// so.

#include <cstdint>
#include <span>
#include <vector>

#include "align/cooccur.h"
#include "core/status.h"
#include "data/indexed_dataset.h"
#include "ops/context.h"

namespace lathe {

struct SgnsOptions {
    int64_t dim = 300;
    int window = 5;  // fastText's ws
    int epochs = 5;
    int negative = 5;
    double subsample = 1e-4;
    double lr = 0.05;
    uint64_t seed = 1;
    int threads = 0;  // CPU threads (0: all cores)
};

// The corpus as rows of the vocabulary (tokens below min_count dropped), documents back to back.
struct SgnsCorpus {
    std::vector<uint32_t> rows;        // (N)
    std::vector<int64_t> doc_offsets;  // (documents + 1) start of each document in rows
    int64_t corpus_tokens = 0;         // rows.size(): as fastText's ntokens, vocabulary tokens only
};

// Reads `data` through `vocab` (one thread). Errors: no token of the vocabulary in the corpus.
Result<SgnsCorpus> sgns_load_corpus(const IndexedDataset& data, const EmbedVocab& vocab);

// Tables derived from the vocabulary: keep probabilities, the negative-sampling table, and the
// sigmoid / log lookup tables.
inline constexpr int kSgnsTableSteps = 512;  // fastText's SIGMOID_TABLE_SIZE / LOG_TABLE_SIZE
inline constexpr float kSgnsMaxSigmoid = 8.0f;
struct SgnsTables {
    std::vector<float> keep;          // (V) keep probability (may exceed 1: always kept)
    std::vector<uint32_t> negatives;  // rows, each repeated ~ count^0.5 times
    std::vector<float> sigmoid;       // (kSgnsTableSteps + 1)
    std::vector<float> log;           // (kSgnsTableSteps + 1)
};
SgnsTables sgns_make_tables(const EmbedVocab& vocab, const SgnsOptions& options);

struct SgnsModel {
    int64_t V = 0, D = 0;
    std::vector<float> in;   // (V, D) input (word) vectors: the output of training
    std::vector<float> out;  // (V, D) output (context) vectors
};
SgnsModel sgns_init(int64_t V, int64_t D, uint64_t seed);

// One epoch (number `epoch`, 0-based, of options.epochs) on options.threads threads, each taking
// a contiguous range of documents. Returns the mean loss per (centre, context) update.
double sgns_epoch_hogwild_cpu(SgnsModel& model, const SgnsCorpus& corpus, const SgnsTables& tables,
                              const SgnsOptions& options, int epoch);

#ifdef LATHE_HAVE_CUDA
// The CUDA trainer: corpus, tables and model on the device between epochs, on the compute stream
// of the CUDA context's CudaState (which must outlive the trainer). `warps` as GloveCuda.
class SgnsCuda {
public:
    SgnsCuda(const Context& ctx, const SgnsModel& model, const SgnsCorpus& corpus,
             const SgnsTables& tables, int warps = 0);
    ~SgnsCuda();
    SgnsCuda(const SgnsCuda&) = delete;
    SgnsCuda& operator=(const SgnsCuda&) = delete;
    double epoch(const SgnsOptions& options, int epoch);
    void download(SgnsModel& model) const;
    int warps() const { return warps_; }

private:
    struct Buffers;
    Buffers* buffers_ = nullptr;
    int64_t V_ = 0, D_ = 0;
    int warps_ = 0;
};
#endif

}  // namespace lathe
