"""bench/tp_train.sh, the tensor-parallel training table's driver (docs/PERF.md), kept working off
the GPU machine: on the CPU with configs/tiny.yaml (TP_TRAIN_CONFIG) one row trains until its
metrics hold the steps asked for, is stopped without a checkpoint, and gives one JSON line whose
rate comes from the steps after the first two; a row that cannot start says so and the next runs."""
import json
import os
import subprocess
from pathlib import Path

from corpus import dictionary_text
from lathe_cli import LATHE, ROOT


def test_rows_give_one_json_line_each_from_the_steady_steps(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(dictionary_text("gcide", 300_000))
    out = tmp_path / "out"
    env = dict(os.environ, TP_TRAIN_STEPS="6", TP_TRAIN_LIMIT="120",
               TP_TRAIN_CONFIG=str(ROOT / "configs" / "tiny.yaml"))
    p = subprocess.run(["bash", str(ROOT / "bench" / "tp_train.sh"), LATHE, str(corpus),
                        str(ROOT.parent / "shared" / "tokenizers" / "gpt2.json"), str(out),
                        "cpu1:1:train.device=cpu,train.log_interval=1,train.micro_batch_size=2",
                        "bad:1:train.device=cpu,train.recompute=sometimes"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(l) for l in (out / "tp_train.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rows] == ["cpu1"]
    r = rows[0]
    assert r["gpus"] == 1 and r["steps_timed"] == 3
    assert r["tokens_per_s"] > 0 and r["step_s"] > 0 and r["memory_bytes"] > 0
    assert abs(r["tokens_per_s"] * r["step_s"] - 2 * 128) < 1e-3 * 256
    assert "tp_train: bad: no figures" in p.stdout
    assert "train.recompute" in (out / "bad.log").read_text()
    # Stopped by SIGKILL after its sixth logged step: no checkpoint was written.
    assert not list(tmp_path.glob("**/checkpoints/step-*"))
