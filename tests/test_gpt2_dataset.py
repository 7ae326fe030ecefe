"""lathe's GPT-NeoX sample construction against a Python reference of GPT-NeoX, and numpy.

The reference below re-implements, with numpy only (no torch), what GPT-NeoX's
megatron/data/gpt2_dataset.py, data_utils.py, blendable_dataset.py and helpers.cpp do for
dataset_impl "gpt2", pack_impl "packed": _build_index_mappings (doc_idx, sample_idx, shuffle_idx,
their dtypes and cache names), GPT2Dataset.__getitem__ with label files and its IndexError wrap,
get_train_valid_test_split_, get_normalized_weights_and_num_samples, weights_by_num_docs,
BlendableDataset with build_blending_indices. Megatron-LM's separate-last-epoch variant is there too.

lathe is driven through the data_tests binary (src/data/gpt2_dataset_driver_test.cpp): a JSON spec
in, the samples and the paths of the .npy caches it wrote out. The test compares every index array
(dtype, shape, values and the bytes of the .npy file), every dumped sample (tokens, labels, document
boundaries) and numpy's RandomState streams.
"""

import json
import math
import os
import struct
import subprocess
from itertools import cycle, islice, zip_longest

import numpy as np
import pytest

BUILD_DIR = os.environ.get("LATHE_BUILD_DIR")


def driver_binary():
    if not BUILD_DIR:
        pytest.skip("LATHE_BUILD_DIR is not set (CTest sets it)")
    path = os.path.join(BUILD_DIR, "data_tests")
    assert os.path.exists(path), f"{path} not built: ninja -C {BUILD_DIR} data_tests"
    return path


def run_lathe(tmp_path, spec, tag="run"):
    spec = dict(spec)
    spec["out"] = str(tmp_path / f"{tag}_result.json")
    spec_path = tmp_path / f"{tag}_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, LATHE_GPT2_DATASET_SPEC=str(spec_path))
    proc = subprocess.run(
        [driver_binary(), "--gtest_filter=Gpt2DatasetDriver.*"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((tmp_path / f"{tag}_result.json").read_text())


# ---------------------------------------------------------------------------------------------
# Reference: GPT-NeoX's index building (gpt2_dataset.py + helpers.cpp), numpy only.
# ---------------------------------------------------------------------------------------------


class Documents:
    """An MMapIndexedDataset stand-in: `sizes` (int32) and get(idx, offset, length)."""

    def __init__(self, docs):
        self.docs = [np.asarray(d, dtype=np.int64) for d in docs]
        self.sizes = np.array([len(d) for d in self.docs], dtype=np.int32)

    def get(self, idx, offset=0, length=None):
        d = self.docs[idx]
        if length is None:
            return d[offset:]
        return d[offset : offset + length]


def num_tokens(documents, sizes):
    return np.sum(sizes[documents])


def num_epochs_for(tokens_per_epoch, seq_length, num_samples):
    num_epochs = 0
    total_tokens = 0
    while True:
        num_epochs += 1
        total_tokens += tokens_per_epoch
        if ((total_tokens - 1) // seq_length) >= num_samples:
            return num_epochs


def build_doc_idx(documents, num_epochs, np_rng, separate_last_epoch=False):
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.mgrid[0:num_epochs, 0 : len(documents)][1]
        doc_idx[:] = documents
        doc_idx = doc_idx.reshape(-1).astype(np.int32)
        np_rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, num_epochs - 1, np_rng, False)
    last = build_doc_idx(documents, 1, np_rng, False)
    return np.concatenate((first, last))


def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """helpers.cpp build_sample_idx_int32/_int64, with GPT-NeoX's choice between them."""
    float_samples = (num_epochs * tokens_per_epoch - 1) / seq_length
    dtype = np.int32 if 2 * (float_samples + 1) < np.iinfo(np.int32).max else np.int64
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros([num_samples + 1, 2], dtype=dtype)
    sample_index = 1
    doc_idx_index = 0
    doc_offset = 0
    while sample_index <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = int(sizes[doc_idx[doc_idx_index]]) - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index] = (doc_idx_index, doc_offset)
        sample_index += 1
    return sample_idx


def build_shuffle_idx(num_samples, total_size, np_rng):
    dtype_ = np.uint32
    if total_size >= (np.iinfo(np.uint32).max - 1):
        dtype_ = np.int64
    first = np.arange(0, num_samples, 1, dtype=dtype_)
    np_rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, 1, dtype=dtype_)
    np_rng.shuffle(last)
    return np.concatenate((first, last))


def cache_base(prefix, name, num_samples, seq_length, seed, naming="gpt-neox", allow_chopped=True):
    base = f"{prefix}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s"
    if naming == "gpt-neox":
        base += "_packedpi"
        if allow_chopped:
            base += "_ac"
    return base


def build_index_mappings(name, prefix, documents, sizes, num_samples, num_epochs, seq_length,
                         seed, flavor="gpt-neox", naming="gpt-neox", save_to=None):
    tokens_per_epoch = num_tokens(documents, sizes)
    if not num_epochs:
        num_epochs = num_epochs_for(tokens_per_epoch, seq_length, num_samples)
    np_rng = np.random.RandomState(seed=seed)
    separate_last_epoch = False
    if flavor == "megatron" and num_epochs > 1:
        from_epochs_minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_num_samples = num_samples - from_epochs_minus_one
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate_last_epoch = last_epoch_num_samples < int(0.80 * per_epoch)
    doc_idx = build_doc_idx(documents, num_epochs, np_rng, separate_last_epoch)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    total = sample_idx.shape[0] - 1
    first = from_epochs_minus_one if separate_last_epoch else total
    shuffle_idx = build_shuffle_idx(first, total, np_rng)
    if save_to is not None:
        base = cache_base(save_to, name, num_samples, seq_length, seed, naming)
        np.save(base + "_doc_idx.npy", doc_idx, allow_pickle=True)
        np.save(base + "_sample_idx.npy", sample_idx, allow_pickle=True)
        np.save(base + "_shuffle_idx.npy", shuffle_idx, allow_pickle=True)
    return doc_idx, sample_idx, shuffle_idx, num_epochs, separate_last_epoch


class RefGPT2Dataset:
    def __init__(self, name, prefix, documents, indexed, num_samples, num_epochs, seq_length, seed,
                 label_dataset=None, flavor="gpt-neox", naming="gpt-neox"):
        self.name = name
        self.prefix = prefix
        self.indexed_dataset = indexed
        self.label_dataset = label_dataset
        self.seq_length = seq_length
        self.flavor = flavor
        self.num_samples = num_samples
        self.seed = seed
        self.naming = naming
        (self.doc_idx, self.sample_idx, self.shuffle_idx, self.num_epochs,
         self.separate_last_epoch) = build_index_mappings(
            name, prefix, documents, indexed.sizes, num_samples, num_epochs, seq_length, seed,
            flavor, naming)
        self.shuffle_idx_len = self.shuffle_idx.shape[0] - 1
        self.sample_idx_len = self.sample_idx.shape[0] - 1

    def __len__(self):
        if self.flavor == "megatron":
            return self.sample_idx.shape[0] - 1
        return min(self.shuffle_idx_len, self.sample_idx_len)

    def pieces(self, idx):
        doc_index_f = self.sample_idx[idx][0]
        doc_index_l = self.sample_idx[idx + 1][0]
        offset_f = self.sample_idx[idx][1]
        offset_l = self.sample_idx[idx + 1][1]
        if doc_index_f == doc_index_l:
            return [(self.doc_idx[doc_index_f], offset_f, offset_l - offset_f + 1)]
        out = [(self.doc_idx[doc_index_f], offset_f, None)]
        for i in range(doc_index_f + 1, doc_index_l):
            out.append((self.doc_idx[i], 0, None))
        out.append((self.doc_idx[doc_index_l], 0, offset_l + 1))
        return out

    def __getitem__(self, idx):
        try:
            idx = self.shuffle_idx[idx]
            pieces = self.pieces(idx)
            datasets = [self.indexed_dataset]
            if self.label_dataset is not None:
                datasets.append(self.label_dataset)
            samples = []
            for dataset in datasets:
                parts = [dataset.get(d, offset=o, length=l) for d, o, l in pieces]
                samples.append(np.concatenate(parts))
            for i in range(len(samples)):
                mask = (self.label_dataset is not None) and (i == 1)
                if len(samples[i]) < self.seq_length + 1:
                    samples[i] = np.pad(samples[i], (0, self.seq_length + 1 - len(samples[i])),
                                        mode="constant", constant_values=-100 if mask else 0)
                elif len(samples[i]) > self.seq_length + 1:
                    samples[i] = samples[i][: self.seq_length + 1]
            ret = {"text": np.array(samples[0], dtype=np.int64)}
            if self.label_dataset is not None:
                ret["label"] = np.array(samples[1], dtype=np.int64)
            # Document boundaries as lathe reports them (non-empty pieces in order).
            segments, at = [], 0
            for d, o, l in pieces:
                n = int(self.indexed_dataset.sizes[d]) - int(o) if l is None else int(l)
                if n > 0:
                    segments.append([at, n, int(d)])
                    at += n
            ret["documents"] = segments
            return ret
        except IndexError:
            return self[idx % len(self)]


def get_train_valid_test_split_(splits_string, size):
    splits = []
    if splits_string.find(",") != -1:
        splits = [float(s) for s in splits_string.split(",")]
    elif splits_string.find("/") != -1:
        splits = [float(s) for s in splits_string.split("/")]
    else:
        splits = [float(splits_string)]
    while len(splits) < 3:
        splits.append(0.0)
    splits = splits[:3]
    splits_sum = sum(splits)
    assert splits_sum > 0.0
    splits = [split / splits_sum for split in splits]
    splits_index = [0]
    for index, split in enumerate(splits):
        splits_index.append(splits_index[index] + int(round(split * float(size))))
    diff = splits_index[-1] - size
    for index in range(1, len(splits_index)):
        splits_index[index] -= diff
    assert len(splits_index) == 4
    assert splits_index[-1] == size
    return splits_index


def get_normalized_weights_and_num_samples(weights, num_samples):
    weight_sum = sum(weights)
    assert weight_sum > 0.0
    weights = [weight / weight_sum for weight in weights]
    if num_samples is not None:
        weighted_num_samples = [int(math.ceil(num_samples * w * 1.005)) for w in weights]
    else:
        weighted_num_samples = [None for _ in weights]
    return weights, weighted_num_samples


def weights_by_num_docs(l, alpha=0.3):
    if len(l) == 1:
        return [1.0]
    total_n_docs = sum(l)
    unbiased_sample_probs = [i / total_n_docs for i in l]
    probs = [i**alpha for i in unbiased_sample_probs]
    total = sum(probs)
    probs = [i / total for i in probs]
    unbiased_sample_probs_inverse = [1 - p for p in unbiased_sample_probs]
    weights = [p * p2 for p, p2 in zip(probs, unbiased_sample_probs_inverse)]
    total = sum(weights)
    return [i / total for i in weights]


def build_blending_indices(weights, size):
    dataset_index = np.zeros(size, dtype=np.uint8)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    current = [0] * len(weights)
    for sample_idx in range(size):
        sample_idx_double = max(float(sample_idx), 1.0)
        max_error_index = 0
        max_error = weights[0] * sample_idx_double - float(current[0])
        for d in range(1, len(weights)):
            error = weights[d] * sample_idx_double - float(current[d])
            if error > max_error:
                max_error = error
                max_error_index = d
        dataset_index[sample_idx] = max_error_index
        dataset_sample_index[sample_idx] = current[max_error_index]
        current[max_error_index] += 1
    return dataset_index, dataset_sample_index


class RefBlendableDataset:
    def __init__(self, datasets, weights):
        self.datasets = datasets
        self.size = sum(len(d) for d in datasets)
        weights = np.array(weights, dtype=np.float64)
        weights /= np.sum(weights)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(
            [float(w) for w in weights], self.size)

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        try:
            return self.datasets[self.dataset_index[idx]][self.dataset_sample_index[idx]]
        except IndexError:
            return self[idx % len(self)]


def reference_build(args, corpora):
    """data_utils.build_train_valid_test_data_loaders for dataset_impl gpt2 / pack_impl packed."""
    if args.get("train_iters") is not None:
        train_iters = args["train_iters"]
        bs = args.get("train_batch_size", 1)
        eval_iters = (train_iters // args.get("eval_interval", 1000) + 1) * args.get("eval_iters", 10)
        num_samples = [train_iters * bs, eval_iters * bs, args.get("eval_iters", 10) * bs]
        epochs = [None, None, None]
    else:
        num_samples = [None, None, None]
        epochs = [1, 1, 1]
    common = dict(flavor=args.get("flavor", "gpt-neox"), naming=args.get("naming", "gpt-neox"))
    seq_length, seed = args["seq_length"], args["seed"]
    splits = {}
    if args.get("data_path"):
        indexed = corpora[args["data_path"]]
        ranges = get_train_valid_test_split_(args.get("split", "969, 30, 1"), indexed.sizes.shape[0])
        for i, name in enumerate(["train", "valid", "test"]):
            if ranges[i + 1] > ranges[i]:
                documents = np.arange(ranges[i], ranges[i + 1], 1, dtype=np.int32)
                ds = RefGPT2Dataset(name, args["data_path"], documents, indexed, num_samples[i],
                                    epochs[i], seq_length, seed, **common)
                splits[name] = (ds, [ds])
        return splits
    for i, name in enumerate(["train", "valid", "test"]):
        paths = args[f"{name}_data_paths"]
        labels = args.get(f"{name}_label_data_paths") or []
        weights = args.get(f"{name}_data_weights") or [1.0] * len(paths)
        if args.get("weight_by_num_documents"):
            weights = weights_by_num_docs([corpora[p].sizes.shape[0] for p in paths],
                                          alpha=args.get("weighted_sampler_alpha", 1.0))
        weights, per_dataset = get_normalized_weights_and_num_samples(weights, num_samples[i])
        members = []
        for j, (path, label) in enumerate(zip_longest(paths, labels)):
            indexed = corpora[path]
            documents = np.arange(0, indexed.sizes.shape[0], 1, dtype=np.int32)
            members.append(RefGPT2Dataset(f"{name}_{j}", path, documents, indexed, per_dataset[j],
                                          epochs[i], seq_length, seed,
                                          label_dataset=corpora[label] if label else None,
                                          **common))
        splits[name] = (RefBlendableDataset(members, weights), members)
    return splits


# ---------------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------------


def make_documents(seed, count, max_len, vocab=50000, zero_share=0.05):
    rng = np.random.RandomState(seed)
    docs = []
    for _ in range(count):
        n = 0 if rng.random_sample() < zero_share else int(rng.randint(1, max_len + 1))
        docs.append(rng.randint(0, vocab, size=n).tolist())
    return docs


def write_indexed(prefix, docs, dtype=np.uint16):
    """A GPT-NeoX MMapIndexedDataset pair (one sequence per document)."""
    codes = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(docs), dtype=np.int64)
    if len(docs) > 1:
        pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * itemsize)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=dtype).tobytes(order="C"))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", codes[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(sizes) + 1))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.arange(len(sizes) + 1, dtype=np.int64).tobytes(order="C"))


class Corpus:
    """Documents given to lathe in the spec ('memory') or as .bin/.idx files ('indexed')."""

    def __init__(self, tmp_path, kind):
        self.tmp_path = tmp_path
        self.kind = kind
        self.spec = []
        self.reference = {}

    def add(self, name, docs, dtype=np.uint16):
        prefix = str(self.tmp_path / name)
        self.reference[prefix] = Documents(docs)
        if self.kind == "memory":
            self.spec.append({"prefix": prefix, "documents": docs})
        else:
            write_indexed(prefix, docs, dtype)
            self.spec.append({"prefix": prefix, "indexed": True})
        return prefix


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------


def check_index_files(lathe_dataset, ref, tmp_path):
    """The .npy files lathe wrote equal the reference arrays, dtypes and bytes included."""
    assert lathe_dataset["num_epochs"] == ref.num_epochs
    assert lathe_dataset["separate_last_epoch"] == ref.separate_last_epoch
    assert lathe_dataset["size"] == len(ref)
    expected_base = cache_base(ref.prefix, ref.name, ref.num_samples, ref.seq_length, ref.seed,
                               ref.naming)
    for key, array in [("doc_idx", ref.doc_idx), ("sample_idx", ref.sample_idx),
                       ("shuffle_idx", ref.shuffle_idx)]:
        path = lathe_dataset[key]
        assert path == f"{expected_base}_{key}.npy"
        got = np.load(path, allow_pickle=False)
        assert got.dtype == array.dtype, (key, got.dtype, array.dtype)
        assert got.shape == array.shape, (key, got.shape, array.shape)
        assert np.array_equal(got, array), key
        ref_path = tmp_path / f"reference_{ref.name}_{key}.npy"
        np.save(ref_path, array, allow_pickle=True)
        assert open(path, "rb").read() == open(ref_path, "rb").read(), f"{key}: bytes differ"


def check_samples(lathe_split, ref_split):
    assert lathe_split["size"] == len(ref_split)
    for s in lathe_split["samples"]:
        expect = ref_split[s["index"]]
        assert s["tokens"] == expect["text"].tolist(), f"sample {s['index']}: tokens differ"
        if "label" in expect:
            assert s["labels"] == expect["label"].tolist(), f"sample {s['index']}: labels differ"
        else:
            assert s["labels"] == []
        assert s["documents"] == expect["documents"], f"sample {s['index']}: boundaries differ"


def compare(result, reference, tmp_path):
    assert set(result["splits"]) == set(reference), (set(result["splits"]), set(reference))
    for name, (ref_split, members) in reference.items():
        got = result["splits"][name]
        by_name = {d["name"]: d for d in got["datasets"]}
        assert set(by_name) == {m.name for m in members}
        for m in members:
            check_index_files(by_name[m.name], m, tmp_path)
        check_samples(got, ref_split)


def dump_spec(count=120, wrap=True):
    """Samples [0, count) of each split; with wrap, also index len() (GPT-NeoX's last shuffled
    sample) and indices far past the end, which GPT-NeoX takes modulo len()."""
    if not wrap:
        return {"count": count}
    return {"count": count, "end": True, "extra": [100000, 123457]}


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "indexed"])
@pytest.mark.parametrize(
    "seed,seq_length,train_iters,split",
    [
        (1234, 16, 20, "969, 30, 1"),   # one epoch of train
        (7, 33, 400, "80/20"),          # many epochs, empty test split
        (0, 2, 50, "1,1,1"),            # the shortest sequence GPT-NeoX's helper accepts
        (4294967295, 64, 300, "98,2,0"),
    ],
)
def test_split_mode_matches_gpt_neox(tmp_path, kind, seed, seq_length, train_iters, split):
    corpus = Corpus(tmp_path, kind)
    prefix = corpus.add("corpus_text_document", make_documents(seed % 1000, 300, 3 * seq_length + 5))
    args = {"data_path": prefix, "split": split, "seq_length": seq_length, "seed": seed,
            "train_iters": train_iters, "train_batch_size": 4, "eval_interval": 10, "eval_iters": 2}
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec()})
    compare(result, reference_build(args, corpus.reference), tmp_path)


def test_larger_corpus_int32_tokens(tmp_path):
    """A few thousand documents, a vocabulary past uint16 (int32 token file), 6000 samples."""
    corpus = Corpus(tmp_path, "indexed")
    prefix = corpus.add("big", make_documents(77, 4000, 300, vocab=200000), dtype=np.int32)
    args = {"data_path": prefix, "split": "949,50,1", "seq_length": 128, "seed": 31337,
            "train_iters": 750, "train_batch_size": 8, "eval_interval": 250, "eval_iters": 4}
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec(300)})
    compare(result, reference_build(args, corpus.reference), tmp_path)


def test_epochs_mode_and_cache_reuse(tmp_path):
    corpus = Corpus(tmp_path, "memory")
    prefix = corpus.add("c", make_documents(5, 120, 40))
    args = {"data_path": prefix, "split": "90,5,5", "seq_length": 24, "seed": 3, "train_epochs": 1}
    first = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec()}, "first")
    reference = reference_build(args, corpus.reference)
    compare(first, reference, tmp_path)
    assert "Nonens" in first["splits"]["train"]["datasets"][0]["doc_idx"]
    assert not first["splits"]["train"]["datasets"][0]["loaded_from_cache"]
    second = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec()}, "second")
    assert second["splits"]["train"]["datasets"][0]["loaded_from_cache"]
    assert second["splits"]["train"]["samples"] == first["splits"]["train"]["samples"]


def test_reads_caches_written_by_numpy(tmp_path):
    """Index files GPT-NeoX saved (np.save) are used as they are, without rebuilding."""
    corpus = Corpus(tmp_path, "memory")
    prefix = corpus.add("neox", make_documents(11, 200, 30))
    args = {"data_path": prefix, "split": "1", "seq_length": 16, "seed": 42, "train_iters": 100,
            "train_batch_size": 3}
    ref = reference_build(args, corpus.reference)["train"][0]
    build_index_mappings("train", prefix, np.arange(0, 200, dtype=np.int32),
                         corpus.reference[prefix].sizes, ref.num_samples, None, 16, 42,
                         save_to=prefix)
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec()})
    assert result["splits"]["train"]["datasets"][0]["loaded_from_cache"]
    compare(result, {"train": (ref, [ref])}, tmp_path)


@pytest.mark.parametrize("naming", ["gpt-neox", "legacy"])
def test_megatron_separate_last_epoch(tmp_path, naming):
    corpus = Corpus(tmp_path, "memory")
    prefix = corpus.add("m", make_documents(21, 50, 20))
    tokens = int(corpus.reference[prefix].sizes.sum())
    seq_length = 10
    per_epoch = (tokens - 1) // seq_length
    # Two full epochs and a sliver of a third: the last epoch is under 80% of an epoch.
    train_samples = 2 * per_epoch + 3
    args = {"data_path": prefix, "split": "1", "seq_length": seq_length, "seed": 17,
            "train_iters": train_samples, "train_batch_size": 1, "flavor": "megatron",
            "naming": naming}
    reference = reference_build(args, corpus.reference)
    assert reference["train"][0].separate_last_epoch
    # Megatron's GPTDataset has no IndexError fallback: only indices below len().
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args,
                                  "dump": dump_spec(60, wrap=False)})
    compare(result, reference, tmp_path)


@pytest.mark.parametrize("kind", ["memory", "indexed"])
def test_weighted_blend_with_labels(tmp_path, kind):
    corpus = Corpus(tmp_path, kind)
    a_docs = make_documents(1, 80, 50)
    b_docs = make_documents(2, 30, 120)
    c_docs = make_documents(3, 200, 9)
    a = corpus.add("a_text", a_docs)
    b = corpus.add("b_text", b_docs)
    c = corpus.add("c_text", c_docs)
    # SFT-style labels: -100 over the first third of each document, the token after.
    def labels_of(docs):
        return [[-100 if i < len(d) // 3 else t for i, t in enumerate(d)] for d in docs]
    a_lab = corpus.add("a_label", labels_of(a_docs), dtype=np.int32)
    b_lab = corpus.add("b_label", labels_of(b_docs), dtype=np.int32)
    c_lab = corpus.add("c_label", labels_of(c_docs), dtype=np.int32)
    args = {
        "train_data_paths": [a, b, c], "train_label_data_paths": [a_lab, b_lab, c_lab],
        "train_data_weights": [1.0, 3.0, 0.5],
        "valid_data_paths": [b, c], "valid_data_weights": [0.3, 0.7],
        "test_data_paths": [a],
        "seq_length": 32, "seed": 1234, "train_iters": 40, "train_batch_size": 8,
        "eval_interval": 20, "eval_iters": 3,
    }
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec(200)})
    compare(result, reference_build(args, corpus.reference), tmp_path)


def test_weight_by_num_documents(tmp_path):
    corpus = Corpus(tmp_path, "memory")
    paths = [corpus.add(f"w{i}", make_documents(30 + i, n, 25)) for i, n in enumerate([150, 20, 60])]
    args = {"train_data_paths": paths, "valid_data_paths": paths[:2], "test_data_paths": paths[2:],
            "weight_by_num_documents": True, "weighted_sampler_alpha": 0.3,
            "seq_length": 12, "seed": 99, "train_iters": 60, "train_batch_size": 2,
            "eval_interval": 30, "eval_iters": 2}
    result = run_lathe(tmp_path, {"corpora": corpus.spec, "args": args, "dump": dump_spec(150)})
    compare(result, reference_build(args, corpus.reference), tmp_path)


def test_numpy_random_state_streams(tmp_path):
    """Shuffles and bounded integers for many seeds and sizes, against numpy itself."""
    rng = np.random.RandomState(2718)
    seeds = [0, 1, 2**32 - 1] + rng.randint(0, 2**32, size=25, dtype=np.uint64).tolist()
    ops, expected = [], []
    for seed in seeds:
        n = int(rng.choice([0, 1, 2, 5, 17, 256, 1000, 4099]))
        ops.append({"op": "shuffle", "seed": int(seed), "n": n})
        a = np.arange(n, dtype=np.int64)
        np.random.RandomState(int(seed)).shuffle(a)
        expected.append(a.tolist())
    dtypes = {"int64": (-2**63, 2**63), "int32": (-2**31, 2**31), "int16": (-2**15, 2**15),
              "int8": (-128, 128), "uint64": (0, 2**63), "uint32": (0, 2**32),
              "uint16": (0, 2**16), "uint8": (0, 256), "bool": (0, 2)}
    for i in range(120):
        seed = int(rng.randint(0, 2**32, dtype=np.uint64))
        dtype = list(dtypes)[i % len(dtypes)]
        lo_lim, hi_lim = dtypes[dtype]
        width = int(rng.choice([1, 2, 3, 7, 100, 255, 256, 65535, 65536, 2**31, 2**32 + 1, 2**40, 2**62]))
        low = int(rng.randint(max(lo_lim, -2**40), max(lo_lim, -2**40) + 1000)) if lo_lim < 0 else 0
        high = min(low + width, hi_lim)
        if high <= low:
            continue
        size = int(rng.randint(1, 200))
        ops.append({"op": "randint", "seed": seed, "low": low, "high": high, "size": size,
                    "dtype": dtype})
        values = np.random.RandomState(seed).randint(low, high, size=size, dtype=dtype)
        expected.append(values.astype(np.int64).tolist() if dtype != "uint64"
                        else values.view(np.int64).tolist())
    for seed in seeds[:5]:
        ops.append({"op": "random_sample", "seed": int(seed), "size": 50})
        expected.append(np.random.RandomState(int(seed)).random_sample(50).tolist())
    result = run_lathe(tmp_path, {"rng": ops})
    assert len(result["rng"]) == len(expected)
    for op, got, want in zip(ops, result["rng"], expected):
        assert got == want, op


class RefDistributedBatchSampler:
    """GPT-NeoX's samplers.DistributedBatchSampler over a SequentialSampler, drop_last=True
    (torch's BatchSampler base replaced by its behaviour: consecutive indices, whole batches)."""

    def __init__(self, size, batch_size, rank, world_size):
        self.size, self.batch_size, self.rank, self.world_size = size, batch_size, rank, world_size
        self.start_iter = 0

    def __iter__(self):
        batch, i = [], 0
        for idx in range(self.size):
            batch.append(idx)
            if len(batch) == self.batch_size:
                start = self.rank * self.batch_size // self.world_size
                end = (self.rank + 1) * self.batch_size // self.world_size
                if i >= self.start_iter:
                    yield batch[start:end]
                    self.start_iter = 0
                i += 1
                batch = []


@pytest.mark.parametrize("micro_batch,dp_world,size", [(4, 2, 100), (1, 1, 7), (3, 4, 50), (8, 1, 64)])
def test_loader_order(tmp_path, micro_batch, dp_world, size):
    """make_data_loader + itertools.cycle: which samples each rank's micro-batches hold."""
    steps = 3 * (size // (micro_batch * dp_world)) + 2
    result = run_lathe(tmp_path, {"loader": {"micro_batch": micro_batch, "dp_world": dp_world,
                                             "dataset_size": size, "steps": steps}})
    for rank in range(dp_world):
        sampler = RefDistributedBatchSampler(size, micro_batch * dp_world, rank, dp_world)
        for step, batch in enumerate(islice(cycle(sampler), steps)):
            assert batch == list(range(result["loader"][step][rank],
                                       result["loader"][step][rank] + micro_batch)), (step, rank)
