#!/usr/bin/env bash
# Stage 3's quality measured by what the vectors are for: the alignment accuracy
# (stage 6's BLEU-1) that each tool's vectors lead to, not by the vectors themselves
# (docs/ALIGN.md, "Alignment accuracy from lathe's vectors vs the reference tools'").
#
#   bench/align_embed_quality.sh --out DIR --glove-src DIR --fasttext BIN [--lathe BIN]
#        [--gcide-bytes N] [--threads N] [--dim 300] [--glove-iters 15] [--sgns-epochs 5]
#        [--lathe-seed2] [--shared DIR] [--gcide FILE] [--maps-only]
#
#   --glove-src    a checkout of stanfordnlp/GloVe (built with `make` by bench/embed_bench.sh)
#   --fasttext     Debian's fasttext binary (libfasttext 0.9.2)
#   --gcide-bytes  how much of GCIDE's text to use (default 6000000; 0 = all 40 MB): entries
#                  are taken whole from the start of the dictionary
#   --lathe-seed2  also train lathe's vectors with seed 2 (lathe's own noise floor)
#   --shared       the folder with tokenizers/ and corpora/ (default ../shared of the repository)
#   --maps-only    reuse the vectors already in DIR: only the maps, evaluations and the table
#
# One corpus: the GCIDE slice (blank-line-separated entries) + the first 800 PubMedQA documents
# (question, abstracts, long answer), tokenized with gpt-neox-20b (source) and qwen3 (target) by
# `lathe prepare`. On each side bench/embed_bench.sh trains lathe GloVe and SGNS (CPU), the GloVe
# C tool (seeds 1, 2) and fastText skipgram without subwords (seeds 1, 2) with the same settings.
# Then, per method, `lathe align map` (CPU, 300 pivots, seed 0) with the two files of that
# method, and `lathe align eval` BLEU-1 on the other 200 PubMedQA documents. Prints a table:
# method, tool, BLEU-1, the map's decisions (gold / aligned / fvt) and how the `aligned` target
# tokens used in the held-out documents fared (see the table's comment below).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lathe=$root/build/lathe
out=""
glove_src=""
fasttext=""
gcide_bytes=6000000
threads=$(nproc)
dim=300
glove_iters=15
sgns_epochs=5
seed2=0
maps_only=0
shared=$(cd "$root/.." && pwd)/shared
gcide=/usr/share/dictd/gcide.dict.dz
while [[ $# -gt 0 ]]; do
    case $1 in
        --lathe) lathe=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --glove-src) glove_src=$2; shift 2 ;;
        --fasttext) fasttext=$2; shift 2 ;;
        --gcide-bytes) gcide_bytes=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --dim) dim=$2; shift 2 ;;
        --glove-iters) glove_iters=$2; shift 2 ;;
        --sgns-epochs) sgns_epochs=$2; shift 2 ;;
        --lathe-seed2) seed2=1; shift ;;
        --maps-only) maps_only=1; shift ;;
        --shared) shared=$2; shift 2 ;;
        --gcide) gcide=$2; shift 2 ;;
        *) echo "align_embed_quality: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
die() { echo "align_embed_quality: $*" >&2; exit 2; }
[[ -n $out ]] || die "--out is required"
if [[ $maps_only == 0 ]]; then
[[ -n $glove_src && -f $glove_src/Makefile ]] || die "--glove-src: a stanfordnlp/GloVe checkout is required"
[[ -n $fasttext && -x $fasttext ]] || die "--fasttext: the fasttext binary is required"
fi
[[ -x $lathe ]] || die "$lathe: no lathe binary (--lathe)"
src_tok=$shared/tokenizers/gpt-neox-20b.json
tgt_tok=$shared/tokenizers/qwen3.json
pubmed=$shared/corpora/pubmedqa_ori_pqal.json
for f in "$src_tok" "$tgt_tok" "$pubmed" "$gcide"; do [[ -f $f ]] || die "$f not found (--shared / --gcide)"; done
mkdir -p "$out"

if [[ $maps_only == 0 ]]; then
# The corpus (text-blocks) and the held-out documents (one per line).
python3 - "$gcide" "$gcide_bytes" "$pubmed" "$out/corpus.txt" "$out/heldout.txt" <<'EOF' || exit 1
import gzip, json, re, sys
gcide, limit, pubmed, corpus, heldout = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
text = gzip.open(gcide, "rb").read().decode("utf-8", "replace")
blocks, size = [], 0
for b in re.split(r"\n\s*\n", text):
    if not b.strip():
        continue
    if limit and size >= limit:
        break
    blocks.append(b.strip("\n"))
    size += len(b.encode()) + 2
d = json.load(open(pubmed))
docs = ["\n".join([v["QUESTION"], *v["CONTEXTS"], v["LONG_ANSWER"]]) for v in d.values()]
docs = [re.sub(r"\n\s*\n", "\n", x) for x in docs]
with open(corpus, "w") as f:
    f.write("\n\n".join(blocks + docs[:800]) + "\n")
with open(heldout, "w") as f:
    f.writelines(x.replace("\n", " ") + "\n" for x in docs[800:])
print(f"corpus: {len(blocks)} GCIDE entries ({size} bytes) + 800 PubMedQA documents; "
      f"held out: {len(docs) - 800} documents")
EOF

for side in source target; do
    tok=$src_tok; [[ $side == target ]] && tok=$tgt_tok
    "$lathe" prepare --tokenizer "$tok" --input "$out/corpus.txt" --format text-blocks \
        --output-prefix "$out/tokens_$side" --on-error skip --no-progress >"$out/prepare_$side.log" 2>&1 ||
        { tail -5 "$out/prepare_$side.log"; die "lathe prepare ($side) failed"; }
done
for side in source target; do
    echo "== embeddings, $side side ($(python3 -c "
import os, sys; print(os.path.getsize(sys.argv[1]) // (2 if sys.argv[2] == 'source' else 4), 'tokens')
" "$out/tokens_$side.bin" "$side"))"
    bash "$root/bench/embed_bench.sh" --lathe "$lathe" --tokens "$out/tokens_$side" --out "$out/$side" \
        --threads "$threads" --dim "$dim" --glove-iters "$glove_iters" --sgns-epochs "$sgns_epochs" \
        --no-lathe-gpu --glove-memory 2 --glove-src "$glove_src" --fasttext "$fasttext"
    if [[ $seed2 == 1 ]]; then
        common=(--tokens "$out/tokens_$side" --dim "$dim" --min-count 5 --seed 2 --force
            --device cpu --threads "$threads")
        "$lathe" align embed "${common[@]}" --method glove --iters "$glove_iters" \
            --output "$out/$side/lathe_glove_cpu_seed2.txt" >"$out/$side/lathe_glove_cpu_seed2.log" 2>&1
        "$lathe" align embed "${common[@]}" --method sgns --iters "$sgns_epochs" \
            --output "$out/$side/lathe_sgns_cpu_seed2.txt" >"$out/$side/lathe_sgns_cpu_seed2.log" 2>&1
    fi
done
fi

# One map and one evaluation per vector file pair.
rows=(
    "GloVe|lathe (cpu), seed 1|lathe_glove_cpu.txt"
    "GloVe|lathe (cpu), seed 2|lathe_glove_cpu_seed2.txt"
    "GloVe|GloVe C tool, seed 1|glove_c_seed1.txt"
    "GloVe|GloVe C tool, seed 2|glove_c_seed2.txt"
    "skip-gram|lathe SGNS (cpu), seed 1|lathe_sgns_cpu.txt"
    "skip-gram|lathe SGNS (cpu), seed 2|lathe_sgns_cpu_seed2.txt"
    "skip-gram|fastText, seed 1|fasttext_seed1.vec"
    "skip-gram|fastText, seed 2|fasttext_seed2.vec"
)
done_rows=()
for row in "${rows[@]}"; do
    IFS='|' read -r method tool file <<<"$row"
    [[ -f $out/source/$file && -f $out/target/$file ]] || continue
    name=${file%.*}
    "$lathe" align map --source-tokenizer "$src_tok" --target-tokenizer "$tgt_tok" \
        --source-vectors "$out/source/$file" --target-vectors "$out/target/$file" \
        --output "$out/map_$name.json" --device cpu --force >"$out/map_$name.log" 2>&1 ||
        { tail -5 "$out/map_$name.log"; die "lathe align map ($file) failed"; }
    "$lathe" align eval --documents "$out/heldout.txt" --map "$out/map_$name.json" \
        --source-tokenizer "$src_tok" --target-tokenizer "$tgt_tok" >"$out/eval_$name.json" \
        2>"$out/eval_$name.log" || { tail -5 "$out/eval_$name.log"; die "lathe align eval ($file) failed"; }
    done_rows+=("$method|$tool|$name")
done

# The table. BLEU-1 is lathe align eval's; the decisions are counted from the map's report. Most
# held-out target tokens are gold (the same string in both vocabularies, mapped alike by every
# method), so two more columns look at the `aligned` ones only, per use in the held-out
# documents: "in doc" = the mapped source id occurs in the document's source tokenization (what
# BLEU-1 rewards before clipping), "piece" = the mapped source id is one of the source pieces of
# the target token's own text (HF tokenizers: source.encode(target.decode([id]))). Two rows with
# no vectors bound what the map's choices can do here: the first map with its `aligned` ids
# replaced by random source ids, and by the first source piece of their text (BLEU-1 computed
# here as eval_matrix.py does; the script checks it reproduces lathe's on the first map).
python3 - "$src_tok" "$tgt_tok" "$out" "${done_rows[@]}" <<'EOF' | tee "$out/table.md"
import collections, json, math, random, sys
from tokenizers import Tokenizer
src, tgt = Tokenizer.from_file(sys.argv[1]), Tokenizer.from_file(sys.argv[2])
out, rows = sys.argv[3], [r.split("|") for r in sys.argv[4:]]
docs = [l.rstrip("\n") for l in open(f"{out}/heldout.txt") if l.strip()]
SL = [e.ids for e in src.encode_batch(docs, add_special_tokens=False)]
S = [set(x) for x in SL]
T = [e.ids for e in tgt.encode_batch(docs, add_special_tokens=False)]
pieces = {}

def bleu1(mp):  # nltk sentence_bleu(weights=(1,)) per document, as TokAlign's eval_matrix.py
    total = 0.0
    for s, t in zip(SL, T):
        pred = [mp[str(i)] for i in t]
        cs, cp = collections.Counter(s), collections.Counter(pred)
        hit = sum(min(v, cs[k]) for k, v in cp.items())
        if not pred or hit == 0:
            continue
        bp = 1.0 if len(pred) > len(s) else math.exp(1 - len(s) / len(pred))
        total += hit / len(pred) * bp
    return total / len(SL)

first = None
print("| method | tool | alignment BLEU-1 | gold | aligned | fvt | aligned uses held out | in doc | piece |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for method, tool, name in rows:
    bleu = json.loads(open(f"{out}/eval_{name}.json").read().strip().splitlines()[-1])["alignment_bleu1"]
    mp = json.load(open(f"{out}/map_{name}.json"))
    dec, c = {}, collections.Counter()
    with open(f"{out}/map_{name}.report.tsv") as f:
        next(f)
        for line in f:
            p = line.split("\t")
            dec[int(p[0])] = p[2]
            c[p[2]] += 1
    uses = in_doc = piece = 0
    for s, t in zip(S, T):
        for i in t:
            if dec[i] != "aligned":
                continue
            if i not in pieces:
                pieces[i] = set(src.encode(tgt.decode([i]), add_special_tokens=False).ids)
            uses += 1
            in_doc += mp[str(i)] in s
            piece += mp[str(i)] in pieces[i]
    print(f"| {method} | {tool} | {bleu:.4f} | {c['gold']:,} | {c['aligned']:,} | {c['fvt']:,} | "
          f"{uses:,} | {in_doc / max(uses, 1):.3f} | {piece / max(uses, 1):.3f} |")
    if first is None:
        first = (tool, bleu, mp, dec)
tool, bleu, mp, dec = first
mine = bleu1(mp)
assert abs(mine - bleu) < 1e-9, f"BLEU-1 here {mine} != lathe align eval's {bleu}"
rnd, fp, rng = dict(mp), dict(mp), random.Random(0)
n_src = src.get_vocab_size(with_added_tokens=False)
for i, d in dec.items():
    if d == "aligned":
        rnd[str(i)] = rng.randrange(n_src)
        ids = src.encode(tgt.decode([i]), add_special_tokens=False).ids
        fp[str(i)] = ids[0] if ids else mp[str(i)]
print(f"| (no vectors) | {tool}'s map, every `aligned` id -> a random source id | {bleu1(rnd):.4f} | | | | | | |")
print(f"| (no vectors) | {tool}'s map, every `aligned` id -> the first source piece of its text | {bleu1(fp):.4f} | | | | | | |")
EOF
