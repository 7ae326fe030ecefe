"""`lathe eval tasks` (src/run/eval_tasks*.h, docs/INFERENCE.md "Eval tasks") against
lm-evaluation-harness with its Hugging Face backend, on the CPU in fp32:

  - a tiny random Llama (written here by transformers) and a byte-level BPE tokenizer with merges
    (so that a continuation's leading space merges with its first letters and the
    context/continuation split matters), a context window of 160 tokens (2-shot prompts beyond
    it are left-truncated on both sides);
  - a multiple-choice task (2-shot, the random sampler with lm-eval's seed, the evaluated record
    excluded), a generation task (2-shot from a separate pool, stop strings, strip, exact_match
    ignoring case and punctuation) and the shipped PubMedQA task on its first 5 records (when
    ../shared has the corpus), each defined once for lathe (its YAML) and once for lm-eval (a
    task YAML in lm-eval's schema over the same JSONL);
  - per example: the same prompt string, log-likelihoods within 1e-4, the same is_greedy, acc,
    acc_norm, generation and exact_match; per task the same scores and stderrs;
  - the shipped task files load and run (configs/tasks), and bad task files get `lathe: error:`
    naming the file, line and key;
  - on a GPU (skipped without one): log-likelihoods within the bf16 bound of the CPU's.
"""
import json
import os
from pathlib import Path

import pytest
import torch
import transformers

from conftest import NEEDS_CUDA
from lathe_cli import ROOT, run

CTX = 160
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", ROOT.parent / "shared"))
TASKS = ROOT / "configs" / "tasks"
PUBMED = SHARED / "corpora" / "pubmedqa_ori_pqal.json"
MC_ROWS = [
    ("Which of these is a metal?", ["copper", "wood", "glass", "water"], 0),
    ("What do plants need for photosynthesis?", ["sand", "light", "salt", "noise"], 1),
    ("Which planet is closest to the sun?", ["Mars", "Venus", "Mercury"], 2),
    ("What is frozen water called?", ["steam", "ice"], 1),
    ("Which animal lays eggs?", ["a hen", "a cow", "a horse", "a goat"], 0),
    ("What gas do animals breathe out?", ["oxygen", "helium", "carbon dioxide"], 2),
    ("How many legs does a spider have?", ["six", "eight", "ten", "four"], 1),
    ("Which one is a liquid at room temperature?", ["iron", "mercury", "gold"], 1),
    ("What makes a compass needle turn?", ["magnetism", "heat", "sound"], 0),
    ("Which is the largest?", ["an atom", "a cell", "a planet", "a star"], 3),
]
GEN_SHOTS = [("one plus two", "three"), ("two minus one", "one"), ("three times one", "three"),
             ("six minus one", "five")]
GEN_ROWS = [
    ("two plus two", "four"), ("three plus one", "four"), ("one plus one", "two"),
    ("five minus two", "Three!"), ("four minus four", "zero"), ("two times three", "six"),
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_checkpoint(folder):
    """A 2-layer random Llama and a byte-level BPE tokenizer (256 bytes, merges, an EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n"), ("e", "r"),
                 ("o", "n"), ("Ġ", "s"), ("Ġ", "c"), ("r", "e"), ("Ġ", "w"), ("a", "t"),
                 ("Ġ", "o"), ("e", "n"), ("Ġ", "f"), ("o", "u"), ("Ġ", "m"), ("Ġ", "p")]:
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eot|>",
                                                  clean_up_tokenization_spaces=False)
    hf_tok.save_pretrained(folder)
    eos = hf_tok.convert_tokens_to_ids("<|eot|>")
    assert eos == len(vocab)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab) + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CTX,
        tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos, initializer_range=0.3)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    return folder


def task_files(tmp, data_mc, data_gen, shots_gen):
    """The two tasks for lathe (tmp/lathe/*.yaml) and for lm-eval (tmp/lm/*.yaml)."""
    (tmp / "lathe").mkdir()
    (tmp / "lm").mkdir()
    mc_text = "Question: {{question}}\\nAnswer:"
    gen_text = "Q: what is {{q}}?\\nA:"
    (tmp / "lathe" / "mc.yaml").write_text(f"""name: mc
kind: multiple_choice
data: {data_mc}
doc_to_text: "{mc_text}"
doc_to_choice: choices
doc_to_target: answer
num_fewshot: 2
""")
    (tmp / "lathe" / "gen.yaml").write_text(f"""name: gen
kind: generate
data: {data_gen}
fewshot_data: {shots_gen}
doc_to_text: "{gen_text}"
doc_to_target: a
num_fewshot: 2
until: ["\\n", "."]
max_gen_toks: 8
strip: true
ignore_case: true
ignore_punctuation: true
""")
    (tmp / "lm" / "mc.yaml").write_text(f"""task: lathe_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_mc}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{mc_text}"
doc_to_choice: choices
doc_to_target: answer
num_fewshot: 2
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    (tmp / "lm" / "gen.yaml").write_text(f"""task: lathe_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_gen}
    train: {shots_gen}
test_split: test
fewshot_split: train
output_type: generate_until
doc_to_text: "{gen_text}"
doc_to_target: a
num_fewshot: 2
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""")
    return [tmp / "lathe" / "mc.yaml", tmp / "lathe" / "gen.yaml"]


def lathe_tasks(ck, tasks, tmp, name):
    samples = tmp / f"{name}.jsonl"
    out = run(["eval", "tasks", "--checkpoint", ck, *sum([["--tasks", t] for t in tasks], []),
               "--samples", samples, "--batch-size", 4, "--device", "cpu"])
    summary = json.loads(out.stdout)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return summary, rows


def pubmed_task_files(tmp):
    """The shipped PubMedQA task over its first 5 records (a JSONL copy), for lathe and lm-eval;
    [] without the shared corpus."""
    if not PUBMED.exists():
        return []
    rows = list(json.loads(PUBMED.read_text()).values())[:5]
    data = write_jsonl(tmp / "pubmed.jsonl", rows)
    shipped = (TASKS / "pubmedqa.yaml").read_text()
    line = "data: ../../../shared/corpora/pubmedqa_ori_pqal.json"
    assert line in shipped
    (tmp / "lathe" / "pubmedqa.yaml").write_text(shipped.replace(line, f"data: {data}"))
    text = [ln for ln in shipped.splitlines() if ln.startswith("doc_to_text:")][0]
    (tmp / "lm" / "pubmedqa.yaml").write_text(f"""task: lathe_pubmedqa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
{text}
doc_to_choice: ["yes", "no", "maybe"]
doc_to_target: final_decision
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    return [tmp / "lathe" / "pubmedqa.yaml"]


def lm_eval_tasks(ck, include, names):
    # scripts/install-deps.sh installs lm_eval and accelerate: a missing one fails the test.
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={ck},dtype=float32,device=cpu", batch_size=1,
        tasks=names, task_manager=TaskManager(include_path=str(include)),
        log_samples=True, fewshot_random_seed=1234)
    return res["results"], res["samples"]


def compare_multiple_choice(ours, theirs):
    for o, t in zip(ours, theirs):
        args = t["arguments"]
        ctx = args[0]["arg_0"] if isinstance(args[0], dict) else args[0][0]
        assert o["context"] == ctx, f"record {o['index']}: prompts differ"
        lls = [float(r[0][0]) for r in t["resps"]]
        greedy = [bool(r[0][1]) for r in t["resps"]]
        # Both sides run the model in fp32 (u = 2^-24) with different reduction orders. Each
        # logit z goes through 2 layers of GEMMs over K = 64 and 128 terms, attention over at most
        # 160 positions, RMSNorm over 64 and the tied head over 64; as a random walk of roundings
        # that is sqrt(2 * (3*64 + 16 + 160 + 64 + 64 + 128) + 64 + 2*64) ~ 33 u relative per
        # logit, and log_softmax(z)[t] = z_t - logsumexp(z) takes two such errors: 66 u |lp| per
        # token, summed over the continuation at most 66 u |ll|. lm-eval adds the n token
        # log-probabilities in fp32: (n - 1) u |ll| more (all terms are <= 0). So
        #   |ll_lathe - ll_lm_eval| <= (66 + n) u |ll|,
        # capped at 1e-4. Measured on these records: at most 17 u |ll| (2.1e-5 at |ll| ~ 50).
        for ll, ref, n in zip(o["loglikelihoods"], lls, o["continuation_tokens"]):
            bound = min(1e-4, (66 + n) * 2.0**-24 * abs(ref))
            assert abs(ll - ref) <= bound, f"record {o['index']}: {ll} vs {ref} (bound {bound})"
        assert o["is_greedy"] == greedy
        assert o["acc"] == t["acc"] and o["acc_norm"] == t["acc_norm"], f"record {o['index']}"


def test_scores_equal_lm_eval_harness(tmp_path):
    ck = make_checkpoint(tmp_path / "ck")
    mc = write_jsonl(tmp_path / "mc.jsonl",
                     [{"question": q, "choices": c, "answer": a} for q, c, a in MC_ROWS])
    gen_rows = [{"q": q, "a": a} for q, a in GEN_ROWS]
    gen = write_jsonl(tmp_path / "gen.jsonl", gen_rows)
    shots = write_jsonl(tmp_path / "shots.jsonl", [{"q": q, "a": a} for q, a in GEN_SHOTS])
    tasks = task_files(tmp_path, mc, gen, shots)
    # The random model answers none of the arithmetic: make half of the targets its own greedy
    # answers (from a first lathe run), so that exact_match is 1 where lm-eval generates the same.
    # The few-shot records come from shots.jsonl, so the targets do not change the prompts.
    _, first = lathe_tasks(ck, tasks, tmp_path, "first")
    first_gen = [r for r in first if r["task"] == "gen"]
    for i in range(0, len(gen_rows), 2):
        gen_rows[i]["a"] = "".join(c.upper() if c.isascii() else c
                                   for c in first_gen[i]["generation"]) + "?"
    write_jsonl(gen, gen_rows)

    pubmed = pubmed_task_files(tmp_path)
    summary, rows = lathe_tasks(ck, tasks + pubmed, tmp_path, "second")
    names = ["lathe_mc", "lathe_gen"] + (["lathe_pubmedqa"] if pubmed else [])
    results, samples = lm_eval_tasks(ck, tmp_path / "lm", names)

    pairs = [("mc", "lathe_mc", len(MC_ROWS))] + ([("pubmedqa", "lathe_pubmedqa", 5)]
                                                   if pubmed else [])
    for ours_name, theirs_name, n in pairs:
        ours = [r for r in rows if r["task"] == ours_name]
        theirs = sorted(samples[theirs_name], key=lambda s: s["doc_id"])
        assert len(ours) == len(theirs) == n
        compare_multiple_choice(ours, theirs)

    g_ours = [r for r in rows if r["task"] == "gen"]
    g_theirs = sorted(samples["lathe_gen"], key=lambda s: s["doc_id"])
    assert len(g_ours) == len(g_theirs) == len(GEN_ROWS)
    for o, t in zip(g_ours, g_theirs):
        args = t["arguments"]
        ctx = args[0]["arg_0"] if isinstance(args[0], dict) else args[0][0]
        assert o["context"] == ctx
        assert o["generation"] == t["filtered_resps"][0], f"record {o['index']}"
        assert o["generation"] == o["generation"].strip()
        assert o["exact_match"] == t["exact_match"]
    assert sum(r["exact_match"] for r in g_ours) >= len(GEN_ROWS) // 2

    for name, ours_t in [(t, summary["tasks"][o]) for o, t, _ in pairs] + [
            ("lathe_gen", summary["tasks"]["gen"])]:
        r = results[name]
        for metric in ["exact_match"] if name == "lathe_gen" else ["acc", "acc_norm"]:
            key = "strip" if name == "lathe_gen" else "none"
            assert ours_t[metric] == pytest.approx(r[f"{metric},{key}"], abs=1e-12), metric
            assert ours_t[f"{metric}_stderr"] == pytest.approx(r[f"{metric}_stderr,{key}"],
                                                               abs=1e-12), metric



def test_shipped_task_files_run(tmp_path):
    ck = make_checkpoint(tmp_path / "ck")
    files = [TASKS / "science_mc.yaml", TASKS / "number_words.yaml"]
    pubmed = PUBMED
    if pubmed.exists():
        # The shipped file points at ../shared from the project root; read it from wherever the
        # shared folder is here.
        text = (TASKS / "pubmedqa.yaml").read_text()
        assert "data: ../../../shared/corpora/pubmedqa_ori_pqal.json" in text
        (tmp_path / "pubmedqa.yaml").write_text(
            text.replace("../../../shared/corpora/pubmedqa_ori_pqal.json", str(pubmed)))
        files.append(tmp_path / "pubmedqa.yaml")
    samples = tmp_path / "s.jsonl"
    summary_file = tmp_path / "summary.json"
    out = run(["eval", "tasks", "--checkpoint", ck, *sum([["--tasks", f] for f in files], []),
               "--limit", 3, "--samples", samples, "--output", summary_file, "--device", "cpu"])
    summary = json.loads(out.stdout)
    assert json.loads(summary_file.read_text()) == summary
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    sci = summary["tasks"]["science_mc"]
    assert sci["records"] == 3 and 0 <= sci["acc"] <= 1 and 0 <= sci["acc_norm"] <= 1
    assert sci["acc"] * 3 == sum(r["acc"] for r in rows if r["task"] == "science_mc")
    first = [r for r in rows if r["task"] == "science_mc"][0]
    assert first["context"].count("\n\nQuestion: ") == 5  # 5 shots, then the question
    assert first["choices"] == ["copper", "rubber", "wood", "glass"] and first["gold"] == 0
    assert summary["tasks"]["number_words"]["records"] == 3
    if pubmed.exists():
        data = json.loads(pubmed.read_text())
        want = list(data.values())[:3]
        got = [r for r in rows if r["task"] == "pubmedqa"]
        assert len(got) == 3
        for w, g in zip(want, got):
            assert g["context"] == ("Abstract: " + "\n".join(w["CONTEXTS"]) + "\nQuestion: " +
                                    w["QUESTION"] + "\nAnswer:")
            assert g["choices"] == ["yes", "no", "maybe"]
            assert g["choices"][g["gold"]] == w["final_decision"]


def test_bad_task_files_name_file_line_and_key(tmp_path):
    ck = make_checkpoint(tmp_path / "ck")
    write_jsonl(tmp_path / "d.jsonl", [{"q": "a", "c": ["x", "y"], "t": 0}])
    cases = [
        ("name: t\nkind: multiple_choice\ndata: d.jsonl\ndoc_to_text: q\ndoc_to_choice: c\n"
         "doc_to_target: t\nfewshot: 2\n", "bad.yaml:7: unknown key 'fewshot'"),
        ("name: t\nkind: multiple_choice\ndata: d.jsonl\ndoc_to_text: q\ndoc_to_target: t\n",
         "missing required key 'doc_to_choice'"),
        ("name: t\nkind: generate\ndata: d.jsonl\ndoc_to_text: q\ndoc_to_target: t\n"
         "max_gen_toks: 0\n", "bad.yaml:6: key 'max_gen_toks' must be >= 1"),
        ("name: t\nkind: multiple_choice\ndata: d.jsonl\ndoc_to_text: q\ndoc_to_choice: c\n"
         "doc_to_target: t\nnum_fewshot: 1\n", "num_fewshot 1 needs 2 records"),
        ("name: t\nkind: multiple_choice\ndata: d.jsonl\ndoc_to_text: \"{{question}}\"\n"
         "doc_to_choice: c\ndoc_to_target: t\n", "no field 'question'"),
    ]
    for yaml, want in cases:
        f = tmp_path / "bad.yaml"
        f.write_text(yaml)
        out = tmp_path / "out.json"
        p = run(["eval", "tasks", "--checkpoint", ck, "--tasks", f, "--output", out,
                 "--device", "cpu"], check=False)
        assert p.returncode != 0
        assert "lathe: error:" in p.stderr and want in p.stderr, p.stderr
        assert not out.exists()


def test_cuda_log_likelihoods_match_the_cpu_within_bf16_rounding(tmp_path):
    """On CUDA the model computes in bf16 and Model::logits returns bf16-rounded logits.

    The bar (the engine's, src/infer/engine_gpu_test.cu): each of the L blocks and the LM head
    rounds to bf16 (u = 2^-8 relative), so a logit differs from the CPU's by at most
    eps = 4 (L + 1) u max|z|. A log-softmax value z_t - logsumexp(z) then moves by at most 2 eps
    (|d z_t| + max |d z_v|), and a continuation of n tokens by at most 2 n eps. acc may differ
    only where the CPU's best choice leads the next by less than the two choices' bounds.
    """
    ck = make_checkpoint(tmp_path / "ck")
    mc = write_jsonl(tmp_path / "mc.jsonl",
                     [{"question": q, "choices": c, "answer": a} for q, c, a in MC_ROWS])
    task = tmp_path / "mc.yaml"
    task.write_text("name: mc\nkind: multiple_choice\ndata: mc.jsonl\n"
                    "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_choice: choices\n"
                    "doc_to_target: answer\nnum_fewshot: 2\n")
    cuda = tmp_path / "cuda.jsonl"
    p = run(["eval", "tasks", "--checkpoint", ck, "--tasks", task, "--samples", cuda,
             "--device", "cuda"], check=False)
    if p.returncode != 0 and "--device: cuda, but" in p.stderr:
        pytest.skip(NEEDS_CUDA + p.stderr.strip())
    assert p.returncode == 0, p.stderr
    cpu = tmp_path / "cpu.jsonl"
    run(["eval", "tasks", "--checkpoint", ck, "--tasks", task, "--samples", cpu,
         "--device", "cpu"])
    g = [json.loads(line) for line in cuda.read_text().splitlines()]
    c = [json.loads(line) for line in cpu.read_text().splitlines()]
    # max|z| over every position the requests read, from transformers in fp32.
    model = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(ck)
    zmax = 0.0
    with torch.no_grad():
        for row in c:
            for choice in row["choices"]:
                ids = tok(row["context"] + " " + choice)["input_ids"][-(CTX + 1):][:-1]
                zmax = max(zmax, float(model(torch.tensor([ids])).logits.abs().max()))
    layers = model.config.num_hidden_layers
    eps = 4 * (layers + 1) * 2.0**-8 * zmax
    for a, b in zip(g, c):
        assert a["context"] == b["context"] and a["continuation_tokens"] == b["continuation_tokens"]
        bounds = [2 * n * eps for n in b["continuation_tokens"]]
        for lg, lc, bound in zip(a["loglikelihoods"], b["loglikelihoods"], bounds):
            assert abs(lg - lc) <= bound, (lg, lc, bound)
        lls = b["loglikelihoods"]
        best = max(range(len(lls)), key=lambda i: (lls[i], -i))
        if all(lls[best] - lls[i] > bounds[best] + bounds[i] for i in range(len(lls)) if i != best):
            assert a["acc"] == b["acc"]
    # Generation on CUDA runs through the engine (greedy outputs may part from the CPU's at
    # near-ties, so only the run and the score's range are checked).
    out = run(["eval", "tasks", "--checkpoint", ck, "--tasks", TASKS / "number_words.yaml",
               "--limit", 4, "--device", "cuda"])
    em = json.loads(out.stdout)["tasks"]["number_words"]
    assert em["records"] == 4 and 0.0 <= em["exact_match"] <= 1.0
