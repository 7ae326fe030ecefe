"""lathe's GPT-NeoX sample construction against GPT-NeoX's own code, and numpy.

tests/fixtures/gpt2_dataset holds what GPT-NeoX's data code produced, run from its source by
tests/reference/make_gpt2_dataset_fixture.py (the commits and files are in the fixture's
metadata.json and README.md) for that script's CASES: the doc_idx / sample_idx / shuffle_idx .npy
files GPT-NeoX wrote, under the names it gave them, and the samples its GPT2Dataset /
BlendableDataset __getitem__ returned. Megatron-DeepSpeed's GPTDataset gives the separate last
epoch (lathe's "megatron" flavor).

For each case the test writes the same token files (their SHA-256 equal to those GPT-NeoX's
MMapIndexedDatasetBuilder wrote), has lathe build the datasets through the data_tests driver
(src/data/gpt2_dataset_driver_test.cpp: a JSON spec in, the samples and the paths of the .npy
caches it wrote out), and compares:
  * every index file lathe wrote with GPT-NeoX's, byte for byte (name, .npy header, dtype, shape,
    values), and the set of files;
  * the size of every split, and every sample read (tokens, labels), past the end included;
  * the document boundaries lathe reports with the tokens and the corpus.
Also: numpy's RandomState streams against numpy itself, and which samples each data-parallel
rank's micro-batches hold against GPT-NeoX's make_data_loader.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reference"))
from make_gpt2_dataset_fixture import CASES, LOADER_CASES, corpus_documents  # noqa: E402

BUILD_DIR = Path(os.environ.get("LATHE_BUILD_DIR", REPO / "build"))
FIXTURES = REPO / "tests" / "fixtures" / "gpt2_dataset"
METADATA = json.loads((FIXTURES / "metadata.json").read_text())
NEOX = METADATA["gpt-neox"]
MEGATRON = METADATA["megatron-deepspeed"]
INDEX_KEYS = ("doc_idx", "sample_idx", "shuffle_idx")


def run_lathe(tmp_path, spec, tag="run"):
    driver = BUILD_DIR / "data_tests"
    assert driver.exists(), f"{driver} not built: ninja -C {BUILD_DIR} data_tests"
    spec = dict(spec)
    spec["out"] = str(tmp_path / f"{tag}_result.json")
    spec_path = tmp_path / f"{tag}_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, LATHE_GPT2_DATASET_SPEC=str(spec_path))
    proc = subprocess.run(
        [str(driver), "--gtest_also_run_disabled_tests", "--gtest_filter=Gpt2DatasetDriver.*"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((tmp_path / f"{tag}_result.json").read_text())


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


def write_case(tmp_path, case_name, kind, hashes):
    """The case's corpora under tmp_path, byte for byte the files GPT-NeoX read; returns the
    driver's corpora spec and the documents by prefix. kind "memory" hands lathe the documents
    in the spec, "indexed" the files."""
    spec, documents = [], {}
    for name, corpus in CASES[case_name]["corpora"].items():
        prefix = str(tmp_path / name)
        docs = corpus_documents(corpus)
        write_indexed(prefix, docs, np.dtype(corpus.get("dtype", "uint16")).type)
        for ext in ("bin", "idx"):
            digest = hashlib.sha256(Path(f"{prefix}.{ext}").read_bytes()).hexdigest()
            assert digest == hashes[name][ext], f"{name}.{ext} differs from GPT-NeoX's file"
        documents[prefix] = docs
        spec.append({"prefix": prefix, "documents": docs} if kind == "memory"
                    else {"prefix": prefix, "indexed": True})
    return spec, documents


def lathe_args(case_name, tmp_path, **extra):
    """The case's GPT-NeoX arguments with the corpus names made paths under tmp_path."""
    args = dict(CASES[case_name]["args"], **extra)
    for key, value in list(args.items()):
        if key == "data_path":
            args[key] = str(tmp_path / value)
        elif key.endswith("_data_paths"):
            args[key] = [str(tmp_path / v) for v in value]
    return args


def describe_difference(got_path, want_path):
    got, want = np.load(got_path), np.load(want_path)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"lathe {got.dtype}{got.shape}, GPT-NeoX {want.dtype}{want.shape}"
    diff = np.argwhere(got != want)
    if len(diff):
        at = tuple(diff[0])
        return f"{len(diff)} values differ, first at {at}: lathe {got[at]}, GPT-NeoX {want[at]}"
    return "same values, different .npy header"


def check_index_file(got_path, want_path):
    got_path = Path(got_path)
    assert want_path.exists(), f"lathe wrote {got_path.name}; GPT-NeoX has no file of that name"
    assert got_path.read_bytes() == want_path.read_bytes(), \
        f"{got_path.name}: {describe_difference(got_path, want_path)}"


def documents_match(sample, seq_length, documents):
    """Whether the boundaries lathe reports cover the seq_length + 1 tokens in order, each segment
    a run of its document of `documents`: the end of the first, whole ones between, the start
    of the last (one segment: any run)."""
    segments, tokens = sample["documents"], sample["tokens"]
    at = 0
    for k, (start, length, doc) in enumerate(segments):
        if start != at or length <= 0 or not 0 <= doc < len(documents):
            return False
        d, run = documents[doc], tokens[start:start + length]
        if len(segments) == 1:
            ok = any(d[o:o + length] == run for o in range(len(d) - length + 1))
        elif k == 0:
            ok = d[len(d) - length:] == run
        elif k == len(segments) - 1:
            ok = d[:length] == run
        else:
            ok = d == run
        if not ok:
            return False
        at += length
    return at == seq_length + 1


def check_samples(got_split, samples, split, seq_length, corpora):
    """lathe's samples equal GPT-NeoX's; their boundaries fit one of the split's corpora (a blend
    does not say which of its datasets a sample came from)."""
    assert [s["index"] for s in got_split["samples"]] == samples[f"{split}_indices"].tolist()
    tokens = samples[f"{split}_tokens"]
    labels = samples.get(f"{split}_labels")
    for row, s in enumerate(got_split["samples"]):
        assert s["tokens"] == tokens[row].tolist(), f"{split} sample {s['index']}: tokens differ"
        if labels is not None:
            assert s["labels"] == labels[row].tolist(), f"{split} sample {s['index']}: labels differ"
        else:
            assert s["labels"] == []
        assert any(documents_match(s, seq_length, docs) for docs in corpora), \
            f"{split} sample {s['index']}: boundaries {s['documents']}"


def check_values(got_path, want_path):
    got, want = np.load(got_path), np.load(want_path)
    assert got.shape == want.shape and np.array_equal(got, want), \
        f"{Path(got_path).name}: {describe_difference(got_path, want_path)}"
    return got


def compare_with_fixture(case_name, result, tmp_path, documents, expected, file_names=None,
                         values_only=()):
    """lathe's splits, index files and samples against a case of the fixture. file_names maps
    lathe's file names to the fixture's (Megatron-DeepSpeed names its files by a hash); the
    index files named in values_only are compared by shape and values, not dtype."""
    fixture = FIXTURES / case_name
    samples = dict(np.load(fixture / "samples.npz"))
    seq_length = CASES[case_name]["args"]["seq_length"]
    assert set(result["splits"]) == set(expected["splits"])
    written = []
    for split, want in expected["splits"].items():
        got = result["splits"][split]
        assert got["size"] == want["size"], split
        assert [d["name"] for d in got["datasets"]] == want["datasets"]
        for d in got["datasets"]:
            for key in INDEX_KEYS:
                path = Path(d[key])
                assert path.parent == tmp_path, path
                name = file_names[path.name] if file_names else path.name
                if key in values_only:
                    check_values(path, fixture / name)
                else:
                    check_index_file(path, fixture / name)
                written.append(name)
        check_samples(got, samples, split, seq_length,
                      [documents[d["prefix"]] for d in got["datasets"]])
    assert sorted(written) == sorted(expected["index_files"])


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_fixture_names_its_sources():
    for project, files in ((NEOX, ["megatron/data/gpt2_dataset.py", "megatron/data/helpers.cpp",
                                   "megatron/data/data_utils.py"]),
                           (MEGATRON, ["megatron/data/gpt_dataset.py",
                                       "megatron/data/helpers.cpp"])):
        source = project["source"]
        assert len(source["commit"]) == 40 and int(source["commit"], 16) >= 0
        assert set(files) <= set(source["files"])
        assert source["commit"] in (FIXTURES / "README.md").read_text()
    # The fixture was made from the cases as they stand (else remake it).
    made = {**NEOX["cases"], **MEGATRON["cases"]}
    assert {name: made[name]["definition"] for name in made} == json.loads(json.dumps(CASES))
    assert [{k: c[k] for k in LOADER_CASES[0]} for c in NEOX["loader"]] == LOADER_CASES


GPT_NEOX_CASES = [name for name, case in CASES.items() if not case.get("megatron")]


@pytest.mark.parametrize("kind", ["memory", "indexed"])
@pytest.mark.parametrize("case_name", GPT_NEOX_CASES)
def test_matches_gpt_neox(tmp_path, case_name, kind):
    want = NEOX["cases"][case_name]
    corpora, documents = write_case(tmp_path, case_name, kind, want["corpora"])
    result = run_lathe(tmp_path, {"corpora": corpora, "args": lathe_args(case_name, tmp_path),
                                  "dump": CASES[case_name]["dump"]})
    for split in result["splits"].values():
        for d in split["datasets"]:
            assert not d["loaded_from_cache"] and not d["separate_last_epoch"]
    compare_with_fixture(case_name, result, tmp_path, documents, want)


def test_epochs_mode_reuses_its_cache(tmp_path):
    want = NEOX["cases"]["epochs_mode"]
    corpora, documents = write_case(tmp_path, "epochs_mode", "memory", want["corpora"])
    spec = {"corpora": corpora, "args": lathe_args("epochs_mode", tmp_path),
            "dump": CASES["epochs_mode"]["dump"]}
    first = run_lathe(tmp_path, spec, "first")
    assert "Nonens" in first["splits"]["train"]["datasets"][0]["doc_idx"]
    second = run_lathe(tmp_path, spec, "second")
    for split in ("train", "valid", "test"):
        assert second["splits"][split]["datasets"][0]["loaded_from_cache"]
        assert second["splits"][split]["samples"] == first["splits"][split]["samples"]
    compare_with_fixture("epochs_mode", second, tmp_path, documents, want)


def test_reads_caches_gpt_neox_wrote(tmp_path):
    """GPT-NeoX's own .npy files next to the data are used as they are, without rebuilding."""
    want = NEOX["cases"]["numpy_caches"]
    corpora, documents = write_case(tmp_path, "numpy_caches", "memory", want["corpora"])
    for name in want["index_files"]:
        shutil.copy(FIXTURES / "numpy_caches" / name, tmp_path / name)
    before = {name: (tmp_path / name).stat().st_mtime_ns for name in want["index_files"]}
    result = run_lathe(tmp_path, {"corpora": corpora, "args": lathe_args("numpy_caches", tmp_path),
                                  "dump": CASES["numpy_caches"]["dump"]})
    assert result["splits"]["train"]["datasets"][0]["loaded_from_cache"]
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in want["index_files"]} == before
    compare_with_fixture("numpy_caches", result, tmp_path, documents, want)


MEGATRON_CASES = [name for name, case in CASES.items() if case.get("megatron")]


@pytest.mark.parametrize("naming", ["gpt-neox", "legacy"])
@pytest.mark.parametrize("case_name", MEGATRON_CASES)
def test_megatron_last_epoch_matches_megatron_deepspeed(tmp_path, case_name, naming):
    """Megatron's "separate last epoch": the arrays of Megatron-DeepSpeed's GPTDataset, in the
    files GPT-NeoX's naming (or the older one without _packedpi_ac) gives them. sample_idx has
    Megatron's values in GPT-NeoX's dtype (int32 where it fits; Megatron-DeepSpeed stores int64):
    the dtype lathe documents for this flavor (src/data/sampling.h)."""
    want = MEGATRON["cases"][case_name]
    corpora, documents = write_case(tmp_path, case_name, "memory", want["corpora"])
    args = lathe_args(case_name, tmp_path, naming=naming)
    # Megatron's GPTDataset has no IndexError fallback: only indices below len().
    result = run_lathe(tmp_path, {"corpora": corpora, "args": args,
                                  "dump": CASES[case_name]["dump"]})
    d = result["splits"]["train"]["datasets"][0]
    assert d["num_epochs"] == want["num_epochs"]
    assert d["separate_last_epoch"] == want["separate_last_epoch"]
    base = (f"{Path(args['data_path']).name}_train_indexmap_"
            f"{args['train_iters'] * args['train_batch_size']}ns_{args['seq_length']}sl_"
            f"{args['seed']}s" + ("_packedpi_ac" if naming == "gpt-neox" else ""))
    names = {f"{base}_{key}.npy": f"{key}.npy" for key in INDEX_KEYS}
    assert sorted(Path(d[key]).name for key in INDEX_KEYS) == sorted(names)
    compare_with_fixture(case_name, result, tmp_path, documents, want, file_names=names,
                         values_only=("sample_idx",))
    assert np.load(d["sample_idx"]).dtype == np.int32


def test_megatron_cases_cover_both_last_epochs():
    assert sorted(MEGATRON["cases"][c]["separate_last_epoch"] for c in MEGATRON_CASES) == [False, True]
    assert all(MEGATRON["cases"][c]["num_epochs"] > 1 for c in MEGATRON_CASES)


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


@pytest.mark.parametrize("loader", LOADER_CASES,
                         ids=lambda c: f"mb{c['micro_batch']}_dp{c['dp_world']}_n{c['dataset_size']}")
def test_loader_order_matches_gpt_neox(tmp_path, loader):
    """make_data_loader + shift_and_wrap_data_loaders (cycle): which samples each rank's
    micro-batches hold, step after step, as GPT-NeoX's loader gives them."""
    want = next(c for c in NEOX["loader"] if all(c[k] == loader[k] for k in loader))
    result = run_lathe(tmp_path, {"loader": {k: loader[k] for k in
                                             ("micro_batch", "dp_world", "dataset_size", "steps")}})
    assert len(result["loader"]) == loader["steps"]
    for step, firsts in enumerate(result["loader"]):
        for rank, first in enumerate(firsts):
            batch = want["batches"][rank][step]
            assert batch == list(range(batch[0], batch[0] + loader["micro_batch"]))
            assert first == batch[0], (step, rank)
