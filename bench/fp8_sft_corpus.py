#!/usr/bin/env python3
"""The fine-tuning data of the FP8 SFT comparison (docs/FP8.md, bench/fp8_sft.sh): alpaca records
(`instruction`, `input`, `output`) from two real sources, shuffled with a fixed seed so that the
validation split (the last records) holds both:
  - PubMedQA's labelled set: instruction the question, input the abstract, output the yes/no/maybe
    decision followed by the long answer;
  - Debian's GCIDE: instruction "Define the word: W" for the headword W of an entry, output its
    definition text (up to --gcide-records entries, those whose first line is a headword with its
    pronunciation, e.g. `Nailery \\Nail"er*y\\, n.`).
Written as JSON Lines for `lathe prepare --format alpaca`.

    python3 bench/fp8_sft_corpus.py OUT.jsonl [--gcide /usr/share/dictd/gcide.dict.dz]
        [--pubmedqa ../shared/corpora/pubmedqa_ori_pqal.json] [--gcide-records 20000] [--seed 0]
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_quality_corpus import read_sources, source_arguments  # noqa: E402

HEADWORD = re.compile(r"^([A-Za-z][^\\\n]{0,40}?) \\[^\\\n]*\\,?(.*)$")


def gcide_records(text, limit, rng):
    out = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        m = HEADWORD.match(lines[0])
        if not m:
            continue
        body = [m.group(2).strip()] + [l.strip() for l in lines[1:]]
        body = [l for l in body if l and l != "[1913 Webster]" and not l.startswith("[")]
        definition = " ".join(body).strip()
        if len(definition) < 20:
            continue
        out.append({"instruction": "Define the word: " + m.group(1).strip(), "input": "",
                    "output": definition})
    rng.shuffle(out)
    return out[:limit]


def main():
    ap = source_arguments(__doc__.split("\n\n")[0])
    ap.add_argument("--gcide-records", type=int, default=20000)
    a = ap.parse_args()
    gcide, pubmed = read_sources(a, "fp8_sft_corpus")
    rng = random.Random(a.seed)
    records = gcide_records(gcide, a.gcide_records, rng)
    for entry in pubmed.values():
        records.append({"instruction": entry["QUESTION"], "input": " ".join(entry["CONTEXTS"]),
                        "output": entry["final_decision"] + ". " + entry.get("LONG_ANSWER", "")})
    rng.shuffle(records)
    with open(a.out + ".tmp", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(a.out + ".tmp", a.out)
    print(f"{len(records)} records -> {a.out}")


if __name__ == "__main__":
    main()
