"""Writes tests/fixtures/gpt2_dataset: GPT-NeoX's own sample order for the cases of
tests/test_gpt2_dataset.py, made by running GPT-NeoX's code from a checkout of it.

    git clone https://github.com/EleutherAI/gpt-neox /tmp/gpt-neox
    git clone https://github.com/microsoft/Megatron-DeepSpeed /tmp/Megatron-DeepSpeed
    python3 -m pip install torch pybind11 numpy
    python3 tests/reference/make_gpt2_dataset_fixture.py --gpt-neox /tmp/gpt-neox \\
        --megatron-deepspeed /tmp/Megatron-DeepSpeed

Nothing of either project is copied here: this script compiles their megatron/data/helpers.cpp
(pybind11, as their Makefile does) into a temporary folder, imports their megatron/data modules
from the checkouts, and stands in only for what a single CPU process lacks: the `megatron`
package's __init__ (print_rank_0), `mpu`'s parallel ranks (data-parallel rank r of w, every other
group of size 1), torch.distributed (rank 0 of 1: all_reduce and broadcast leave the tensor as
it is), torch.cuda.LongTensor (a CPU tensor), DeepSpeed's accelerator (its LongTensor) and
Megatron-DeepSpeed's get_args() (the defaults of the arguments GPTDataset reads: no fixed epoch
count, no index files forced, samples keyed "text"). GPT-NeoX's arguments are a namespace with
its defaults for the options the data code reads (NeoxArgs below).

For every case of CASES, in a temporary folder:
  * the token files are written by GPT-NeoX's MMapIndexedDatasetBuilder from make_documents()
    (the test writes the same bytes: their SHA-256 is in metadata.json);
  * GPT-NeoX's data_utils.build_train_valid_test_data_loaders(neox_args) builds the datasets as
    `train.py` does (split strings, weighted lists, label files, weights by number of
    documents, train_iters or train_epochs), writing its doc_idx / sample_idx / shuffle_idx .npy
    caches, which are copied into the fixture under the names GPT-NeoX gave them;
  * the samples of each split, read through GPT-NeoX's GPT2Dataset / BlendableDataset
    __getitem__ (tokens and labels, int32), go to <case>/samples.npz;
  * cases with "megatron" run Megatron-DeepSpeed's GPTDataset (megatron/data/gpt_dataset.py:
    the separate last epoch) instead, on the whole file (split "1");
  * LOADER_CASES run GPT-NeoX's make_data_loader and shift_and_wrap_data_loaders (its
    DistributedBatchSampler under torch's DataLoader, cycled) over a dataset of indices.
metadata.json records the commits and the files run, and each case as it was run. The test
imports CASES, LOADER_CASES and corpus_documents from this file, which needs only numpy at
import, so that the test runs without GPT-NeoX or torch.
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "gpt2_dataset"


def make_documents(seed, count, max_len, vocab=50000, zero_share=0.05):
    """`count` documents of 0..max_len random token ids below `vocab` (about zero_share of them
    empty), the same lists for the same arguments."""
    rng = np.random.RandomState(seed)
    docs = []
    for _ in range(count):
        n = 0 if rng.random_sample() < zero_share else int(rng.randint(1, max_len + 1))
        docs.append(rng.randint(0, vocab, size=n).tolist())
    return docs


def label_documents(docs):
    """SFT-style labels: -100 over the first third of each document, the token after."""
    return [[-100 if i < len(d) // 3 else t for i, t in enumerate(d)] for d in docs]


def corpus_documents(spec):
    """The documents of a corpus spec: {"seed", "count", "max_len", ["vocab"], ["labels_of"]}."""
    docs = make_documents(spec["seed"], spec["count"], spec["max_len"], spec.get("vocab", 50000))
    return label_documents(docs) if spec.get("labels_of") else docs


def _tokens(spec):
    return sum(len(d) for d in corpus_documents(spec))


def _megatron_samples(spec, seq_length, full_epochs, extra):
    """A sample count that needs full_epochs + 1 epochs, `extra` samples into the last one."""
    per_epoch = (_tokens(spec) - 1) // seq_length
    return full_epochs * per_epoch + extra


def _split_case(seed, seq_length, train_iters, split):
    corpus = {"seed": seed % 1000, "count": 300, "max_len": 3 * seq_length + 5}
    return {
        "corpora": {"corpus_text_document": corpus},
        "args": {"data_path": "corpus_text_document", "split": split, "seq_length": seq_length,
                 "seed": seed, "train_iters": train_iters, "train_batch_size": 4,
                 "eval_interval": 10, "eval_iters": 2},
        "dump": {"count": 120, "end": True, "extra": [100000, 123457]},
    }


_MEGATRON_CORPUS = {"seed": 21, "count": 50, "max_len": 20}

# Each case: its corpora (file name -> make_documents arguments; "dtype" of the token file,
# uint16 by default), GPT-NeoX arguments naming the corpora by file name, and the samples read
# of each split: [0, count), len() itself when "end" (GPT-NeoX's last shuffled sample), "extra"
# indices (past the end: GPT-NeoX takes them modulo len()).
CASES = {
    # one epoch of train; many epochs and an empty test split; the shortest sequence GPT-NeoX's
    # helper accepts; the largest seed
    "split_one_epoch": _split_case(1234, 16, 20, "969, 30, 1"),
    "split_many_epochs": _split_case(7, 33, 400, "80/20"),
    "split_seq_2": _split_case(0, 2, 50, "1,1,1"),
    "split_seed_max": _split_case(4294967295, 64, 300, "98,2,0"),
    # 1500 documents, a vocabulary past uint16 (int32 token file), 2400 samples over 2 epochs
    "int32_tokens": {
        "corpora": {"big": {"seed": 77, "count": 1500, "max_len": 300, "vocab": 200000,
                            "dtype": "int32"}},
        "args": {"data_path": "big", "split": "949,50,1", "seq_length": 128, "seed": 31337,
                 "train_iters": 300, "train_batch_size": 8, "eval_interval": 100,
                 "eval_iters": 4},
        "dump": {"count": 64, "end": True, "extra": [100000, 123457]},
    },
    # train_epochs mode: "None" samples in the cache names
    "epochs_mode": {
        "corpora": {"c": {"seed": 5, "count": 120, "max_len": 40}},
        "args": {"data_path": "c", "split": "90,5,5", "seq_length": 24, "seed": 3,
                 "train_epochs": 1},
        "dump": {"count": 120, "end": True, "extra": [100000, 123457]},
    },
    # the caches GPT-NeoX writes here are the ones the test hands lathe to read
    "numpy_caches": {
        "corpora": {"neox": {"seed": 11, "count": 200, "max_len": 30}},
        "args": {"data_path": "neox", "split": "1", "seq_length": 16, "seed": 42,
                 "train_iters": 100, "train_batch_size": 3},
        "dump": {"count": 120, "end": True, "extra": [100000, 123457]},
    },
    "weighted_blend_with_labels": {
        "corpora": {
            "a_text": {"seed": 1, "count": 80, "max_len": 50},
            "b_text": {"seed": 2, "count": 30, "max_len": 120},
            "c_text": {"seed": 3, "count": 200, "max_len": 9},
            "a_label": {"seed": 1, "count": 80, "max_len": 50, "labels_of": True,
                        "dtype": "int32"},
            "b_label": {"seed": 2, "count": 30, "max_len": 120, "labels_of": True,
                        "dtype": "int32"},
            "c_label": {"seed": 3, "count": 200, "max_len": 9, "labels_of": True,
                        "dtype": "int32"},
        },
        "args": {
            "train_data_paths": ["a_text", "b_text", "c_text"],
            "train_label_data_paths": ["a_label", "b_label", "c_label"],
            "train_data_weights": [1.0, 3.0, 0.5],
            "valid_data_paths": ["b_text", "c_text"], "valid_data_weights": [0.3, 0.7],
            "test_data_paths": ["a_text"],
            "seq_length": 32, "seed": 1234, "train_iters": 40, "train_batch_size": 8,
            "eval_interval": 20, "eval_iters": 3,
        },
        "dump": {"count": 200, "end": True, "extra": [100000, 123457]},
    },
    "weight_by_num_documents": {
        "corpora": {f"w{i}": {"seed": 30 + i, "count": n, "max_len": 25}
                    for i, n in enumerate([150, 20, 60])},
        "args": {"train_data_paths": ["w0", "w1", "w2"], "valid_data_paths": ["w0", "w1"],
                 "test_data_paths": ["w2"], "weight_by_num_documents": True,
                 "weighted_sampler_alpha": 0.3, "seq_length": 12, "seed": 99,
                 "train_iters": 60, "train_batch_size": 2, "eval_interval": 30,
                 "eval_iters": 2},
        "dump": {"count": 150, "end": True, "extra": [100000, 123457]},
    },
    # Megatron-DeepSpeed: two full epochs and 3 samples of a third (under 80% of an epoch: the
    # last epoch is shuffled apart), and two full epochs and 90% of a third (not apart).
    "megatron_separate_last_epoch": {
        "megatron": True,
        "corpora": {"m": _MEGATRON_CORPUS},
        "args": {"data_path": "m", "split": "1", "seq_length": 10, "seed": 17,
                 "train_iters": _megatron_samples(_MEGATRON_CORPUS, 10, 2, 3),
                 "train_batch_size": 1, "flavor": "megatron"},
        "dump": {"count": 60},
    },
    "megatron_last_epoch_kept": {
        "megatron": True,
        "corpora": {"m": _MEGATRON_CORPUS},
        "args": {"data_path": "m", "split": "1", "seq_length": 10, "seed": 17,
                 "train_iters": _megatron_samples(
                     _MEGATRON_CORPUS, 10, 2, int(0.9 * ((_tokens(_MEGATRON_CORPUS) - 1) // 10))),
                 "train_batch_size": 1, "flavor": "megatron"},
        "dump": {"count": 60},
    },
}

# make_data_loader + cycle: micro batch, data-parallel world size, dataset size; steps taken.
LOADER_CASES = [
    {"micro_batch": 4, "dp_world": 2, "dataset_size": 100},
    {"micro_batch": 1, "dp_world": 1, "dataset_size": 7},
    {"micro_batch": 3, "dp_world": 4, "dataset_size": 50},
    {"micro_batch": 8, "dp_world": 1, "dataset_size": 64},
]
for _c in LOADER_CASES:
    _c["steps"] = 3 * (_c["dataset_size"] // (_c["micro_batch"] * _c["dp_world"])) + 2


def dump_indices(size, dump):
    """The sample indices read of a split of `size` samples."""
    indices = list(range(min(dump.get("count", 0), size)))
    if dump.get("end"):
        indices.append(size)
    return indices + list(dump.get("extra", []))


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- running GPT-NeoX / Megatron-DeepSpeed (only in this script's own process) -------------


def compile_helpers(src_dir, build_dir):
    """megatron/data/helpers.cpp as their Makefile builds it: -O3 -shared -std=c++11, pybind11."""
    import pybind11
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / ("helpers" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [os.environ.get("CXX", "c++"), "-O3", "-Wall", "-shared", "-std=c++11", "-fPIC",
           f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}",
           str(src_dir / "megatron" / "data" / "helpers.cpp"), "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def _stub_module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _quiet(*args, **kwargs):
    print(*args, file=sys.stderr, **{k: v for k, v in kwargs.items() if k != "file"})


class _Ranks:
    """mpu's answers for one process: data-parallel rank `rank` of `world`, all else 0 of 1."""
    rank, world = 0, 1


def _single_process_torch():
    import torch
    import torch.distributed as dist
    dist.get_rank = lambda group=None: 0
    dist.get_world_size = lambda group=None: 1
    dist.all_reduce = lambda tensor, *a, **k: None
    dist.broadcast = lambda tensor, *a, **k: None
    torch.cuda.LongTensor = lambda data: torch.tensor(data, dtype=torch.long)
    return torch


def _mpu_stub(name):
    return _stub_module(
        name,
        get_data_parallel_world_size=lambda: _Ranks.world,
        get_data_parallel_rank=lambda: _Ranks.rank,
        get_model_parallel_rank=lambda: 0,
        get_model_parallel_src_rank=lambda: 0,
        get_model_parallel_group=lambda: None,
        get_io_parallel_group=lambda: None,
        get_pipe_parallel_rank=lambda: 0,
        get_pipe_parallel_world_size=lambda: 1,
        get_data_parallel_group=lambda: None,
        get_pipeline_model_parallel_group=lambda: None,
        get_tensor_model_parallel_group=lambda: None,
        get_sequence_parallel_group=lambda: None,
    )


def _load_package(src_dir, helpers_dir, extra_stubs):
    """`megatron` with its real megatron/data from src_dir and stubs for the rest."""
    megatron = _stub_module("megatron", __path__=[str(src_dir / "megatron")],
                            print_rank_0=_quiet, **extra_stubs)
    megatron.mpu = _mpu_stub("megatron.mpu")
    _stub_module("megatron.mpu.initialize", get_data_parallel_rank=lambda: _Ranks.rank)
    import megatron.data
    megatron.data.__path__.append(str(helpers_dir))
    return megatron


class NeoxArgs(types.SimpleNamespace):
    """GPT-NeoX's NeoXArgs for the data code: the fields a case gives, GPT-NeoX's defaults for
    the others it reads, None for the rest (paths and options not used)."""

    def __getattr__(self, key):
        return None


def neox_args(args, prefix_of):
    a = dict(args)
    for key in ("data_path",):
        if a.get(key):
            a[key] = prefix_of(a[key])
    for key in ("train_data_paths", "valid_data_paths", "test_data_paths",
                "train_label_data_paths", "valid_label_data_paths", "test_label_data_paths"):
        if a.get(key):
            a[key] = [prefix_of(p) for p in a[key]]
    for split in ("train", "valid", "test"):
        if a.get(f"{split}_data_paths") and not a.get(f"{split}_data_weights"):
            a[f"{split}_data_weights"] = [1.0] * len(a[f"{split}_data_paths"])
    defaults = dict(split="969, 30, 1", eval_interval=1000, eval_iters=10, train_batch_size=1,
                    weighted_sampler_alpha=1.0, weight_by_num_documents=False, data_impl="mmap",
                    pack_impl="packed", dataset_impl="gpt2", allow_chopped=True,
                    use_shared_fs=True, mmap_warmup=False, is_pipe_parallel=False,
                    num_workers=0, iteration=0, gradient_accumulation_steps=1)
    for k, v in defaults.items():
        a.setdefault(k, v)
    a["batch_size"] = a["train_batch_size"]
    a.pop("flavor", None)
    return NeoxArgs(**a)


def write_corpora(case, work, indexed_dataset, megatron=False):
    hashes = {}
    for name, spec in case["corpora"].items():
        prefix = str(work / name)
        dtype = np.dtype(spec.get("dtype", "uint16")).type
        builder = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for d in corpus_documents(spec):
            if megatron:
                builder.add_doc(np.array(d, dtype=dtype), [len(d)])
            else:
                builder.add_item(np.array(d, dtype=dtype))
                builder.end_document()
        builder.finalize(prefix + ".idx")
        hashes[name] = {"bin": sha256(prefix + ".bin"), "idx": sha256(prefix + ".idx")}
    return hashes


def save_samples(path, splits):
    arrays = {}
    for split, (indices, samples) in splits.items():
        arrays[f"{split}_indices"] = np.array(indices, dtype=np.int64)
        arrays[f"{split}_tokens"] = np.array([s["text"] for s in samples], dtype=np.int32)
        if samples and "label" in samples[0]:
            arrays[f"{split}_labels"] = np.array([s["label"] for s in samples], dtype=np.int32)
    np.savez_compressed(path, **arrays)


def run_gpt_neox(src, helpers_dir, out, result_path):
    _single_process_torch()
    _load_package(src, helpers_dir, {})
    from megatron.data import data_utils, indexed_dataset
    from megatron.data.blendable_dataset import BlendableDataset
    import torch

    result = {"cases": {}, "loader": []}
    for case_name, case in CASES.items():
        if case.get("megatron"):
            continue
        work = Path(tempfile.mkdtemp(prefix=f"neox-{case_name}-"))
        corpora = write_corpora(case, work, indexed_dataset)
        args = neox_args(case["args"], lambda name: str(work / name))
        loaders = data_utils.build_train_valid_test_data_loaders(args)
        case_out = out / case_name
        case_out.mkdir(parents=True)
        splits, samples = {}, {}
        for split in ("train", "valid", "test"):
            if loaders[split] is None:
                continue
            ds = loaders[split].dataset
            members = ds.datasets if isinstance(ds, BlendableDataset) else [ds]
            indices = dump_indices(len(ds), case["dump"])
            samples[split] = (indices, [ds[i] for i in indices])
            splits[split] = {"size": len(ds), "datasets": [m.name for m in members]}
        for f in sorted(work.glob("*.npy")):
            shutil.copy(f, case_out / f.name)
        save_samples(case_out / "samples.npz", samples)
        result["cases"][case_name] = {
            "definition": case, "corpora": corpora, "splits": splits,
            "index_files": sorted(f.name for f in work.glob("*.npy"))}
        shutil.rmtree(work)

    class Indices(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return i

    for lc in LOADER_CASES:
        per_rank = []
        for rank in range(lc["dp_world"]):
            _Ranks.rank, _Ranks.world = rank, lc["dp_world"]
            args = NeoxArgs(batch_size=lc["micro_batch"], num_workers=0, iteration=0,
                            gradient_accumulation_steps=1, eval_interval=1000, eval_iters=10)
            loader = data_utils.make_data_loader(Indices(lc["dataset_size"]), neox_args=args)
            it, _, _ = data_utils.shift_and_wrap_data_loaders(
                args, {"train": loader, "valid": None, "test": None})
            per_rank.append([next(it).tolist() for _ in range(lc["steps"])])
        _Ranks.rank, _Ranks.world = 0, 1
        result["loader"].append({**lc, "batches": per_rank})
    Path(result_path).write_text(json.dumps(result))


def run_megatron_deepspeed(src, helpers_dir, out, result_path):
    torch = _single_process_torch()

    class Accelerator:
        LongTensor = staticmethod(lambda data: torch.tensor(data, dtype=torch.long))

    _stub_module("deepspeed")
    _stub_module("deepspeed.accelerator", get_accelerator=lambda: Accelerator())
    defaults = types.SimpleNamespace(
        train_data_exact_num_epochs=None, train_desc_path=None, train_doc_idx_path=None,
        train_sample_idx_path=None, train_shuffle_idx_path=None, use_dataset_only=False,
        return_data_index=False)
    megatron = _load_package(src, helpers_dir, {"get_args": lambda: defaults,
                                                "is_rank_0": lambda: True})
    megatron.core = _stub_module("megatron.core")
    megatron.core.mpu = _mpu_stub("megatron.core.mpu")
    from megatron.data import gpt_dataset, indexed_dataset

    result = {"cases": {}}
    for case_name, case in CASES.items():
        if not case.get("megatron"):
            continue
        work = Path(tempfile.mkdtemp(prefix=f"megatron-{case_name}-"))
        corpora = write_corpora(case, work, indexed_dataset, megatron=True)
        a = case["args"]
        prefix = str(work / a["data_path"])
        indexed = indexed_dataset.make_dataset(prefix, "mmap", skip_warmup=True)
        documents = np.arange(0, indexed.sizes.shape[0], dtype=np.int32)
        num_samples = a["train_iters"] * a["train_batch_size"]
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            ds = gpt_dataset.GPTDataset("train", prefix, documents, indexed, a["split"],
                                        num_samples, a["seq_length"], a["seed"])
        decisions = [line for line in log.getvalue().splitlines() if "separate_last_epoch to" in line]
        assert len(decisions) == 1, log.getvalue()
        case_out = out / case_name
        case_out.mkdir(parents=True)
        for key, array in (("doc_idx", ds.doc_idx), ("sample_idx", ds.sample_idx),
                           ("shuffle_idx", ds.shuffle_idx)):
            shutil.copy(array.filename, case_out / f"{key}.npy")
        indices = dump_indices(len(ds), case["dump"])
        save_samples(case_out / "samples.npz", {"train": (indices, [ds[i] for i in indices])})
        result["cases"][case_name] = {
            "definition": case,
            "corpora": corpora, "splits": {"train": {"size": len(ds), "datasets": ["train"]}},
            "num_epochs": len(ds.doc_idx) // len(documents),
            # as Megatron-DeepSpeed prints it
            "separate_last_epoch": decisions[0].rstrip().endswith("separate_last_epoch to True"),
            "index_files": ["doc_idx.npy", "sample_idx.npy", "shuffle_idx.npy"]}
        shutil.rmtree(work)
    Path(result_path).write_text(json.dumps(result))


def git_commit(src):
    return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt-neox", type=Path, required=True, help="a git checkout of gpt-neox")
    ap.add_argument("--megatron-deepspeed", type=Path, required=True,
                    help="a git checkout of Megatron-DeepSpeed")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--phase", choices=["gpt-neox", "megatron-deepspeed"], help=argparse.SUPPRESS)
    ap.add_argument("--helpers", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase == "gpt-neox":
        return run_gpt_neox(a.gpt_neox.resolve(), a.helpers, a.out, a.result)
    if a.phase == "megatron-deepspeed":
        return run_megatron_deepspeed(a.megatron_deepspeed.resolve(), a.helpers, a.out, a.result)

    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.iterdir():  # all but the README
        if old.is_dir():
            shutil.rmtree(old)
        elif old.name != "README.md":
            old.unlink()
    metadata = {}
    with tempfile.TemporaryDirectory() as tmp:
        for phase, src in (("gpt-neox", a.gpt_neox), ("megatron-deepspeed", a.megatron_deepspeed)):
            helpers = compile_helpers(src, Path(tmp) / phase)
            result = Path(tmp) / f"{phase}.json"
            # One process per project: both name their package `megatron`.
            subprocess.run([sys.executable, __file__, "--phase", phase, "--gpt-neox", str(a.gpt_neox),
                            "--megatron-deepspeed", str(a.megatron_deepspeed), "--out", str(a.out),
                            "--helpers", str(helpers.parent), "--result", str(result)],
                           check=True, stdout=subprocess.DEVNULL)
            metadata[phase] = json.loads(result.read_text())
            files = ["megatron/data/helpers.cpp", "megatron/data/indexed_dataset.py"]
            files += (["megatron/data/data_utils.py", "megatron/data/gpt2_dataset.py",
                       "megatron/data/blendable_dataset.py", "megatron/data/samplers.py"]
                      if phase == "gpt-neox" else ["megatron/data/gpt_dataset.py"])
            metadata[phase]["source"] = {
                "commit": git_commit(src),
                "repository": ("https://github.com/EleutherAI/gpt-neox" if phase == "gpt-neox"
                               else "https://github.com/microsoft/Megatron-DeepSpeed"),
                "files": files,
                "numpy": np.__version__,
            }
    (a.out / "metadata.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
