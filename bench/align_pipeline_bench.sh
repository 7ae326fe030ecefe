#!/usr/bin/env bash
# The speed of the whole of `lathe align run` (terms, prepare x2, embed x2, map,
# eval): 5 GB of text, or a measured slice with the scaling shown, in under 30 minutes on one H100
# machine. docs/ALIGN.md, "Whole pipeline", has the method and the results.
#
#   bench/align_pipeline_bench.sh pack [--data DIR]
#       here: copy what the run needs into DIR (default .carry/align-bench, ~39 MB): the biggest
#       English dictionaries and a few others (/usr/share/dictd/*.dict.dz), the two tokenizers and
#       the PubMedQA json (gzip-compressed, from ../shared).
#   bench/align_pipeline_bench.sh run --lathe BIN --out DIR [--work DIR] [--data DIR]
#       [--sizes 25M,50M,...] [--device cuda|cpu] [--iters 15] [--dim 300] [--threads N]
#       [--project 5G] [--budget SECONDS] [--keep]
#       there: build a corpus of each size and time `lathe align run` on it, then print the table
#       and the projection to --project bytes. Logs and results go to --out, the corpora, token
#       files and vectors to --work (default: --out). --budget: a size is skipped (with a note)
#       when the time so far plus its estimate exceeds it. The estimate: GloVe training as in the
#       last size (scaled by bytes while the text is real; repeated text adds no nonzeros) plus
#       the rest of its wall time extended along the line through the last two sizes (or in
#       proportion to the last size when there is one).
#   bench/align_pipeline_bench.sh table --out DIR [--sizes ...] [--project 5G]
#       the table and the projection again from DIR's logs (e.g. of the sizes that finished).
#
# The corpus. Real text: every dictionary of DATA/dicts cut into documents (dictd entries, split at
# blank lines, long ones cut at line ends into <= 8 KB) and the first 800 PubMedQA documents,
# interleaved in proportion (document j of a source with n documents sits at (j + 0.5) / n), so
# every prefix has the same mix. A size up to the real text's size is a prefix of it (cut at a
# document end); a larger size is the real text repeated (then a prefix). Sizes are decimal
# (25M = 25,000,000 bytes); `real` is all the real text. The other 200 PubMedQA documents are the
# held-out documents of stage 6; GCIDE is the general corpus of stage 1.
#
# What repetition does and does not show. Terms, prepare and co-occurrence counting read every
# token, so their time at a repeated size is a fair measure of reading that many tokens (if
# anything a little fast: the counting tables stop growing). GloVe's training step costs
# iterations x co-occurrence nonzeros, and repeating text adds no new nonzeros: its time at a
# repeated size is that of the real text. So the projection scales the training step by the
# nonzeros real text of the projected size would have: nonzeros = c x tokens^beta, fitted
# (least squares in log-log) on the sizes made of real text only, extrapolated to the projected
# token count. Every other stage is scaled linearly in bytes from the largest size measured.
#
# Each size runs in WORK/<size>/ (its corpus and the run's work dir; the corpus and token files
# deleted afterwards unless --keep) with its logs in OUT/<size>/ (run.yaml, summary.txt = the
# run's final summary, run.log, time.txt = /usr/bin/time -v). Prints one row per size and the
# projection; OUT/results.json has everything.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "align_pipeline_bench: $*" >&2; exit 2; }

cmd=${1:-}
[[ $cmd == pack || $cmd == run || $cmd == table ]] ||
    die "usage: $0 pack [--data DIR] | run --lathe BIN --out DIR [...] | table --out DIR [...] (see the header)"
shift
data=$root/.carry/align-bench
lathe=""
out=""
work=""
budget=0
sizes=25M,50M,100M,real,1G,2G
device=cuda
iters=15
dim=300
threads=0
project=5G
keep=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --data) data=$2; shift 2 ;;
        --lathe) lathe=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --dim) dim=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --project) project=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) die "unknown argument $1 (see the header of $0)" ;;
    esac
done

if [[ $cmd == pack ]]; then
    # Biggest English (gcide 13.5 MB -> 40 MB of text, foldoc), the biggest bilingual one
    # (deu-eng, 16.8 MB -> 100 MB) and three small scripts-other-than-Latin ones.
    dicts=(gcide foldoc freedict-deu-eng freedict-ara-eng freedict-eng-hin freedict-ell-eng)
    shared=$(cd "$root/.." && pwd)/shared
    mkdir -p "$data/dicts"
    for d in "${dicts[@]}"; do
        cp /usr/share/dictd/$d.dict.dz "$data/dicts/" || die "/usr/share/dictd/$d.dict.dz missing"
    done
    for f in tokenizers/gpt-neox-20b.json tokenizers/qwen3.json corpora/pubmedqa_ori_pqal.json; do
        gzip -9c "$shared/$f" >"$data/$(basename "$f").gz" || die "$shared/$f missing"
    done
    du -sh "$data"
    exit 0
fi

[[ -n $out ]] || die "--out DIR is required"
IFS=',' read -r -a size_list <<<"$sizes"

# to_bytes SIZE: 25M -> 25000000; real -> the pool's size.
to_bytes() {
    python3 -c "
import sys
s, pool = sys.argv[1].strip(), int(sys.argv[2])
if s == 'real': print(pool); sys.exit()
mult = {'K': 10**3, 'M': 10**6, 'G': 10**9}.get(s[-1:].upper(), 1)
print(int(float(s[:-1] if mult > 1 else s) * mult))" "$1" "$pool_bytes"
}

if [[ $cmd == run ]]; then
start=$(date +%s.%N)
[[ -n $lathe && -x $lathe ]] || die "--lathe BIN: the lathe binary is required"
[[ -d $data/dicts ]] || die "$data/dicts not found: run '$0 pack' here and carry $data"
mkdir -p "$out" "${work:=$out}"
out=$(cd "$out" && pwd)
work=$(cd "$work" && pwd)
data=$(cd "$data" && pwd)

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU')"
echo "== lathe: $lathe; device $device; GloVe $dim dimensions, $iters iterations; sizes $sizes"

# Inputs: tokenizers, the real-text pool and the held-out documents.
t0=$(date +%s.%N)
for f in gpt-neox-20b.json qwen3.json pubmedqa_ori_pqal.json; do
    [[ -f $work/$f ]] || gzip -dc "$data/$f.gz" >"$work/$f" || die "$data/$f.gz missing"
done
python3 - "$data/dicts" "$work/pubmedqa_ori_pqal.json" "$work/pool.txt" "$work/heldout.txt" <<'EOF' || die "building the real text failed"
import glob, gzip, json, os, re, sys
dicts, pubmed, pool, heldout = sys.argv[1:5]
MAX = 8192

def documents(text):
    for block in re.split(r"\n[ \t]*\n", text):
        block = block.strip("\n")
        if not block.strip():
            continue
        if len(block) <= MAX:
            yield block
            continue
        cur, size = [], 0
        for line in block.split("\n"):
            if size + len(line) + 1 > MAX and cur:
                yield "\n".join(cur)
                cur, size = [], 0
            cur.append(line)
            size += len(line) + 1
        if cur:
            yield "\n".join(cur)

sources = []
for path in sorted(glob.glob(os.path.join(dicts, "*.dict.dz"))):
    text = gzip.open(path, "rb").read().decode("utf-8", "replace")
    sources.append((os.path.basename(path), list(documents(text))))
d = json.load(open(pubmed))
docs = ["\n".join([v["QUESTION"], *v["CONTEXTS"], v["LONG_ANSWER"]]) for v in d.values()]
sources.append(("pubmedqa[:800]", [re.sub(r"\n[ \t]*\n", "\n", x) for x in docs[:800]]))
with open(heldout, "w") as f:
    f.writelines(x.replace("\n", " ") + "\n" for x in docs[800:])
order = sorted((((j + 0.5) / len(s), i, j) for i, (_, s) in enumerate(sources) for j in range(len(s))))
with open(pool, "w") as f:
    for _, i, j in order:
        f.write(sources[i][1][j])
        f.write("\n\n")
for name, s in sources:
    print(f"   {name}: {len(s):,} documents, {sum(len(x.encode()) for x in s):,} bytes")
print(f"   real text: {len(order):,} documents, {os.path.getsize(pool):,} bytes")
EOF
echo "== real text built in $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s"
pool_bytes=$(stat -c %s "$work/pool.txt")
echo "$pool_bytes" >"$out/pool.bytes"
prev_bytes=0 prev_rest=0 last_bytes=0 last_rest=0 last_train=0
for size in "${size_list[@]}"; do
    bytes=$(to_bytes "$size") || die "bad size $size"
    if [[ $budget != 0 ]]; then
        verdict=$(awk "BEGIN { e = $(date +%s.%N) - $start; b = $bytes;
            train = $last_train; if (b <= $pool_bytes && $last_bytes > 0) train *= b / $last_bytes;
            if ($last_bytes == 0) need = 0;
            else if ($prev_bytes == 0 || $last_bytes == $prev_bytes) need = $last_rest * b / $last_bytes + train;
            else need = $last_rest + ($last_rest - $prev_rest) / ($last_bytes - $prev_bytes) * (b - $last_bytes) + train;
            printf \"%s %.0f %.0f\", (e + need > $budget) ? \"skip\" : \"go\", e, need }")
        if [[ $verdict == skip* ]]; then
            read -r _ spent need <<<"$verdict"
            echo "== $size: skipped (--budget $budget: ${spent} s spent, about ${need} s needed)"
            continue
        fi
    fi
    dir=$out/$size
    wdir=$work/$size
    rm -rf "$dir" "$wdir"
    mkdir -p "$dir" "$wdir"
    # The corpus: a prefix of the pool cut at a document end, or the pool repeated.
    python3 - "$work/pool.txt" "$bytes" "$wdir/corpus.txt" >"$dir/corpus.info" <<'EOF' || die "building the $size corpus failed"
import os, shutil, sys
pool, want, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = os.path.getsize(pool)
with open(out, "wb") as f:
    copies = 0
    while want - f.tell() >= p:
        with open(pool, "rb") as src:
            shutil.copyfileobj(src, f, 64 << 20)
        copies += 1
    rest = want - f.tell()
    if rest > 0:
        with open(pool, "rb") as src:
            head = src.read(rest)
        cut = head.rfind(b"\n\n")
        # No document end in the rest: none of it (a size below the first document: all of it).
        f.write(head[: cut + 2] if cut >= 0 else (b"" if f.tell() else head))
    size = f.tell()
print(size, "real" if size <= p else "repeated")
EOF
    cat >"$dir/run.yaml" <<EOF
align: {work_dir: $wdir/work, threads: $threads}
source: {tokenizer: $work/gpt-neox-20b.json}
target: {tokenizer: $work/qwen3.json}
corpus: {inputs: [$wdir/corpus.txt], format: text-blocks, on_error: skip}
terms: {top_k: 2000, general: [$data/dicts/gcide.dict.dz]}
embed: {method: glove, device: $device, iters: $iters, dim: $dim}
map: {device: $device}
eval: {documents: $work/heldout.txt}
EOF
    echo "== $size: $(cut -d' ' -f1 "$dir/corpus.info") bytes ($(cut -d' ' -f2 "$dir/corpus.info") text); lathe align run"
    t0=$(date +%s.%N)
    timer=()
    [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v -o "$dir/time.txt")
    "${timer[@]}" "$lathe" align run "$dir/run.yaml" --no-progress >"$dir/summary.txt" 2>"$dir/run.log"
    rc=$?
    awk "BEGIN { print $(date +%s.%N) - $t0 }" >"$dir/wall.txt"
    # GloVe training seconds of both sides, from the summary's "(N s training)".
    last_train=$(grep -o '([0-9.]* s training)' "$dir/summary.txt" | tr -d '(' | awk '{ t += $1 } END { print t + 0 }')
    prev_bytes=$last_bytes prev_rest=$last_rest last_bytes=$bytes
    last_rest=$(awk "BEGIN { print $(cat "$dir/wall.txt") - $last_train }")
    cat "$dir/summary.txt"
    if [[ $rc != 0 ]]; then
        tail -20 "$dir/run.log"
        echo "== $size: lathe align run failed (rc $rc, log $dir/run.log); no larger sizes"
        break
    fi
    [[ $keep == 1 ]] || rm -rf "$wdir/corpus.txt" "$wdir/work/tokens"
done
fi
[[ -f $out/pool.bytes ]] || die "$out/pool.bytes not found: not a run folder"
pool_bytes=$(cat "$out/pool.bytes")
done_sizes=()
for size in "${size_list[@]}"; do
    [[ -f $out/$size/summary.txt ]] && grep -q "done in" "$out/$size/summary.txt" && done_sizes+=("$size")
done
[[ ${#done_sizes[@]} -gt 0 ]] || die "no finished size in $out"

# The table and the projection.
python3 - "$out" "$pool_bytes" "$(to_bytes "$project")" "$project" "${done_sizes[@]}" <<'EOF'
import json, math, os, re, sys
out, pool, proj_bytes, proj_name, sizes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]

def count(s):  # lathe's format_count: 375.7k, 2.47M, 1.2G
    m = re.fullmatch(r"([0-9.]+)([kMGT]?)", s)
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]

rows = []
for size in sizes:
    d = os.path.join(out, size)
    summary = open(os.path.join(d, "summary.txt")).read()
    log = open(os.path.join(d, "run.log")).read()
    r = {"size": size, "stages": {}, "detail": {}}
    for line in summary.splitlines():
        m = re.match(r"  (\S+(?: \S+)?)\s+(ran|up to date|not configured)\s+([0-9.]+) s  (.*)$", line)
        if m:
            r["stages"][m.group(1)] = float(m.group(3))
            r["detail"][m.group(1)] = m.group(4)
        m = re.match(r"align run: done in ([0-9.]+) s", line)
        if m:
            r["total"] = float(m.group(1))
    info = open(os.path.join(d, "corpus.info")).read().split()
    r["bytes"], r["real"] = int(info[0]), info[1] == "real"
    for side in ("source", "target"):
        m = re.search(r"(\d+) documents, (\d+) tokens", r["detail"].get(f"prepare {side}", ""))
        r[f"tokens_{side}"] = int(m.group(2)) if m else None
        m = re.search(r"\(([0-9.]+) s training\)", r["detail"].get(f"embed {side}", ""))
        r[f"train_{side}"] = float(m.group(1)) if m else None
    # The embed log lines come source first, then target.
    nnz = re.findall(r"embed: ([0-9.]+[kMGT]?) co-occurrence entries \(([0-9.]+) s\)", log)
    if len(nnz) == 2:
        r["nnz_source"], r["nnz_target"] = count(nnz[0][0]), count(nnz[1][0])
        r["count_source"], r["count_target"] = float(nnz[0][1]), float(nnz[1][1])
    rows.append(r)

def rss(size):
    p = os.path.join(out, size, "time.txt")
    if not os.path.exists(p):
        return ""
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(p).read())
    return f"{int(m.group(1)) / 1e6:.1f}" if m else ""

stages = ["terms", "prepare source", "prepare target", "embed source", "embed target", "map", "eval"]
print()
print("| size | text | bytes | tokens source / target | nonzeros source / target | "
      + " | ".join(stages) + " | total s | peak RSS GB |")
print("| " + " | ".join(["---"] * (len(stages) + 7)) + " |")
for r in rows:
    def g(k):
        v = r["stages"].get(k)
        return f"{v:.1f}" if v is not None else "-"
    emb = lambda side: (f"{g('embed ' + side)} (count {r.get('count_' + side, 0):.1f}, train "
                        f"{r.get('train_' + side) or 0:.1f})")
    cells = [g("terms"), g("prepare source"), g("prepare target"), emb("source"), emb("target"),
             g("map"), g("eval")]
    print(f"| {r['size']} | {'real' if r['real'] else 'repeated'} | {r['bytes']:,} | "
          f"{r['tokens_source']:,} / {r['tokens_target']:,} | "
          f"{r.get('nnz_source', 0):,.0f} / {r.get('nnz_target', 0):,.0f} | " + " | ".join(cells)
          + f" | {r.get('total', 0):.1f} | {rss(r['size'])} |")

# Nonzeros vs tokens on real text: nnz = c * tokens^beta per side.
real = [r for r in rows if r["real"] and r.get("nnz_source")]
fit = {}
for side in ("source", "target"):
    pts = [(math.log(r[f"tokens_{side}"]), math.log(r[f"nnz_{side}"])) for r in real]
    if len(pts) >= 2:
        n = len(pts); mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
        beta = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        fit[side] = (beta, my - beta * mx)
print()
for side, (beta, a) in fit.items():
    print(f"nonzeros ~ tokens^{beta:.3f} on the {side} side (least squares over {len(real)} real-text sizes: "
          + ", ".join(f"{r[f'tokens_{side}']:,} -> {r[f'nnz_{side}']:,.0f}" for r in real) + ")")

# Projection. Stages that read the corpus: t = a + b x bytes, least squares over every size (a
# is start-up: loading tokenizers, the general corpus); for embed this is its time less the
# training step. Training: the largest real-text run's time x the nonzeros ratio.
big = max(rows, key=lambda r: r["bytes"])
scale = proj_bytes / big["bytes"]

def linear(k, minus=None, subset=None):
    pts = [(r["bytes"], r["stages"][k] - ((r[minus] or 0) if minus else 0))
           for r in (subset or rows) if k in r["stages"]]
    if len({x for x, _ in pts}) < 2:
        return pts[-1][1] * proj_bytes / pts[-1][0]
    n = len(pts); mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my + b * (proj_bytes - mx)

proj, notes = {}, []
for k in ("terms", "prepare source", "prepare target", "map", "eval"):
    if k in big["stages"]:
        proj[k] = linear(k) if k.startswith(("terms", "prepare")) else big["stages"][k]
for side in ("source", "target"):
    k = f"embed {side}"
    if k not in big["stages"]:
        continue
    # Counting on repeated text is faster than on real text of the same size (the tables hold
    # fewer keys, so fewer cache misses): also fit on the real-text sizes alone, take the larger.
    rest = linear(k, f"train_{side}")
    if len(real) >= 2:
        rest_real = linear(k, f"train_{side}", real)
        notes.append(f"{side}: embed less training {rest:.0f} s fitted over every size, "
                     f"{rest_real:.0f} s over the real-text sizes alone; the larger is used")
        rest = max(rest, rest_real)
    train = big[f"train_{side}"] or 0
    if side in fit and real:
        ref = max(real, key=lambda r: r["bytes"])
        beta, a = fit[side]
        tokens = big[f"tokens_{side}"] * scale
        nnz = math.exp(a) * tokens ** beta
        train = (ref[f"train_{side}"] or 0) * nnz / ref[f"nnz_{side}"]
        notes.append(f"{side}: {tokens:,.0f} tokens -> {nnz:,.0f} nonzeros (x{nnz / ref[f'nnz_{side}']:.1f} "
                     f"the {ref['size']} real text's), {nnz * 16 / 1e9:.1f} GB of GloVe entries "
                     f"(16 B each, host and GPU); training {train:.1f} s")
    proj[k] = rest + train
print()
print(f"projection to {proj_name} ({proj_bytes:,} bytes, x{scale:.2f} the largest run, {big['size']}): "
      + ", ".join(f"{k} {v:.0f} s" for k, v in proj.items())
      + f"; total {sum(proj.values()):.0f} s ({sum(proj.values()) / 60:.1f} min)")
for n in notes:
    print("  " + n)
print("  (terms, prepare and embed less training: a + b x bytes fitted over every size; "
      "map and eval as measured: they do not depend on the corpus size)")
json.dump({"rows": rows, "fit": fit, "projection": proj, "project_bytes": proj_bytes},
          open(os.path.join(out, "results.json"), "w"), indent=1)
EOF
