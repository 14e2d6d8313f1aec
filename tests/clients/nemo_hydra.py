#!/usr/bin/env python3
"""Checks parallax's NeMo 1.x export with Hydra, as megatron_gpt_pretraining.py composes it.

Usage: PYTHON tests/clients/nemo_hydra.py PARALLAX [NAME...]

For every plan of tests/clients/plans.txt it exports the plan with `parallax export --format
nemo`, takes the NeMo 1.x overrides (the lines before the Megatron-Bridge part), and composes
NeMo's megatron_gpt_config.yaml with them through Hydra's own override parser and compose() in
struct mode (a key the yaml lacks must come with '+', or Hydra refuses it, as NeMo's
@hydra_runner would), once for each fixture: tests/clients/nemo-8cfedd72 (the file as NeMo
8cfedd72 ships it, which parallax's overrides are written for) and tests/clients/nemo-1.23.0
(the last NeMo 1.x release). The composed trainer.* and model.* values, resolved with NeMo's
resolvers, are compared with the plan, architecture included; NeMo 8cfedd72's own check of an
uneven pipeline split (MegatronGPTModel.build_transformer_config) is applied too, and a split
the export says is NOT EXPRESSIBLE is reported as such. One line per plan and fixture: "ok" or
"FAILED" with Hydra's words or the values that differ; exit 1 when any failed. First it breaks
good exports in the ways of BREAKAGES and requires each to be caught. NAMEs limit the plans.

The Python is scripts/clients.sh nemo's (hydra-core 1.3.2, omegaconf 2.3.0: what NeMo 1.23.0
asks for). No part of NeMo itself is imported; the fixtures say where they come from.
"""
import math
import os
import shlex
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the helpers below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_exports  # noqa: E402
import train_expect  # noqa: E402

FIXTURES = ["nemo-8cfedd72", "nemo-1.23.0"]


def overrides(text):
    """The NeMo 1.x override tokens of an export: every word of the lines before the
    Megatron-Bridge part that are not comments."""
    part = text.split("\n# Megatron-Bridge", 1)[0]
    words = []
    for line in part.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            words += shlex.split(line)
    return words


def expected(plan):
    """{dotted key: value} the composed configuration must hold for the plan."""
    m, lay, t = plan["model"], plan["layout"], plan["training"]
    tr = train_expect.expected(plan)
    per_node = min(plan["profile"]["node"]["devices"] or plan["gpus"], plan["gpus"])
    rope = m["position"] == "rope"
    prec = t["precision"]
    want = {
        "trainer.devices": per_node,
        "trainer.num_nodes": math.ceil(plan["gpus"] / per_node),
        "trainer.precision": {"bf16": "bf16-mixed", "fp16": "16-mixed"}.get(prec, "32"),
        "trainer.max_steps": tr["iters"],
        "model.mcore_gpt": True,
        "model.megatron_amp_O2": prec in ("bf16", "fp16"),
        "model.tensor_model_parallel_size": lay["tp"],
        "model.pipeline_model_parallel_size": lay["pp"],
        "model.virtual_pipeline_model_parallel_size": lay["vpp"] if lay["vpp"] > 1 else None,
        "model.context_parallel_size": lay["cp"],
        # appended where not p2p (TransformerConfig's default), in Megatron-Core's spelling
        "model.cp_comm_type": {"p2p": "<absent>", "allgather": "all_gather", "a2a": "a2a"}[
            lay.get("cp_comm_type", "p2p") if lay["cp"] > 1 else "p2p"],
        "model.sequence_parallel": bool(lay["sp"]),
        "model.micro_batch_size": t["micro_batch"],
        "model.global_batch_size": t["global_batch"],
        "model.encoder_seq_length": t["seq_len"],
        "model.max_position_embeddings": t["seq_len"] if rope else m["seq_len"],
        "model.num_layers": m["layers"], "model.hidden_size": m["hidden"],
        "model.ffn_hidden_size": m["ffn_hidden"], "model.num_attention_heads": m["heads"],
        "model.num_query_groups": m["kv_heads"], "model.kv_channels": m["head_dim"],
        "model.normalization": "rmsnorm" if m["norm"] == "rmsnorm" else "layernorm",
        "model.layernorm_epsilon": m["norm_eps"],
        # NeMo's own Llama config (megatron_llama_config.yaml) names SwiGLU fast-swiglu
        "model.activation": "fast-swiglu" if m["mlp"] == "swiglu" else "gelu",
        "model.bias": bool(m["bias"]),
        "model.position_embedding_type": "rope" if rope else "learned_absolute",
        "model.share_embeddings_and_output_weights": bool(m["tied_embeddings"]),
        "model.make_vocab_size_divisible_by": t["pad_vocab"],
        "model.activations_checkpoint_granularity":
            None if lay["recompute"] == "none" else lay["recompute"],
        "model.optim.name": "distributed_fused_adam" if lay["zero"] >= 1 else "fused_adam",
        "model.optim.lr": tr["lr"], "model.optim.weight_decay": t["weight_decay"],
        "model.optim.betas": [t["beta1"], t["beta2"]],
        "model.optim.sched.name": "CosineAnnealing",
        "model.optim.sched.warmup_steps": tr["warmup"],
        "model.optim.sched.constant_steps": max(tr["iters"] - tr["decay_iters"], 0),
        "model.optim.sched.max_steps": tr["decay_iters"] if tr["decay_iters"] > tr["iters"] else "<absent>",
        "model.optim.sched.min_lr": tr["min_lr"],
        "model.use_flash_attention": bool(t["flash_attn"]),
        "model.hidden_dropout": t["dropout"], "model.attention_dropout": t["dropout"],
    }
    if rope:
        want["model.rotary_base"] = m["rope_theta"]
    if not m["bias"] and m["qkv_bias"]:
        want["model.qkv_bias"] = True
    if m.get("qk_norm"):
        want["model.qk_layernorm"] = True
    if lay["recompute"] == "full":
        want.update({"model.activations_checkpoint_method": "uniform",
                     "model.activations_checkpoint_num_layers": 1})
    split = lay.get("stage_layers")
    if split and len(split) == lay["pp"]:  # with chunks (vpp > 1) the export says NOT EXPRESSIBLE
        inner = split[1:-1]
        if len(split) == 2 or len(set(inner)) == 1:
            if len(split) == 2 or split[0] != inner[0]:
                want["model.num_layers_in_first_pipeline_stage"] = split[0]
            if len(split) == 2 or split[-1] != inner[0]:
                want["model.num_layers_in_last_pipeline_stage"] = split[-1]
    moe = m.get("moe") or {}
    if moe.get("experts"):
        want.update({
            "model.num_moe_experts": moe["experts"], "model.moe_router_topk": moe["topk"],
            "model.expert_model_parallel_size": lay["ep"],
            "model.expert_tensor_parallel_size": lay["etp"],
            "model.moe_ffn_hidden_size": moe["expert_ffn"],
            "model.moe_router_score_function": moe["score"],
            "model.moe_router_load_balancing_type": "aux_loss" if moe["aux_loss_coeff"] > 0 else "none",
            "model.moe_aux_loss_coeff": moe["aux_loss_coeff"],
            "model.moe_token_dispatcher_type": t.get("moe_dispatcher", "alltoall"),
            "model.moe_grouped_gemm": True,
        })
        if t.get("moe_dispatcher") == "flex":  # on DeepEP's kernels
            want["model.moe_enable_deepep"] = True
        if moe.get("shared_ffn"):
            want["model.moe_shared_expert_intermediate_size"] = moe["shared_ffn"]
        if moe.get("groups"):
            want["model.moe_router_num_groups"] = moe["groups"]
            want["model.moe_router_group_topk"] = moe["topk_groups"]
        first, freq = moe.get("first_dense", 0), max(moe.get("layer_freq", 1), 1)
        if first or freq > 1:
            want["model.moe_layer_freq"] = [int(i >= first and (i - first + 1) % freq == 0)
                                            for i in range(m["layers"])]
    mla = m.get("mla") or {}
    if mla.get("kv_lora_rank"):
        want.update({"model.multi_latent_attention": True,
                     "model.kv_lora_rank": mla["kv_lora_rank"],
                     "model.qk_head_dim": mla["qk_nope_dim"],
                     "model.qk_pos_emb_head_dim": mla["qk_rope_dim"],
                     "model.v_head_dim": mla["v_dim"]})
        if mla.get("q_lora_rank"):
            want["model.q_lora_rank"] = mla["q_lora_rank"]
    # the layer spec that builds QK norms, MLA and a dense/MoE layer pattern (NeMo's get_specs)
    if (m.get("qk_norm") or mla.get("kv_lora_rank") or "model.moe_layer_freq" in want):
        want["model.name"] = "decoder_block_gpt"
    recipe = t.get("fp8_recipe")
    if recipe:
        e4m3 = t["fp8_format"] == "e4m3"
        want.update({"model.transformer_engine": True, "model.fp8": True,
                     "model.fp8_e4m3": e4m3, "model.fp8_hybrid": not e4m3})
        if recipe == "delayed":
            want["model.fp8_amax_history_len"] = t["fp8_amax_history"]
            want["model.fp8_amax_compute_algo"] = "max"
            if t["fp8_param_gather"] and lay["zero"] >= 1:
                want["model.fp8_params"] = True
        else:
            want["model.fp8_recipe"] = recipe
    else:
        want["model.fp8"] = False
    return want


def nemo_split_check(model):
    """MegatronGPTModel.build_transformer_config (NeMo 8cfedd72, nemo/collections/nlp/models/
    language_modeling/megatron_gpt_model.py): the layers left after the first and last stage's
    must divide among the other stages."""
    first = model.get("num_layers_in_first_pipeline_stage")
    last = model.get("num_layers_in_last_pipeline_stage")
    rest, stages = model["num_layers"], model.get("pipeline_model_parallel_size", 1)
    for n in (first, last):
        if n is not None:
            rest, stages = rest - n, stages - 1
    if stages and rest % stages:
        return (f"num_layers ({model['num_layers']}) minus num_layers_in_first_pipeline_stage "
                f"({first}) and num_layers_in_last_pipeline_stage ({last}) should be divisible by "
                f"remaining pipeline stages ({stages}).")
    return None


def lookup(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "<absent>"
        node = node[part]
    return node


def same(got, want):
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and \
            abs(got - want) <= 1e-12 * max(1.0, abs(want))
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want if isinstance(want, bool) else got == want


def compose(config_dir, words):
    """The composed configuration as a plain dict, resolved; raises with Hydra's words."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = hydra_compose(config_name="megatron_gpt_config", overrides=words)
    if not OmegaConf.is_struct(cfg):
        raise RuntimeError("Hydra did not compose in struct mode")
    return OmegaConf.to_container(cfg.model, resolve=True), \
        OmegaConf.to_container(cfg.trainer, resolve=True)


SPLIT_SAID = "# NOT EXPRESSIBLE in NeMo 1.x: the uneven pipeline split"


def check_one(config_dir, plan, text):
    """(problems, said): what differs from the plan, and whether the export says the plan's
    pipeline split is not expressible (then NeMo's split check failing is what it said)."""
    words = overrides(text)
    try:
        model, trainer = compose(config_dir, words)
    except Exception as e:  # what Hydra says is the verdict
        return [f"{type(e).__name__}: {str(e).splitlines()[0]}"], False
    cfg = {"model": model, "trainer": trainer}
    problems = []
    for key, want in expected(plan).items():
        got = lookup(cfg, key)
        if not same(got, want):
            problems.append(f"{key} = {got!r}, expected {want!r}")
    why = nemo_split_check(model)
    said = bool(why) and SPLIT_SAID in text
    if why and not said:
        problems.append(why)
    return problems, said


# Breakages the check must catch, each made to a good export: (plan, what is replaced, by what,
# a word of the failure). Run first, on both fixtures, so that a check that passes anything
# fails instead.
BREAKAGES = [
    ("llama3-8b-tp2-cp2", "+model.context_parallel_size", "model.context_parallel_size", "Could not override"),
    ("llama3-8b-tp2-cp2", "+model.rotary_base=500000", "+model.rotary_base=10000", "model.rotary_base"),
    ("llama3-8b-tp2-cp2", "model.activation=fast-swiglu", "model.activation=gelu", "model.activation"),
    ("llama3-8b-tp2-cp2", "model.normalization=rmsnorm ", "", "model.normalization"),
    ("llama3-8b-tp2-cp2", "model.mcore_gpt=true ", "", "model.mcore_gpt"),
    ("qwen3-30b-a3b-moe", "++model.expert_model_parallel_size", "+model.expert_model_parallel_size",
     "Could not append"),
    ("qwen3-30b-a3b-moe", "++model.expert_model_parallel_size", "model.expert_model_parallel_size",
     "Could not override"),
    ("qwen3-30b-a3b-moe", "+model.qk_layernorm=true\n", "", "model.qk_layernorm"),
    ("gpt3-175b-vpp", "model.max_position_embeddings=2048", "model.max_position_embeddings=1024",
     "model.max_position_embeddings"),
    ("llama3-8b-fp8-delayed", " +model.fp8_params=true", "", "model.fp8_params"),
    ("llama3-8b-cp4-a2a", "+model.cp_comm_type=a2a", "+model.cp_comm_type=p2p", "model.cp_comm_type"),
]


def self_check(parallax, here, tmp):
    """Every breakage must fail, with its word, on at least one fixture; returns what did not."""
    names = {b[0] for b in BREAKAGES}
    exports = {n: (p, t) for n, p, t in plan_exports.each(parallax, "nemo", tmp, names)}
    missed = []
    for name, old, new, word in BREAKAGES:
        plan, text = exports[name]
        if old not in text:
            missed.append(f"{name}: the export has no {old.strip()!r} to break")
            continue
        caught = [f for f in FIXTURES if any(word in p for p in check_one(
            os.path.join(here, f), plan, text.replace(old, new, 1))[0])]
        if not caught:
            missed.append(f"{name} with {old.strip()!r} -> {new.strip()!r}: no fixture failed "
                          f"naming {word!r}")
    return missed


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    only = set(sys.argv[2:])
    try:
        from omegaconf import OmegaConf
    except ImportError as e:
        print(f"nemo_hydra: skipped: {e}; use the Python of scripts/clients.sh nemo")
        return 77
    # NeMo registers these before Hydra composes (nemo/core/config/hydra_runner.py, lines 48
    # and 51 at 8cfedd72 and at v1.23.0); the yaml's interpolations use them
    OmegaConf.register_new_resolver("multiply", lambda x, y: x * y, replace=True)
    OmegaConf.register_new_resolver("sum", lambda x, y: x + y, replace=True)
    here = os.path.dirname(os.path.abspath(__file__))
    verdicts = {f: [0, 0, 0] for f in FIXTURES}  # ok, said not expressible, all
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        missed = self_check(parallax, here, tmp)
        for m in missed:
            print(f"FAILED self-check: {m}")
        print(f"nemo_hydra: {len(BREAKAGES) - len(missed)}/{len(BREAKAGES)} broken exports caught")
        for name, plan, text in plan_exports.each(parallax, "nemo", tmp, only):
            for fixture in FIXTURES:
                problems, said = check_one(os.path.join(here, fixture), plan, text)
                verdicts[fixture][2] += 1
                if problems:
                    failed += 1
                    print(f"FAILED {name} [{fixture}]: " + "; ".join(problems))
                elif said:
                    verdicts[fixture][1] += 1
                    print(f"ok {name} [{fixture}]: composes; its pipeline split NOT EXPRESSIBLE, as the export says")
                else:
                    verdicts[fixture][0] += 1
                    print(f"ok {name} [{fixture}]")
    for fixture, (ok, said, total) in verdicts.items():
        print(f"nemo_hydra: {fixture}: {ok}/{total} exports compose into the plan's model"
              + (f", {said} more with a split the export says NeMo cannot take" if said else ""))
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
