#!/usr/bin/env python3
"""Byte-level BPE training time: `lathe tokenizer train` against Hugging Face's BpeTrainer.

Same text, same vocabulary size, same pre-tokenizer (GPT-2's ByteLevel), 1 and 2 threads (HF via
RAYON_NUM_THREADS, each run in its own process because rayon's pool is fixed at first use).

Corpus: the first --mb MB of GCIDE (default: all of it, about 40 MB), one JSONL document per
dictionary block, written once to a temporary folder.
  * lathe: the whole command, wall clock: read JSONL, pre-tokenize and count, train, write, and
    load the result back as a self-check.
  * HF: Tokenizer.train_from_iterator over the same documents, already in memory (reading and
    JSON parsing not timed, which favours HF), then the trained vocabularies and merges are
    compared with lathe's.

Usage: python3 bench/tokenizer_train_bench.py [--lathe build/lathe] [--mb 40] [--vocab 32000]
       [--threads 1,2] [--repeat 1]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HF_CHILD = r"""
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
corpus, vocab, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
docs = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8")]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
t, c = time.perf_counter(), time.process_time()
tok.train_from_iterator(docs, trainer)
print(time.perf_counter() - t, time.process_time() - c)
tok.save(out)
"""


def gcide_blocks(limit_bytes):
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    raw = bytearray()
    with open("/usr/share/dictd/gcide.dict.dz", "rb") as f:
        while len(raw) < limit_bytes:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            raw += d.decompress(chunk)
    text = bytes(raw[:limit_bytes]).decode("utf-8", "ignore")
    docs, cur = [], []
    for line in text.split("\n"):
        if line.strip(" \t\r\v\f") == "":
            if cur:
                docs.append("\n".join(cur))
                cur = []
        else:
            cur.append(line)
    if cur:
        docs.append("\n".join(cur))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lathe", default=str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
    ap.add_argument("--mb", type=float, default=40.0)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting; the best is kept")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="lathe_bpe_bench_"))
    docs = gcide_blocks(int(args.mb * 1e6))
    corpus = tmp / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    text_mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {len(docs)} documents, {text_mb:.1f} MB of text; vocab {args.vocab}")
    print("wall = elapsed seconds, cpu = CPU seconds of all threads (best of --repeat runs)")
    print(f"{'threads':>7}  {'lathe wall':>10}  {'HF wall':>8}  {'speed-up':>8}  "
          f"{'lathe cpu':>9}  {'HF cpu':>7}  same vocab+merges")

    for threads in [int(t) for t in args.threads.split(",")]:
        lathe_out, hf_out = tmp / f"lathe{threads}.json", tmp / f"hf{threads}.json"
        best_l = best_h = cpu_l = cpu_h = float("inf")
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([args.lathe, "-q", "tokenizer", "train", "--vocab-size", str(args.vocab),
                            "--input", str(corpus), "--output", str(lathe_out),
                            "--threads", str(threads)], check=True)
            best_l = min(best_l, time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_l = min(cpu_l, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
            p = subprocess.run([sys.executable, "-c", HF_CHILD, str(corpus), str(args.vocab),
                                str(hf_out)], check=True, capture_output=True, text=True, env=env)
            wall, cpu = map(float, p.stdout.strip().splitlines()[-1].split())
            best_h, cpu_h = min(best_h, wall), min(cpu_h, cpu)
        ours = json.loads(lathe_out.read_text(encoding="utf-8"))["model"]
        theirs = json.loads(hf_out.read_text(encoding="utf-8"))["model"]
        same = ours["vocab"] == theirs["vocab"] and \
            [tuple(m) for m in ours["merges"]] == [tuple(m) for m in theirs["merges"]]
        print(f"{threads:>7}  {best_l:>10.2f}  {best_h:>8.2f}  {best_h / best_l:>7.1f}x  "
              f"{cpu_l:>9.2f}  {cpu_h:>7.2f}  {same}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
