"""safetensors interop: lathe's reader and writer against the reference `safetensors` package.

lathe writes files (through the io_tests binary's SafetensorsInterop.WriteForPython, driven by an
environment variable) that Python must load with identical bytes; Python writes files that lathe
must read identically (SafetensorsInterop.DumpForPython); and lathe's single-file output must be
byte-for-byte what the reference serializer produces for the same tensors and metadata.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import safetensors as st
import safetensors.numpy as stnp
import transformers

BUILD_DIR = Path(os.environ.get("LATHE_BUILD_DIR", "build"))
IO_TESTS = BUILD_DIR / "io_tests"
MODEL_TESTS = BUILD_DIR / "model_tests"

# safetensors header names -> the TensorSpec dtype strings of the Python API.
SPEC_DTYPE = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64",
    "F64": "float64", "I64": "int64", "U64": "uint64", "F4": "float4_e2m1fn_x2",
}
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
        "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
        "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4}
# The header names numpy can represent (safetensors.numpy._TYPES).
NUMPY_DTYPE = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
    "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_, "C64": np.complex64,
}


def run_io_test(name, env):
    assert IO_TESTS.exists(), f"{IO_TESTS} is missing: build the io_tests target"
    proc = subprocess.run(
        [str(IO_TESTS), "--gtest_also_run_disabled_tests", f"--gtest_filter=SafetensorsInterop.DISABLED_{name}"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    return proc


def spec_for(dtype, shape, buf):
    """A TensorSpec over a numpy byte buffer (kept alive by the caller)."""
    shape = list(shape)
    if dtype == "F4":  # the Python API takes the packed storage shape and doubles the last dim
        shape[-1] //= 2
    return st.TensorSpec(dtype=SPEC_DTYPE[dtype], shape=shape, data_ptr=buf.ctypes.data,
                         data_len=buf.nbytes)


@pytest.fixture(scope="module")
def lathe_written(tmp_path_factory):
    out = tmp_path_factory.mktemp("lathe_written")
    proc = run_io_test("WriteForPython", {"LATHE_ST_WRITE_DIR": str(out)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[  PASSED  ] 1 test" in proc.stdout, proc.stdout  # ran, not skipped
    return out, json.loads((out / "lathe_manifest.json").read_text())


def test_lathe_file_loads_in_python_with_identical_bytes(lathe_written):
    out, manifest = lathe_written
    path = out / "lathe_all.safetensors"
    loaded = {name: info for name, info in st.deserialize(path.read_bytes())}
    assert set(loaded) == set(manifest["all"])
    for name, want in manifest["all"].items():
        got = loaded[name]
        assert got["dtype"] == want["dtype"], name
        assert list(got["shape"]) == want["shape"], name
        assert bytes(got["data"]).hex() == want["hex"], name
    with st.safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "pt"}



def test_lathe_file_loads_with_numpy_load_file(lathe_written):
    """safetensors.numpy.load_file, what most Python users call (numpy has no bf16/fp8, so this
    file holds the numpy dtypes only)."""
    out, manifest = lathe_written
    arrays = stnp.load_file(str(out / "lathe_numpy.safetensors"))
    assert set(arrays) == set(manifest["numpy"])
    for name, want in manifest["numpy"].items():
        arr = arrays[name]
        assert arr.dtype == np.dtype(NUMPY_DTYPE[want["dtype"]]), name
        assert list(arr.shape) == want["shape"], name
        assert arr.tobytes().hex() == want["hex"], name


def test_lathe_six_bit_types_load_in_python(lathe_written):
    out, manifest = lathe_written
    loaded = dict(st.deserialize((out / "lathe_f6.safetensors").read_bytes()))
    assert {n: (i["dtype"], list(i["shape"]), bytes(i["data"]).hex()) for n, i in loaded.items()} == \
        {n: (w["dtype"], w["shape"], w["hex"]) for n, w in manifest["f6"].items()}


def test_lathe_file_is_byte_identical_to_reference_serializer(lathe_written):
    out, manifest = lathe_written
    keep = []
    specs = {}
    for name, want in manifest["all"].items():
        buf = np.frombuffer(bytes.fromhex(want["hex"]), dtype=np.uint8).copy()
        keep.append(buf)
        specs[name] = spec_for(want["dtype"], want["shape"], buf)
    reference = bytes(st.serialize(specs, metadata={"format": "pt"}))
    assert (out / "lathe_all.safetensors").read_bytes() == reference


def test_lathe_sharded_checkpoint_loads_in_python(lathe_written):
    out, manifest = lathe_written
    ck = out / "lathe_sharded"
    index_text = (ck / "model.safetensors.index.json").read_text()
    index = json.loads(index_text)
    # transformers writes json.dumps(index, indent=2, sort_keys=True) + "\n".
    assert index_text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    files = manifest["sharded_files"]
    n = len(files)
    assert n >= 3
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(p.name for p in ck.iterdir()) == sorted(files + ["model.safetensors.index.json"])
    sizes = {name: len(bytes.fromhex(w["hex"])) for name, w in manifest["sharded"].items()}
    assert index["metadata"]["total_size"] == sum(sizes.values())
    assert set(index["weight_map"]) == set(manifest["sharded"])

    # huggingface_hub's split rule, recomputed here: walk in parameter order, close a shard before
    # a tensor that would take it over the limit, an oversized tensor alone.
    limit = manifest["max_shard_bytes"]
    shards, current, current_size = [], [], 0
    for name in manifest["sharded_order"]:
        size = sizes[name]
        if size > limit:
            shards.append([name])
            continue
        if current_size + size > limit and current:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current:
        shards.append(current)
    expected_map = {name: files[i] for i, shard in enumerate(shards) for name in shard}
    assert index["weight_map"] == expected_map

    seen = {}
    for f in files:
        for name, info in st.deserialize((ck / f).read_bytes()):
            assert index["weight_map"][name] == f
            seen[name] = info
        with st.safe_open(str(ck / f), framework="np") as h:
            assert h.metadata() == {"format": "pt"}
    for name, want in manifest["sharded"].items():
        assert seen[name]["dtype"] == want["dtype"]
        assert list(seen[name]["shape"]) == want["shape"]
        assert bytes(seen[name]["data"]).hex() == want["hex"]


def lathe_dump(path, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    dump = tmp_path / "dump.json"
    if dump.exists():
        dump.unlink()
    proc = run_io_test("DumpForPython", {"LATHE_ST_READ": str(path), "LATHE_ST_DUMP": str(dump)})
    return proc, (json.loads(dump.read_text()) if proc.returncode == 0 else None)


def python_tensors(rng):
    """Tensors of every dtype the Python API writes, as (dtype, shape, raw bytes)."""
    out = {}
    for i, dtype in enumerate(sorted(SPEC_DTYPE)):
        shape = [2, 3, 4] if i % 2 else [5, 2]
        if dtype == "F4":
            shape = [3, 4]
        numel = int(np.prod(shape))
        bits = BITS[dtype]
        raw = rng.integers(0, 256, size=numel * bits // 8, dtype=np.uint8)
        if dtype == "BOOL":
            raw &= 1
        out[f"py.{dtype.lower()}"] = (dtype, shape, raw)
    out["py.scalar"] = ("F32", [], np.frombuffer(np.float32(2.5).tobytes(), dtype=np.uint8).copy())
    out["py.empty"] = ("F32", [0, 7], np.zeros(0, dtype=np.uint8))
    return out


def test_python_file_loads_in_lathe_identically(tmp_path):
    rng = np.random.default_rng(1234)
    tensors = python_tensors(rng)
    path = tmp_path / "py.safetensors"
    specs = {n: spec_for(d, s, b) for n, (d, s, b) in tensors.items()}
    st.serialize_file(specs, str(path), metadata={"format": "np", "note": "written by Python"})
    proc, dump = lathe_dump(path, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert dump["metadata"] == {"format": "np", "note": "written by Python"}
    assert set(dump["tensors"]) == set(tensors)
    ref = {name: info for name, info in st.deserialize(path.read_bytes())}
    for name, (dtype, shape, raw) in tensors.items():
        got = dump["tensors"][name]
        assert got["dtype"] == dtype, name
        assert got["shape"] == list(ref[name]["shape"]), name
        assert got["hex"] == raw.tobytes().hex(), name


def test_numpy_save_file_loads_in_lathe(tmp_path):
    rng = np.random.default_rng(7)
    arrays = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.integers(-100, 100, (7,), dtype=np.int64),
        "c": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "d": np.array(True),
    }
    path = tmp_path / "np.safetensors"
    stnp.save_file(arrays, str(path))
    proc, dump = lathe_dump(path, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, arr in arrays.items():
        got = dump["tensors"][name]
        assert got["shape"] == list(arr.shape)
        assert got["hex"] == arr.tobytes().hex()


def test_python_sharded_checkpoint_loads_in_lathe(tmp_path):
    """Shards and an index laid out as transformers' save_pretrained writes them."""
    rng = np.random.default_rng(5)
    params = {f"model.layers.{i}.weight": rng.standard_normal((4, 8)).astype(np.float32)
              for i in range(5)}
    names = list(params)
    groups = [names[:2], names[2:4], names[4:]]
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        stnp.save_file({n: params[n] for n in group}, str(tmp_path / fname),
                       metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": sum(a.nbytes for a in params.values())},
             "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True) + "\n")
    proc, dump = lathe_dump(tmp_path, tmp_path / "x")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(dump["tensors"]) == set(params)
    for name, arr in params.items():
        assert dump["tensors"][name]["hex"] == arr.tobytes().hex()


def test_truncated_python_file_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "cut.safetensors"
    stnp.save_file({"w": np.ones((64, 64), dtype=np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(Exception):
        stnp.load_file(str(path))  # the reference refuses it too
    proc, _ = lathe_dump(path, tmp_path)
    assert proc.returncode != 0
    assert "tensor 'w'" in proc.stdout and "truncated" in proc.stdout, proc.stdout


# ---- config.json written by lathe (src/model/hf_config.*) loads in transformers ----

HF_FIXTURES = ["llama-3.2-1b", "qwen2-0.5b", "mistral-7b-v0.1", "pythia-160m", "gpt2"]
HF_CLASSES = {"llama-3.2-1b": "LlamaConfig", "qwen2-0.5b": "Qwen2Config",
              "mistral-7b-v0.1": "MistralConfig", "pythia-160m": "GPTNeoXConfig",
              "gpt2": "GPT2Config"}


@pytest.fixture(scope="module")
def lathe_configs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_configs")
    assert MODEL_TESTS.exists(), f"{MODEL_TESTS} is missing: build the model_tests target"
    proc = subprocess.run([str(MODEL_TESTS), "--gtest_also_run_disabled_tests",
                           "--gtest_filter=HfConfigInterop.DISABLED_WriteForPython"],
                          env={**os.environ, "LATHE_HF_CONFIG_DIR": str(out)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "[  PASSED  ] 1 test" in proc.stdout, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_lathe_config_json_loads_in_transformers_as_the_original(lathe_configs, name):
    """The Hub's config.json, parsed and written back by lathe, gives transformers the same
    configuration (to_dict() equal) as the original file."""
    orig = transformers.AutoConfig.from_pretrained(str(lathe_configs / f"{name}.orig"))
    back = transformers.AutoConfig.from_pretrained(str(lathe_configs / f"{name}.lathe"))
    assert type(back).__name__ == HF_CLASSES[name]
    a, b = orig.to_dict(), back.to_dict()
    a.pop("_name_or_path", None)
    b.pop("_name_or_path", None)
    assert a == b


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_lathe_scaled_config_loads_in_transformers(lathe_configs, name):
    """A real config scaled down and written by lathe: transformers reads the new sizes."""
    c = transformers.AutoConfig.from_pretrained(str(lathe_configs / f"{name}.small"))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (64, 2, 4, 512)
    if name == "gpt2":
        assert c.n_inner == 96
    else:
        assert c.intermediate_size == 96
    if name in ("llama-3.2-1b", "mistral-7b-v0.1", "qwen2-0.5b"):
        assert c.num_key_value_heads == 2
        assert getattr(c, "head_dim", c.hidden_size // c.num_attention_heads) == 16
