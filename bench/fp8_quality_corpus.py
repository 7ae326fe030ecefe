#!/usr/bin/env python3
"""The corpus of the FP8 quality comparison (docs/FP8.md, configs/fp8-quality-300m.yaml): Debian's
GCIDE and the abstracts of PubMedQA's labelled set, one document per dictionary entry or question
(question, abstract, long answer), documents shuffled with a fixed seed so the validation split
(the last documents, GPT-NeoX's contiguous split) holds both sources. Written as text-blocks
(documents separated by a blank line) for `lathe prepare --format text-blocks`.

    python3 bench/fp8_quality_corpus.py OUT.txt [--gcide /usr/share/dictd/gcide.dict.dz]
        [--pubmedqa ../shared/corpora/pubmedqa_ori_pqal.json] [--seed 0]
"""
import argparse
import gzip
import json
import random
import sys


def source_arguments(description):
    """The command line both corpus scripts share: OUT, --gcide, --pubmedqa, --seed."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out")
    ap.add_argument("--gcide", default="/usr/share/dictd/gcide.dict.dz")
    ap.add_argument("--pubmedqa", default="../shared/corpora/pubmedqa_ori_pqal.json")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def read_sources(a, who):
    """GCIDE's text and PubMedQA's records, or exit naming the file that could not be read."""
    try:
        with gzip.open(a.gcide, "rb") as f:
            gcide = f.read().decode("utf-8", "replace")
        with open(a.pubmedqa, encoding="utf-8") as f:
            return gcide, json.load(f)
    except OSError as e:
        sys.exit(f"{who}: error: {e}")


def main():
    a = source_arguments(__doc__.split("\n\n")[0]).parse_args()
    gcide, pubmed = read_sources(a, "fp8_quality_corpus")
    docs = [b for b in gcide.split("\n\n") if b.strip()]
    for entry in pubmed.values():
        text = entry["QUESTION"] + "\n" + " ".join(entry["CONTEXTS"]) + "\n" + entry.get("LONG_ANSWER", "")
        docs.append(text.replace("\n\n", "\n"))
    random.Random(a.seed).shuffle(docs)
    with open(a.out + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    import os
    os.replace(a.out + ".tmp", a.out)
    print(f"{len(docs)} documents -> {a.out}")


if __name__ == "__main__":
    main()
