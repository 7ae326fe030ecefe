"""docs/DISTRIBUTED.md, checked against the code and run where it runs on the CPU.

  * The CPU quick start (the ```sh block of "## Quick start" that starts with mpirun) is read from
    the page and run with bash in a fresh folder laid out like the repository root (configs/
    linked, `lathe` on the PATH, runs/default/ holding what scripts/run-default.sh prepares, made
    small here). Only sizes change, each by a `--set` appended to the command, and mpirun gets
    --oversubscribe (two ranks on a machine of fewer cores). Checked: it succeeds, trains as two
    ranks (every train line of metrics.jsonl says world_size 2), and its last checkpoint holds
    the ZeRO-1 shard set the page describes, one file per rank; the same command again resumes
    (nothing to do once complete) and succeeds.
  * What the page states of the code: every flag of its `lathe launch` table is in `lathe launch
    --help`; every launcher variable of its table is one src/dist/process_group.cpp reads; every
    source file it links exists; the message fragments it quotes are in the sources that print
    them; the sbatch example parses (bash -n) and starts its ranks with the srun flags the page
    names.
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from corpus import write_gcide_jsonl
from lathe_cli import LATHE, run, tokenize_corpus

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "DISTRIBUTED.md").read_text(encoding="utf-8")
SBATCH = ROOT / "examples" / "slurm" / "train-multinode.sbatch"
MPIRUN = shutil.which("mpirun")

# Sizes for a CI machine, appended to the page's command (a later --set wins).
SMALLER = ["train.steps=4", "train.micro_batch_size=2", "data.seq_length=32",
           "checkpoint.interval=4", "train.log_interval=1", "train.eval_interval=0"]


def section(title):
    return PAGE.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def cpu_quick_start_block():
    blocks = re.findall(r"```sh\n(.*?)\n```", section("Quick start"), re.S)
    cpu = [b for b in blocks if b.lstrip().startswith("mpirun ")]
    assert len(cpu) == 1, f"docs/DISTRIBUTED.md: one mpirun block under ## Quick start, found {blocks}"
    return cpu[0]


def test_block_is_the_pages_commands():
    block = cpu_quick_start_block()
    assert "mpirun -np 2 lathe train configs/tiny.yaml --run-dir runs/tiny-2ranks" in block
    assert "train.device=cpu" in block
    assert "lathe launch --gpus 4 lathe train configs/tiny.yaml" in section("Quick start")
    assert (ROOT / "configs" / "tiny.yaml").exists()


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun (OpenMPI; scripts/install-deps.sh installs it)")
def test_cpu_quick_start_runs_as_written(tmp_path):
    root = tmp_path / "repo"
    default = root / "runs" / "default"
    default.mkdir(parents=True)
    (root / "configs").symlink_to(ROOT / "configs")
    # What scripts/run-default.sh leaves in runs/default, at a CI size.
    write_gcide_jsonl(tmp_path / "c.jsonl", 200_000)
    tokenize_corpus(tmp_path / "c.jsonl", default / "tokenizer.json", default / "gcide", 300)

    joined = re.sub(r"\\\n\s*", "", cpu_quick_start_block())
    command = joined.replace("mpirun ", "mpirun --oversubscribe ", 1)
    command += "".join(f" --set {s}" for s in SMALLER)
    env = dict(os.environ, PATH=f"{Path(LATHE).resolve().parent}:{os.environ['PATH']}",
               OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for attempt in ("first", "rerun"):
        p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + command + "\n"], cwd=root,
                           env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{attempt}: {command}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-6000:]}"

    run_dir = root / "runs" / "tiny-2ranks"
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [l for l in lines if l["split"] == "train"]
    assert [l["step"] for l in train] == [1, 2, 3, 4], lines
    assert all(l["world_size"] == 2 for l in train), train
    # The global batch is ranks x micro-batch x accumulation sequences of data.seq_length tokens.
    assert train[-1]["tokens"] == 4 * 2 * 2 * 1 * 32, train[-1]
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == checkpoint.name
    names = sorted(f.name for f in checkpoint.iterdir())
    assert [n for n in names if n.startswith("optimizer")] == [
        "optimizer.rank-00000-of-00002.safetensors", "optimizer.rank-00001-of-00002.safetensors"], names
    assert "model.safetensors" in names and "config.json" in names, names
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["world_size"] == 2, state


def test_launch_flags_in_the_table_exist():
    table = section("Quick start")
    flags = re.findall(r"^\| `(--[a-z-]+)", table, re.M)
    assert flags == ["--gpus", "--master-port", "--grace-s"], flags
    p = run(["launch", "--help"])
    for flag in flags:
        assert flag in p.stdout + p.stderr, flag


def test_launcher_variables_are_the_ones_read():
    table = section("Which process is which: launchers and their variables")
    names = set(re.findall(r"`([A-Z][A-Z_]+)(?:=[a-z]+)?`", table))
    assert {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "SLURM_JOB_NODELIST", "MASTER_PORT",
            "LATHE_LAUNCHER"} <= names, names
    sources = "".join((ROOT / "src" / "dist" / f).read_text()
                      for f in ("process_group.cpp", "launch.cpp", "open.cpp"))
    # Named there but not variables lathe reads: CUDA's device mask, MPI's world communicator.
    not_read = {"CUDA_VISIBLE_DEVICES", "MPI_COMM_WORLD"}
    missing = sorted(n for n in names - not_read if f'"{n}"' not in sources)
    assert not missing, f"docs/DISTRIBUTED.md names variables lathe does not read: {missing}"


def test_linked_files_exist():
    links = re.findall(r"\]\((\.\./[^)#]+)\)", PAGE)
    assert len(links) >= 10, links
    for link in links:
        assert (ROOT / "docs" / link).resolve().exists(), f"docs/DISTRIBUTED.md links {link}"


# Fragments of the messages the page quotes, and the source that prints each.
QUOTED = {
    "src/dist/rendezvous.cpp": ["(MASTER_ADDR:MASTER_PORT), rank {} of {}",
                                "check that rank 0 runs and that MASTER_ADDR and MASTER_PORT name it",
                                "pick a free MASTER_PORT", "two jobs on one MASTER_PORT, or launchers"],
    "src/dist/launch.cpp": ["launch: rank {} (pid {}) {}", "; stopping the other {} ranks"],
    "src/dist/watchdog.cpp": ["did not complete within {:g} s (parallel.timeout_s); {}",
                              "another rank has probably died, hung or run out of memory"],
    "src/dist/nccl_communicator.cu": ["NCCL error {} ({}){}{}", "NCCL (asynchronous error)",
                                      "all_reduce (ncclAllReduce)", "NCCL communicator (ncclCommInitRank"],
    "src/dist/consistency.cpp": ["has a different {} than {}",
                                 "every rank must run the same lathe binary, configuration and data"],
    "src/run/trainer.cpp": ["step {} (its collectives with the other ranks)",
                            "but this configuration changes what an exact",
                            "the global batch (ranks x {} x {})",
                            "resuming a checkpoint of {} ranks with {}: each rank reads its part of the "],
    "src/optim/optimizer_state.cpp": ["the optimizer shard set of {} ranks is incomplete: missing {}"],
    "src/run/train_settings.cpp": ["or 3 (optimizer state, gradients and parameters sharded)"],
}


def test_quoted_messages_are_in_the_sources():
    for path, fragments in QUOTED.items():
        # The sources as written: clang-format may split a string literal across lines.
        text = re.sub(r'"\s*\n\s*"', "", (ROOT / path).read_text())
        for fragment in fragments:
            assert fragment in text, f"{path} does not print '{fragment}', which docs/DISTRIBUTED.md quotes"


def test_sbatch_example_parses_and_uses_the_pages_srun_flags():
    assert SBATCH.exists()
    assert f"]({os.path.relpath(SBATCH, ROOT / 'docs')})" in PAGE
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    srun = re.search(r"^srun (.*?)\n(?!\s)", text, re.M | re.S)
    assert srun, text
    for flag in ("--ntasks-per-node=4", "--gpus-per-node=4", "--kill-on-bad-exit=1"):
        assert flag in srun.group(1), (flag, srun.group(1))
        assert flag in section("Several nodes with SLURM"), flag
    assert '"$LATHE" train "$config" --run-dir "$run_dir"' in srun.group(1)
