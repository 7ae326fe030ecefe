#!/usr/bin/env python3
"""Helpers for bench/embed_bench.sh (stage 3 of `lathe align`, docs/ALIGN.md "Embeddings").

  embed_bench.py totext PREFIX OUT.txt
      The token file PREFIX.bin/.idx as text for the reference tools: one document per line,
      token ids as space-separated words (what TokAlign feeds GloVe; GloVe's cooccur resets its
      window at each newline, so windows stay inside documents as in lathe).
  embed_bench.py compare A.txt B.txt [--probe 1000] [--top 10]
      A quality proxy between two vector files (GloVe text; fastText's .vec header and </s>,
      GloVe's <unk> are skipped): over the tokens both files have, for each of the `probe` most
      frequent (file A's order: lathe and GloVe write rows by descending count), the overlap of
      its `top` cosine nearest neighbours in A and in B. Prints the mean overlap (1.0 = same
      neighbour sets) as JSON.
  embed_bench.py neighbours VEC.txt TOKENIZER.json WORD... [--top 8]
      The nearest neighbours of a few words (each must be one token) decoded through the
      tokenizer: a readable sanity check.

numpy only (tokenizers for `neighbours`)."""

import json
import sys

import numpy as np

_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def read_token_file(prefix):
    """(tokens, doc_bounds): the .bin as one array and document start/end offsets in tokens."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix + ".idx: not a token index"
    dtype = np.dtype(_DTYPES[idx[17]])
    seqs = int(np.frombuffer(idx, np.uint64, 1, 18)[0])
    docs = int(np.frombuffer(idx, np.uint64, 1, 26)[0])
    off = 34
    sizes = np.frombuffer(idx, np.int32, seqs, off)
    off += 4 * seqs
    pointers = np.frombuffer(idx, np.int64, seqs, off)
    off += 8 * seqs
    doc_idx = np.frombuffer(idx, np.int64, docs, off)
    tokens = np.fromfile(prefix + ".bin", dtype)
    seq_start = pointers // dtype.itemsize
    seq_end = seq_start + sizes
    starts = np.append(seq_start, len(tokens))[doc_idx[:-1]]
    ends = np.append(seq_end, len(tokens))[np.maximum(doc_idx[1:] - 1, 0)]
    return tokens, starts, ends


def totext(prefix, out):
    tokens, starts, ends = read_token_file(prefix)
    with open(out, "w") as f:
        for s, e in zip(starts, ends):
            if e > s:
                f.write(" ".join(map(str, tokens[s:e].tolist())))
                f.write("\n")


def read_vectors(path):
    ids, rows = [], []
    with open(path) as f:
        for n, line in enumerate(f):
            parts = line.split()
            if n == 0 and len(parts) == 2:
                continue  # word2vec / fastText header
            if not parts or not parts[0].isdigit():
                continue  # <unk>, </s>
            ids.append(int(parts[0]))
            rows.append(np.asarray(parts[1:], dtype=np.float32))
    m = np.vstack(rows)
    m /= np.linalg.norm(m, axis=1, keepdims=True) + 1e-12
    return ids, m


def neighbour_sets(ids, m, probe_ids, top):
    pos = {t: i for i, t in enumerate(ids)}
    q = m[[pos[t] for t in probe_ids]]
    sims = q @ m.T
    for k, t in enumerate(probe_ids):
        sims[k, pos[t]] = -np.inf
    best = np.argpartition(-sims, top, axis=1)[:, :top]
    return [set(ids[j] for j in row) for row in best]


def compare(a_path, b_path, probe, top):
    a_ids, a = read_vectors(a_path)
    b_ids, b = read_vectors(b_path)
    shared = set(a_ids) & set(b_ids)
    a_keep = [i for i, t in enumerate(a_ids) if t in shared]
    order = [a_ids[i] for i in a_keep]
    b_pos = {t: i for i, t in enumerate(b_ids)}
    a_m = a[a_keep]
    b_m = b[[b_pos[t] for t in order]]
    probe_ids = order[:probe]
    na = neighbour_sets(order, a_m, probe_ids, top)
    nb = neighbour_sets(order, b_m, probe_ids, top)
    overlap = float(np.mean([len(x & y) / top for x, y in zip(na, nb)]))
    print(json.dumps({"a": a_path, "b": b_path, "a_tokens": len(a_ids), "b_tokens": len(b_ids),
                      "shared": len(shared), "probe": len(probe_ids), "top": top,
                      "mean_overlap": round(overlap, 4)}))


def neighbours(vec_path, tokenizer_path, words, top):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    ids, m = read_vectors(vec_path)
    pos = {t: i for i, t in enumerate(ids)}
    for w in words:
        enc = tok.encode(w).ids
        if len(enc) != 1 or enc[0] not in pos:
            print(f"{w!r}: not one token with a vector ({enc})")
            continue
        sims = m @ m[pos[enc[0]]]
        sims[pos[enc[0]]] = -np.inf
        best = np.argsort(-sims)[:top]
        print(f"{w!r}: " + ", ".join(f"{tok.decode([ids[j]])!r} {sims[j]:.2f}" for j in best))


def main(argv):
    if len(argv) >= 3 and argv[0] == "totext":
        totext(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "compare":
        probe = int(argv[argv.index("--probe") + 1]) if "--probe" in argv else 1000
        top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 10
        compare(argv[1], argv[2], probe, top)
    elif len(argv) >= 4 and argv[0] == "neighbours":
        top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 8
        words = [w for w in argv[3:] if w != "--top" and not w.isdigit()]
        neighbours(argv[1], argv[2], words, top)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
