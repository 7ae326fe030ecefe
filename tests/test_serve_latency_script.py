"""bench/serve_latency.py, the client side of the tensor-parallel serving job (docs/INFERENCE.md),
kept working off the GPU machine: against a `lathe serve` of a random-weight config on the CPU it
times one long request and a concurrent set, and the usage it reports is every prompt token read
and every new token written; the server-side split of each set (from lathe serve's /metrics)
counts exactly the set's prompt tokens and decoded rows (in each of two rounds), and its prefill
mfu is the stated formula over the prefill seconds; a server that never answers is an error naming the URL."""
import json
import subprocess
import sys
from pathlib import Path

from test_serve import serve

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "serve_latency.py"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
          "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def test_times_the_long_and_the_concurrent_set(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with serve(tmp_path, "--random-weights", 3, "--max-seqs", 4, ctx=1024) as url:
        p = subprocess.run([sys.executable, SCRIPT, "--url", url, "--vocab", "512", "--long", "700",
                            "--short", "150", "--concurrent", "6", "--new", "9", "--wait", "30",
                            "--config", tmp_path / "config.json", "--gpus", "2", "--rounds", "2"],
                           capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["long"]["prompt_tokens"] == 700 and out["long"]["completion_tokens"] == 9
    c = out["concurrent"]
    assert c["requests"] == 6 and len(c["request_s"]) == 6 and not c["errors"]
    assert c["prompt_tokens"] == 6 * 150 and c["completion_tokens"] == 6 * 9
    assert 0 < max(c["request_s"]) <= c["wall_s"]
    # The server's split: each sequence's first token comes from its prefill, the other 8 from
    # decode steps (the concurrent set's six share steps: at most 4 run at once).
    long_split, split = out["long"]["server"], c["server"]
    assert long_split["prompt_tokens"] == 700 and long_split["decode_rows"] == 8
    assert long_split["decode_steps"] == 8
    assert split["prompt_tokens"] == 900 and split["decode_rows"] == 6 * 8
    assert 6 * 8 / 4 <= split["decode_steps"] <= 6 * 8
    for s, wall in ((long_split, out["long"]["wall_s"]), (split, c["wall_s"])):
        assert 0 < s["prefill_s"] <= wall and 0 < s["decode_s"] <= wall
        assert s["ms_per_decode_step"] == 1e3 * s["decode_s"] / s["decode_steps"]
    # Llama body: per layer q, k, v, o (64 -> 64, 32, 32; 64 -> 64) and gate, up, down (64 x 128).
    n_body = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
    flops = 2 * n_body * 700 + 2 * 512 * 64 + 2 * 2 * 4 * 16 * 700 * 701
    # The second round: the same sets again, split alike.
    assert len(out["again"]) == 1
    again = out["again"][0]
    assert again["long"]["server"]["prompt_tokens"] == 700
    assert again["concurrent"]["server"]["decode_rows"] == 6 * 8
    assert abs(long_split["prefill_mfu"] - flops / long_split["prefill_s"] / 2 / 989.4e12) \
        <= 1e-9 * long_split["prefill_mfu"]


def test_a_server_that_never_answers_is_named():
    p = subprocess.run([sys.executable, SCRIPT, "--url", "http://127.0.0.1:9", "--vocab", "512",
                        "--wait", "2"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "serve_latency: error: http://127.0.0.1:9/health" in p.stderr
