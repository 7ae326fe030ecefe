"""`lathe runs` over real tiny `lathe train` runs on the CPU (issue: seeing a run): one run that
finished, one stopped by SIGTERM before its last step, and a folder that is not a run; the table
and `--json` report each run's model, steps, losses and status, and a missing folder is an error
naming it."""
import json
import shutil
import socket
import signal
import subprocess
import time

import pytest

from corpus import write_gcide_jsonl
from lathe_cli import LATHE, TINY_MODEL_2L, run, tokenize_corpus, wait_for_step


TINY = TINY_MODEL_2L + """
train:
  steps: 6
  micro_batch_size: 2
  log_interval: 1
  eval_interval: 3
  eval_iters: 1
  threads: 2
optimizer:
  lr: 3.0e-3
checkpoint:
  interval: 2
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs_corpus")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    cfg = d / "tiny.yaml"
    cfg.write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    root = d / "runs"
    run(["train", cfg, "--run-dir", root / "done"])
    # A long run stopped by SIGTERM once it has logged a few steps.
    stopped = root / "stopped"
    p = subprocess.Popen([LATHE, "train", str(cfg), "--run-dir", str(stopped),
                          "--set", "train.steps=100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = stopped / "metrics.jsonl"
    t0 = time.time()
    while time.time() - t0 < 30:
        if metrics.exists() and sum(1 for l in metrics.read_text().splitlines()
                                    if '"train"' in l and l.endswith("}")) >= 3:
            break
        assert p.poll() is None, p.stderr.read()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    (root / "not-a-run").mkdir()
    return root


def last_train_line(run_dir):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [j for j in lines if j["split"] == "train"][-1]


def test_json_rows(runs):
    p = run(["runs", runs, "--json"])
    rows = [json.loads(l) for l in p.stdout.splitlines()]
    assert [r["name"] for r in rows] == ["done", "stopped"]
    done, stopped = rows
    last = last_train_line(runs / "done")
    assert done["status"] == "finished"
    assert (done["steps_done"], done["steps_total"]) == (6, 6)
    assert done["last_loss"] == pytest.approx(last["loss"], rel=1e-12)
    assert done["tokens_per_s"] == pytest.approx(last["tokens_per_s"], rel=1e-12)
    valid = [json.loads(l)["loss"] for l in (runs / "done" / "metrics.jsonl").read_text()
             .splitlines() if '"valid"' in l]
    assert len(valid) == 2
    assert done["best_valid_loss"] == pytest.approx(min(valid), rel=1e-12)
    assert done["model"].startswith("llama ")
    n = last_train_line(runs / "stopped")["step"]
    assert 3 <= n < 100000
    assert stopped["steps_total"] == 100000
    assert stopped["steps_done"] == n
    assert stopped["status"] == f"stopped at step {n}"


def test_table(runs):
    out = run(["runs", runs]).stdout.splitlines()
    assert out[0].split()[:3] == ["name", "model", "steps"]
    assert "best valid loss" in out[0] and "status" in out[0]
    assert len(out) == 3
    assert out[1].startswith("done ") and "6/6" in out[1] and out[1].endswith("finished")
    assert out[2].startswith("stopped ") and "/100000" in out[2]
    assert "stopped at step" in out[2]


def test_malformed_line_marks_only_that_run(runs, tmp_path):
    root = tmp_path / "r"
    shutil.copytree(runs / "done", root / "done")
    shutil.copytree(runs / "done", root / "broken")
    m = root / "broken" / "metrics.jsonl"
    lines = m.read_text().splitlines()
    lines[2] = lines[2][:10]
    m.write_text("\n".join(lines) + "\n")
    out = run(["runs", root]).stdout.splitlines()
    assert len(out) == 3
    assert out[1].startswith("broken ") and out[1].endswith("unreadable: metrics.jsonl line 3")
    assert out[2].startswith("done ") and out[2].endswith("finished")


def test_missing_folder_is_an_error(tmp_path):
    p = run(["runs", tmp_path / "nowhere"], check=False)
    assert p.returncode != 0
    assert p.stderr.startswith("lathe: error:") and str(tmp_path / "nowhere") in p.stderr


def test_a_run_being_trained_is_running_and_cannot_be_trained_twice(runs, tmp_path):
    # The trainer holds RUN/.lathe-train.lock: `lathe runs` says running (with its pid), a second
    # `lathe train` of the same run is refused naming it, and once it stops the lock is gone.
    cfg = runs.parent / "tiny.yaml"
    r = tmp_path / "live"
    p = subprocess.Popen([LATHE, "train", str(cfg), "--run-dir", str(r), "--set",
                          "train.steps=100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        wait_for_step(r, 2, p)
        rows = [json.loads(l) for l in run(["runs", tmp_path, "--json"]).stdout.splitlines()]
        assert [row["status"] for row in rows] == [f"running (pid {p.pid} on host {socket.gethostname()})"], rows
        second = run(["train", cfg, "--run-dir", r], check=False)
        assert second.returncode != 0
        assert f"another lathe train is training this run (pid {p.pid} on host" in second.stderr, \
            second.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    assert p.returncode == 143
    rows = [json.loads(l) for l in run(["runs", tmp_path, "--json"]).stdout.splitlines()]
    assert rows[0]["status"].startswith("stopped at step "), rows
