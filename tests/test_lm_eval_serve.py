"""lm-evaluation-harness through `lathe serve`: lm-eval's `local-completions` model (the OpenAI
completions API, echo + logprobs for log-likelihoods) against a running `lathe serve` gives the
same per-example log-likelihoods (within 1e-4: the bound of test_eval_tasks.compare_multiple_choice),
the same is_greedy, acc and acc_norm, and the same task scores as `lathe eval tasks` on the same
checkpoint and task, on the CPU in fp32.

The checkpoint and task are test_eval_tasks.py's (a tiny random Llama and a byte-level BPE
tokenizer with merges; the 2-shot multiple-choice task), with a context of 512 positions so that no
prompt is truncated: lm-eval's API models cut a long request to max_length - 1 tokens with the
scored tokens inside it, its Hugging Face model (which `lathe eval tasks` follows) to max_length
inputs, so the two would see different windows only for prompts beyond the context. lm-eval loads
the checkpoint's tokenizer itself (tokenizer_backend=huggingface) and sends token ids.
"""
import json
import os

import pytest

from test_eval_tasks import (MC_ROWS, compare_multiple_choice, lathe_tasks, make_checkpoint,
                             task_files, write_jsonl)
from test_serve import serve

CTX = 512


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval_serve")
    ck = make_checkpoint(tmp / "ck")
    config = json.loads((ck / "config.json").read_text())
    config["max_position_embeddings"] = CTX
    (ck / "config.json").write_text(json.dumps(config))
    mc = write_jsonl(tmp / "mc.jsonl",
                     [{"question": q, "choices": c, "answer": a} for q, c, a in MC_ROWS])
    gen = write_jsonl(tmp / "gen.jsonl", [{"q": "one", "a": "two"}])
    tasks = task_files(tmp, mc, gen, gen)
    return tmp, ck, tasks[0]


def lm_eval_through_serve(url, ck, include):
    # scripts/install-deps.sh installs lm_eval: a missing one fails the test.
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = (f"model=ck,base_url={url}/v1/completions,tokenizer_backend=huggingface,"
            f"tokenizer={ck},tokenized_requests=True,max_length={CTX},num_concurrent=1,"
            f"max_retries=1")
    res = lm_eval.simple_evaluate(model="local-completions", model_args=args, batch_size=1,
                                  tasks=["lathe_mc"], task_manager=TaskManager(include_path=str(include)),
                                  log_samples=True, fewshot_random_seed=1234)
    return res["results"]["lathe_mc"], res["samples"]["lathe_mc"]


def test_lm_eval_through_serve_equals_lathe_eval_tasks(setup):
    tmp, ck, mc_task = setup
    summary, rows = lathe_tasks(ck, [mc_task], tmp, "lathe")
    ours = [r for r in rows if r["task"] == "mc"]
    assert len(ours) == len(MC_ROWS)
    with serve(ck, ctx=CTX) as url:
        results, samples = lm_eval_through_serve(url, ck, tmp / "lm")
    theirs = sorted(samples, key=lambda s: s["doc_id"])
    assert len(theirs) == len(MC_ROWS)
    # No prompt reached the context: the windows are the same on both sides.
    assert max(len(o["context"]) for o in ours) < CTX
    compare_multiple_choice(ours, theirs)
    for metric in ("acc", "acc_norm"):
        assert summary["tasks"]["mc"][metric] == pytest.approx(results[f"{metric},none"],
                                                               abs=1e-12)
        assert summary["tasks"]["mc"][f"{metric}_stderr"] == pytest.approx(
            results[f"{metric}_stderr,none"], abs=1e-12)
