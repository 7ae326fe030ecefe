#!/usr/bin/env bash
# Stage 3 of `lathe align` (token embeddings) against the reference tools, on one token file, on
# the machine it runs on (docs/ALIGN.md, "Embeddings", has the results and the commands).
#
#   bench/embed_bench.sh --tokens PREFIX --out DIR [--lathe BIN] [--glove-src DIR] [--fasttext BIN]
#                        [--threads N] [--dim 300] [--glove-iters 15] [--sgns-epochs 5]
#                        [--only lathe-gpu|all] [--no-lathe-cpu] [--no-lathe-gpu]
#                        [--glove-memory GB] [--tokenizer T.json]
#
#   --lathe       the lathe binary (default: build/lathe)
#   --glove-src   a checkout of stanfordnlp/GloVe (its Makefile and src/): built here with `make`
#   --fasttext    a fastText binary (Debian's `fasttext`, libfasttext 0.9.2)
#   --only lathe-gpu  time only lathe's CUDA GloVe and skip-gram (what the lead runs on the H100)
#   --no-lathe-cpu    skip lathe's CPU runs (the slowest part of the lathe side)
#   --no-lathe-gpu    skip lathe's CUDA runs (a machine without a GPU)
#   --glove-memory    GB the GloVe C tool's cooccur and shuffle may use (default 16)
#
# Runs, each timed with wall-clock seconds:
#   lathe align embed --method glove --device cuda, and --device cpu on all threads
#   lathe align embed --method sgns  --device cuda, and --device cpu
#   the GloVe C tool on the same token stream written as text (one document per line): vocab_count
#     -min-count 5, cooccur -window-size 15 (symmetric, 1/distance), shuffle, glove -x-max 10
#     -alpha 0.75 -eta 0.05 -iter 15 -vector-size 300 -model 2 -threads N; twice (seeds 1, 2) to
#     show how far two runs of the same tool differ
#   fasttext skipgram -dim 300 -ws 5 -neg 5 -t 1e-4 -minCount 5 -minn 0 -maxn 0 -epoch E -thread N
# then the neighbour-overlap quality proxy (bench/embed_bench.py compare) between them.
# Prints one line "RESULT <name> <seconds>" per timed run and one JSON line per comparison; logs
# go to DIR.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lathe=$root/build/lathe
tokens=""
out=""
glove_src=""
fasttext=""
threads=$(nproc)
dim=300
glove_iters=15
sgns_epochs=5
only=all
lathe_cpu=1
lathe_gpu=1
glove_memory=16
tokenizer=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --lathe) lathe=$2; shift 2 ;;
        --tokens) tokens=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --glove-src) glove_src=$2; shift 2 ;;
        --fasttext) fasttext=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --dim) dim=$2; shift 2 ;;
        --glove-iters) glove_iters=$2; shift 2 ;;
        --sgns-epochs) sgns_epochs=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --no-lathe-cpu) lathe_cpu=0; shift ;;
        --no-lathe-gpu) lathe_gpu=0; shift ;;
        --glove-memory) glove_memory=$2; shift 2 ;;
        --tokenizer) tokenizer=$2; shift 2 ;;
        *) echo "embed_bench: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[[ -n $tokens && -n $out ]] || { echo "embed_bench: --tokens and --out are required" >&2; exit 2; }
[[ -f $tokens.idx ]] || { echo "embed_bench: $tokens.idx not found" >&2; exit 2; }
mkdir -p "$out"

now() { date +%s.%N; }
# timed NAME CMD...: runs CMD with its output in $out/NAME.log, prints "RESULT NAME seconds".
timed() {
    local name=$1; shift
    local t0 t1
    t0=$(now)
    if ! "$@" >"$out/$name.log" 2>&1; then
        echo "RESULT $name FAILED (see $out/$name.log)"; tail -5 "$out/$name.log"; return 1
    fi
    t1=$(now)
    echo "RESULT $name $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")"
}

common=(--tokens "$tokens" --dim "$dim" --min-count 5 --seed 1 --force)
if [[ $lathe_gpu == 1 ]]; then
timed lathe_glove_cuda "$lathe" align embed "${common[@]}" --method glove --iters "$glove_iters" \
    --device cuda --output "$out/lathe_glove_cuda.txt"
timed lathe_sgns_cuda "$lathe" align embed "${common[@]}" --method sgns --iters "$sgns_epochs" \
    --device cuda --output "$out/lathe_sgns_cuda.txt"
grep -h "time:\|final\|entries\|vectors:" "$out"/lathe_*_cuda.log
fi
[[ $only == lathe-gpu ]] && exit 0

if [[ $lathe_cpu == 1 ]]; then
timed lathe_glove_cpu "$lathe" align embed "${common[@]}" --method glove --iters "$glove_iters" \
    --device cpu --threads "$threads" --output "$out/lathe_glove_cpu.txt"
timed lathe_sgns_cpu "$lathe" align embed "${common[@]}" --method sgns --iters "$sgns_epochs" \
    --device cpu --threads "$threads" --output "$out/lathe_sgns_cpu.txt"
fi

timed totext python3 "$root/bench/embed_bench.py" totext "$tokens" "$out/ids.txt"

# glove_c SEED / fasttext_run SEED: one run of each reference tool.
glove_c() {
    timed glove_train_seed$1 "$glove_src/build/glove" -save-file "$out/glove_c_seed$1" \
        -threads "$threads" -input-file "$out/cooccurrence.shuf.bin" -x-max 10 -alpha 0.75 \
        -eta 0.05 -iter "$glove_iters" -vector-size "$dim" -binary 0 -model 2 -seed "$1" \
        -vocab-file "$out/vocab.txt" -verbose 2
}
fasttext_run() {
    timed fasttext_skipgram_seed$1 "$fasttext" skipgram -input "$out/ids.txt" \
        -output "$out/fasttext_seed$1" -dim "$dim" -ws 5 -neg 5 -t 1e-4 -minCount 5 \
        -minn 0 -maxn 0 -epoch "$sgns_epochs" -lr 0.05 -thread "$threads" -seed "$1" -verbose 1
}
cmp() { [[ -f $1 && -f $2 ]] && python3 "$root/bench/embed_bench.py" compare "$1" "$2"; }

if [[ -n $glove_src ]]; then
    (cd "$glove_src" && make >/dev/null 2>&1) || { echo "embed_bench: GloVe make failed"; exit 1; }
    gb=$glove_src/build
    timed glove_vocab_count sh -c "'$gb/vocab_count' -min-count 5 -verbose 0 <'$out/ids.txt' >'$out/vocab.txt'"
    timed glove_cooccur sh -c "'$gb/cooccur' -memory $glove_memory -vocab-file '$out/vocab.txt' -verbose 0 \
        -window-size 15 -symmetric 1 -distance-weighting 1 -overflow-file '$out/overflow' \
        <'$out/ids.txt' >'$out/cooccurrence.bin'"
    timed glove_shuffle sh -c "'$gb/shuffle' -memory $glove_memory -verbose 0 -seed 1 \
        -temp-file '$out/shuffle_tmp' <'$out/cooccurrence.bin' >'$out/cooccurrence.shuf.bin'"
    glove_c 1
    grep -h "iter: 0*$glove_iters," "$out"/glove_train_seed1.log
fi
[[ -n $fasttext ]] && fasttext_run 1
cmp "$out/lathe_glove_cuda.txt" "$out/glove_c_seed1.txt"
cmp "$out/lathe_glove_cpu.txt" "$out/glove_c_seed1.txt"
cmp "$out/lathe_glove_cuda.txt" "$out/lathe_glove_cpu.txt"
cmp "$out/lathe_sgns_cuda.txt" "$out/fasttext_seed1.vec"
cmp "$out/lathe_sgns_cpu.txt" "$out/fasttext_seed1.vec"
cmp "$out/lathe_sgns_cuda.txt" "$out/lathe_sgns_cpu.txt"
cmp "$out/lathe_glove_cuda.txt" "$out/lathe_sgns_cuda.txt"
# Second runs of the reference tools: how far the same tool lands from itself.
[[ -n $glove_src ]] && glove_c 2
[[ -n $fasttext ]] && fasttext_run 2
cmp "$out/glove_c_seed1.txt" "$out/glove_c_seed2.txt"
cmp "$out/fasttext_seed1.vec" "$out/fasttext_seed2.vec"
if [[ -n $tokenizer ]]; then
    for f in lathe_glove_cuda.txt glove_c_seed1.txt lathe_sgns_cuda.txt fasttext_seed1.vec; do
        [[ -f $out/$f ]] || continue
        echo "== $f"
        python3 "$root/bench/embed_bench.py" neighbours "$out/$f" "$tokenizer" \
            " king" " red" " water" " France" " seven" " running"
    done
fi
