"""transformers 5 and parallax read the same Hugging Face configs alike.

For each config: transformers' AutoConfig loads it and AutoModelForCausalLM.from_config builds the
model on the meta device (shapes, no memory); `parallax simulate --json` describes the model
parallax imports from the same file, and `parallax plan` plans it with the default sequence.
They must agree exactly: the parameter count, the architecture, the rotary base and Llama 3.1's
rope scaling (type, factor, frequency factors, original context), and the planning sequence must
be that original context (the pre-training length), said on stderr, not max_position_embeddings.

Configs: tests/clients/llama31-8b.config.json (Llama-3.1-8B in transformers 4's form, rope_theta
and rope_scaling at the top level), tests/clients/llama31-8b.t5.config.json (the same saved by
transformers 5.24.0: rope_parameters), and transformers 4 configs of Llama-3-8B (no scaling) and
Qwen3-30B-A3B (experts, q/k norms) from tests/clients/bridge-hf; each transformers 4 config is also
saved by this transformers (save_pretrained writes its own form) and read back by both.

    python tests/clients/transformers_check.py build/parallax

Prints one verdict a config and exits 1 when any differs or parallax refuses one, 0 when all agree.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [
    ("llama31-8b (transformers 4)", os.path.join(HERE, "llama31-8b.config.json")),
    ("llama31-8b (transformers 5)", os.path.join(HERE, "llama31-8b.t5.config.json")),
    ("llama3-8b (transformers 4)", os.path.join(HERE, "bridge-hf", "meta-llama--Meta-Llama-3-8B.json")),
    ("qwen3-30b-a3b (transformers 4)", os.path.join(HERE, "bridge-hf", "Qwen--Qwen3-30B-A3B.json")),
]


def parallax_model(parallax, path):
    """The model parallax imports from path (simulate --json), the note it printed, and the
    sequence `plan` takes when none is given."""
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    common = ["--model", path, "--cluster", "dgx-h100", "--gpus", "8", "--mbs", "1", "--gbs", "8"]
    sim = subprocess.run([parallax, "simulate", *common, "--tp", "1", "--pp", "1", "--json"], check=True,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        subprocess.run([parallax, "plan", *common, "--top", "1", "-o", out], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            plan_seq = json.load(f)["training"]["seq_len"]
    return json.loads(sim.stdout)["model"], sim.stderr, plan_seq


def hf_model(path):
    """transformers' config and the parameter count of the model it builds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, os.path.join(d, "config.json"))
        cfg = AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return cfg, sum(p.numel() for p in model.parameters())


def compare(parallax, path):
    cfg, params = hf_model(path)
    m, note, plan_seq = parallax_model(parallax, path)
    rp = dict(cfg.rope_parameters)  # transformers 5 reads both forms into rope_parameters
    scaled = rp.get("rope_type", "default") != "default"
    want = [
        ("parameters", params, m["params"]),
        ("layers", cfg.num_hidden_layers, m["layers"]),
        ("hidden", cfg.hidden_size, m["hidden"]),
        ("heads", cfg.num_attention_heads, m["heads"]),
        ("kv_heads", cfg.num_key_value_heads, m["kv_heads"]),
        ("head_dim", getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads, m["head_dim"]),
        ("vocab", cfg.vocab_size, m["vocab"]),
        ("norm_eps", cfg.rms_norm_eps, m["norm_eps"]),
        ("tied_embeddings", bool(cfg.tie_word_embeddings), m["tied_embeddings"]),
        ("rope_theta", rp["rope_theta"], m["rope_theta"]),
        ("rope scaling", rp.get("rope_type") if scaled else None,
         m["rope_scaling"]["rope_type"] if "rope_scaling" in m else None),
    ]
    if scaled:
        rs = m.get("rope_scaling", {})
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            want.append((f"rope_scaling.{key}", rp[key], rs.get(key)))
        original = rp["original_max_position_embeddings"]
        want += [("planning sequence (the pre-training length)", original, m["seq_len"]),
                 ("plan's default sequence", original, plan_seq),
                 ("note on stderr", True,
                  f"planning sequence {original} from " in note
                  and f"max_position_embeddings {cfg.max_position_embeddings}" in note)]
    else:
        want += [("planning sequence", cfg.max_position_embeddings, m["seq_len"]),
                 ("plan's default sequence", cfg.max_position_embeddings, plan_seq),
                 ("no note on stderr", False, "planning sequence" in note)]
    if getattr(cfg, "num_experts", None):
        moe = m.get("moe", {})
        want += [("experts", cfg.num_experts, moe.get("experts")),
                 ("topk", cfg.num_experts_per_tok, moe.get("topk")),
                 ("expert_ffn", cfg.moe_intermediate_size, moe.get("expert_ffn"))]
    bad = [f"{what}: transformers {w!r}, parallax {got!r}" for what, w, got in want if w != got]
    return bad, params, rp


def main():
    if len(sys.argv) != 2:
        print("usage: transformers_check.py PARALLAX", file=sys.stderr)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    import transformers
    from transformers import AutoConfig

    failed = 0
    with tempfile.TemporaryDirectory(prefix="px_hf_") as tmp:
        configs = list(CONFIGS)
        # each transformers 4 config as this transformers writes it
        for name, path in CONFIGS:
            if "transformers 4" not in name:
                continue
            d = os.path.join(tmp, os.path.basename(path))
            os.makedirs(d)
            shutil.copy(path, os.path.join(d, "config.json"))
            AutoConfig.from_pretrained(d).save_pretrained(os.path.join(d, "saved"))
            configs.append((name.replace("transformers 4", f"saved by transformers {transformers.__version__}"),
                            os.path.join(d, "saved", "config.json")))
        for name, path in configs:
            try:
                bad, params, rp = compare(parallax, path)
            except subprocess.CalledProcessError as exc:
                failed += 1
                print(f"{name:44s} REFUSED  parallax {exc.cmd[1]}: {exc.stderr.strip()[-300:]}", flush=True)
                continue
            failed += bool(bad)
            detail = "; ".join(bad) if bad else f"{params} parameters, {rp.get('rope_type')} rope, base {rp['rope_theta']:g}"
            print(f"{name:44s} {'DIFFERS' if bad else 'AGREES':8s} {detail}", flush=True)
    print(f"transformers {transformers.__version__}: {len(configs) - failed}/{len(configs)} configs read alike")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
