#!/usr/bin/env python3
"""Tokenization throughput: `lathe tokenize` against Hugging Face `tokenizers`, side by side.

    python3 bench/tokenize_bench.py --lathe build/lathe [--mb 16] [--runs 3]
                                    [--tokenizers gpt2 llama3] [--shared ../shared] [--dict gcide]

Text: the first --mb megabytes of a Debian dictionary (/usr/share/dictd/<dict>.dict.dz, after its
header; default gcide, English; e.g. freedict-jpn-eng, freedict-deu-eng, freedict-eng-hin for
other scripts), cut into documents of about 2 KB at dictionary-entry boundaries.

Measured, for each tokenizer, the best of --runs interleaved runs:
  * HF 1 thread:   Tokenizer.encode_batch(docs, add_special_tokens=False) in a fresh Python process
                   with RAYON_NUM_THREADS=1 (the batch call is timed, not loading or reading);
  * HF all threads: the same with Rayon's default pool (TOKENIZERS_PARALLELISM=true);
  * lathe 1 thread / all threads: `lathe tokenize --threads N` over the same documents as JSONL,
    timed end to end as a process (loading the tokenizer.json, parsing JSON, writing the ids),
    output to /dev/null.
MB/s = UTF-8 bytes of the document texts / seconds. The ids of both are compared on the whole
corpus once (must be equal) so that the speed is for the same work.
Prints a Markdown table for docs/PERF.md.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HF_TIMER = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t0 = time.perf_counter()
tok.encode_batch(docs, add_special_tokens=False)
print(time.perf_counter() - t0)
"""


def dictionary_documents(name, megabytes):
    data = gzip.open(f"/usr/share/dictd/{name}.dict.dz", "rb").read()
    text = data.decode("utf-8", errors="replace")
    text = text[text.find("\n\n", 10000) + 2:]  # skip the dictionary's header entries
    docs, cur, total = [], [], 0
    limit = int(megabytes * 1e6)
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        cur.append(block)
        if sum(len(b) for b in cur) > 2000:
            doc = "\n\n".join(cur) + "\n"
            docs.append(doc)
            total += len(doc.encode("utf-8"))
            cur = []
            if total >= limit:
                break
    return docs, total


def time_hf(tokenizer, jsonl, threads):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
    if threads == 1:
        env["RAYON_NUM_THREADS"] = "1"
    else:
        env.pop("RAYON_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", HF_TIMER, str(tokenizer), str(jsonl)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def time_lathe(lathe, tokenizer, jsonl, threads):
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run([lathe, "tokenize", "--tokenizer", str(tokenizer), "--threads", str(threads),
                        "--input", str(jsonl)], stdout=null, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def check_same_ids(lathe, tokenizer, jsonl, docs):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(tokenizer))
    out = subprocess.run([lathe, "tokenize", "--tokenizer", str(tokenizer), "--input", str(jsonl)],
                         capture_output=True, check=True)
    got = [json.loads(l)["ids"] for l in out.stdout.decode().splitlines()]
    expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    bad = sum(1 for a, b in zip(got, expected) if a != b) + abs(len(got) - len(expected))
    if bad:
        sys.exit(f"{tokenizer.name}: {bad} documents differ between lathe and HF; not timing")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lathe", default=str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
    ap.add_argument("--shared", default=os.environ.get(
        "LATHE_SHARED_DIR", str(Path(__file__).resolve().parents[2] / "shared")))
    ap.add_argument("--tokenizers", nargs="+", default=["gpt2", "llama3"])
    ap.add_argument("--mb", type=float, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dict", default="gcide", help="dictd dictionary to take the text from")
    args = ap.parse_args()

    docs, nbytes = dictionary_documents(args.dict, args.mb)
    cores = os.cpu_count()
    print(f"corpus: {len(docs)} {args.dict} documents, {nbytes / 1e6:.1f} MB; {cores} cores",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / "docs.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        for name in args.tokenizers:
            tok = Path(args.shared) / "tokenizers" / f"{name}.json"
            check_same_ids(args.lathe, tok, jsonl, docs)
            best = {}
            for _ in range(args.runs):  # interleaved, so load changes hit every variant alike
                for key, fn in [("hf1", lambda: time_hf(tok, jsonl, 1)),
                                ("hfN", lambda: time_hf(tok, jsonl, cores)),
                                ("lathe1", lambda: time_lathe(args.lathe, tok, jsonl, 1)),
                                ("latheN", lambda: time_lathe(args.lathe, tok, jsonl, cores))]:
                    t = fn()
                    best[key] = min(best.get(key, t), t)
            mbs = {k: nbytes / 1e6 / v for k, v in best.items()}
            rows.append((name, mbs))
            print(f"{name}: " + ", ".join(f"{k} {v:.2f} MB/s ({best[k]:.2f} s)" for k, v in mbs.items()),
                  flush=True)

    print()
    print(f"| tokenizer | HF 1 thread | lathe 1 thread | ratio | HF {cores} threads | "
          f"lathe {cores} threads | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rows:
        print(f"| {name} | {m['hf1']:.2f} MB/s | {m['lathe1']:.2f} MB/s | {m['lathe1'] / m['hf1']:.1f}x "
              f"| {m['hfN']:.2f} MB/s | {m['latheN']:.2f} MB/s | {m['latheN'] / m['hfN']:.1f}x |")


if __name__ == "__main__":
    main()
