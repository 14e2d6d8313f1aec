"""What Megatron-LM's parsed and validated arguments must hold for a parallax plan, and how a
user reads parallax's Megatron-LM export: shared by the check against a Megatron-LM checkout
(megatron_args.py) and the one against the fixture taken from its parser (megatron_fixture.py).

    env, flags = megatron_expect.source(export_text)   # bash sources the export
    problems = megatron_expect.compare(args, plan)      # [] when the namespace is the plan's

The names are Megatron-LM d98e8a64's (megatron/training/arguments.py and the TransformerConfig
fields it turns into flags).
"""
import os
import subprocess
import tempfile

import plan_exports
import train_expect


# Layouts beyond plans.txt that both Megatron-LM checks export, with values of their own to
# check (NAME, `parallax plan` arguments, {dest: value}): the planner's first choices for
# the MoE models, an uneven split Megatron takes as first/last stage counts, and FP8 under each
# recipe (FP8 parameters under the distributed optimizer and under Megatron FSDP).
EXTRA = [
    ("deepseek-v3-split",
     "--model deepseek-v3 --cluster dgx-h100 --gpus 1024 --gbs 4096 --seq 4096 --tp 2 --sp --cp 1 "
     "--pp-layers 7,8,8,8,8,8,8,6 --ep 64 --etp 1 --zero 1 --mbs 1 --recompute full --vpp 1 "
     "--overlap-ep --allow-cross-node-tp",
     {"moe_router_score_function": "sigmoid", "moe_token_dispatcher_type": "alltoall",
      "moe_grouped_gemm": True, "moe_shared_expert_overlap": True,
      "decoder_first_pipeline_num_layers": 7, "decoder_last_pipeline_num_layers": 6}),
    ("qwen3-moe-1f1b",
     "--model qwen3-30b-a3b --cluster dgx-h100 --gpus 64 --gbs 512 --seq 4096 --tp 1 --cp 1 --pp 2 "
     "--ep 8 --etp 1 --zero 1 --mbs 1 --recompute none --vpp 1 --schedule 1f1b",
     {"moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True}),
    ("deepseek-v3-planned",
     "--model deepseek-v3 --cluster dgx-h100 --gpus 1024 --gbs 1024 --seq 4096 --tp 4 --sp --cp 2 "
     "--pp 1 --ep 256 --etp 1 --zero 1 --mbs 1 --recompute none --vpp 1", {}),
    ("qwen3-235b-a22b-planned",
     "--model qwen3-235b-a22b --cluster dgx-h100 --gpus 256 --gbs 1024 --seq 4096 --tp 1 --cp 2 "
     "--pp 16 --pp-layers 5,6,6,6,6,6,6,6,6,6,6,6,6,6,6,5 --ep 8 --etp 1 --zero 1 --mbs 1 "
     "--recompute none --vpp 1",
     {"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 5}),
    ("llama3-8b-fp8-blockwise",
     "--model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 128 --seq 8192 --precision fp8 "
     "--fp8-recipe blockwise --fp8-param-gather --tp 2 --sp --pp 1 --cp 1 --zero 1 --mbs 1 "
     "--recompute none --vpp 1", {}),
    ("llama3-70b-fp8-delayed",
     "--model llama3-70b --cluster dgx-h100 --gpus 64 --gbs 128 --seq 8192 --precision fp8 "
     "--fp8-format e4m3 --fp8-amax-history 256 --tp 4 --sp --pp 8 --cp 1 --zero 1 --mbs 1 "
     "--recompute full --vpp 5", {}),
    ("llama3-70b-fp8-params-fsdp",
     "--model llama3-70b --cluster dgx-h100 --gpus 64 --gbs 128 --seq 8192 --precision fp8 "
     "--fp8-param-gather --tp 8 --sp --pp 1 --cp 1 --zero 2 --mbs 1 --recompute selective --vpp 1",
     {}),
    ("llama3-8b-mxfp8-b200",
     "--model llama3-8b --cluster dgx-b200 --gpus 16 --gbs 128 --seq 8192 --precision fp8 "
     "--fp8-recipe mxfp8 --fp8-param-gather --tp 1 --pp 1 --cp 1 --zero 1 --mbs 2 "
     "--recompute none --vpp 1", {}),
]


def cases(parallax, tmp, only=None):
    """(name, plan, export text, {dest: value} of its own) for every plan of plans.txt, then
    of EXTRA; only: the names to keep (empty: all)."""
    for name, plan, text in plan_exports.each(parallax, "megatron", tmp, only):
        yield name, plan, text, {}
    for name, args, extra in EXTRA:
        if only and name not in only:
            continue
        path, plan = plan_exports.run_plan(parallax, name, args.split(), tmp)
        yield name, plan, plan_exports.export(parallax, path, "megatron"), extra


# Breakages the check must catch, each made to a good export: (plan, what is replaced, by what,
# a word of the rejection). Both checks run them before the plans: the fixture's, so that a
# parser built wrong (one that takes anything) fails instead of passing every export; the one
# with a checkout, so that Megatron-LM itself shows each rule the fixture check mirrors.
BREAKAGES = [
    ("llama3-8b-tp2-cp2", "    --seed 1234\n", "    --seed 1234\n    --no-such-flag\n", "unrecognized arguments"),
    ("llama3-8b-tp2-cp2", "--num-layers 32\n", "--num-layers 32.5\n", "invalid int value"),
    ("llama3-8b-tp2-cp2", "--normalization RMSNorm\n", "--normalization rmsnorm\n", "invalid choice"),
    ("llama3-8b-tp2-cp2", "export CUDA_DEVICE_MAX_CONNECTIONS=1\n", "", "CUDA_DEVICE_MAX_CONNECTIONS to 1"),
    ("llama3-8b-zero2", "    --ckpt-format fsdp_dtensor\n", "", "fsdp_dtensor"),
    ("llama3-8b-zero2", "unset CUDA_DEVICE_MAX_CONNECTIONS\n", "export CUDA_DEVICE_MAX_CONNECTIONS=1\n",
     "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"),
    ("llama3-8b-zero2", "unset CUDA_DEVICE_MAX_CONNECTIONS\n", "", "in a shell with CUDA_DEVICE_MAX_CONNECTIONS=1"),
    ("gpt3-175b-vpp", "--num-layers-per-virtual-pipeline-stage 4\n", "--num-layers-per-virtual-pipeline-stage 5\n",
     "must be divisible"),
    ("llama3-8b-fp8-delayed", "    --use-distributed-optimizer\n", "", "--fp8-param-gather only supported"),
    ("deepseek-v3-moe", "|t*3mL'", "|t*3L'", "mtp layers"),
    ("deepseek-v3-moe", "    --pipeline-model-parallel-layout", "    --pipeline-model-parallel-layout-none",
     "unrecognized arguments"),
    ("gpt3-13b-pp2-sel", "    --seed 1234\n", "    --seed 1234\n    --no-overlap-p2p-communication\n",
     "should be greater than 2"),
    ("llama3-8b-tp2-cp2", "--vocab-size 128256\n", "--vocab-size 128000\n", "vocab"),
    ("llama2-13b-emb-loss", "    --account-for-embedding-in-pipeline-split\n", "", "layers per pipeline stage"),
    ("llama3-8b-first-last", "--decoder-first-pipeline-num-layers 6\n", "--decoder-first-pipeline-num-layers 8\n",
     "layers per pipeline stage"),
    ("llama3-8b-cp4-a2a", "--cp-comm-type a2a\n", "--cp-comm-type allgather\n", "cp_comm_type"),
]


def self_check(check, parallax, tmp):
    """Runs check(name, plan, broken export text) -> [problems] on every breakage; returns
    what did not fail with its word."""
    exports = {n: (p, t) for n, p, t, _ in cases(parallax, tmp, {b[0] for b in BREAKAGES})}
    missed = []
    for name, old, new, word in BREAKAGES:
        plan, text = exports[name]
        if old not in text:
            missed.append(f"{name}: the export has no {old.strip()!r} to break")
            continue
        problems = check(name, plan, text.replace(old, new, 1))
        if not any(word in p for p in problems):
            missed.append(f"{name} with {old.strip()!r} -> {new.strip()!r}: expected a failure "
                          f"naming {word!r}, got {problems or 'none'}")
    return missed


def source(text):
    """Sources the export in a clean bash, as a user would: returns (the environment the export
    changes, {name: value, or None where it unsets the name}, and its MEGATRON_ARGS array).
    Raises ValueError with bash's words when it does not source or sets no MEGATRON_ARGS
    array. CUDA_DEVICE_MAX_CONNECTIONS starts out set (to a marker) so that an unset shows."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(text)
        path = f.name
    probe = ("env -0; printf '\\1'; source \"$1\" || exit; "
             "declare -p MEGATRON_ARGS 2>/dev/null | grep -q '^declare -a' || "
             "{ echo 'the export sets no MEGATRON_ARGS array' >&2; exit 3; }; "
             "env -0; printf '\\1'; printf '%s\\0' \"${MEGATRON_ARGS[@]}\"")
    marker = "parallax-marker"
    try:
        r = subprocess.run(["env", "-i", "PATH=" + os.environ.get("PATH", "/usr/bin:/bin"),
                            "CUDA_DEVICE_MAX_CONNECTIONS=" + marker,
                            "bash", "--noprofile", "--norc", "-c", probe, "bash", path],
                           capture_output=True)
    finally:
        os.unlink(path)
    if r.returncode != 0 or r.stderr.strip():
        raise ValueError("bash cannot source the export: " +
                         (r.stderr.decode(errors="replace").strip() or f"exit {r.returncode}"))
    before, after, args = r.stdout.split(b"\1")

    def variables(block):
        return dict(item.decode().partition("=")[::2] for item in block.split(b"\0") if item)

    env0, env1 = variables(before), variables(after)
    env = {k: v for k, v in env1.items() if env0.get(k) != v and k != "_"}
    env.update({k: None for k in env0 if k not in env1})
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS", "") == marker:
        del env["CUDA_DEVICE_MAX_CONNECTIONS"]
    flags = [a.decode() for a in args.split(b"\0")[:-1]]
    return env, flags


def apply_env(env, before=None):
    """Puts the export's environment into os.environ (validate_args reads it there), over a
    shell whose CUDA_DEVICE_MAX_CONNECTIONS was `before` (None: not set) until it sourced the
    export: a user may have set it for another job."""
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if before is not None:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = before
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def device_arch(plan):
    """The compute capability's major version of the plan's device, as
    megatron.training.utils.get_device_arch_version returns it: 8 Ampere, 9 Hopper, 10
    Blackwell."""
    name = plan["profile"]["device"]["name"]
    for prefix, arch in (("a100", 8), ("h100", 9), ("h200", 9), ("b200", 10), ("gb200", 10)):
        if name.startswith(prefix):
            return arch
    raise ValueError(f"no compute capability known for the plan's device {name!r}")


def moe_layers(model):
    """Which layers are MoE: 1 or 0 per layer (parallax's model_layer_is_moe)."""
    moe = model.get("moe") or {}
    if not moe.get("experts"):
        return None
    first, freq = moe.get("first_dense", 0), max(moe.get("layer_freq", 1), 1)
    return [int(i >= first and (i - first + 1) % freq == 0) for i in range(model["layers"])]


def stage_layers(args):
    """The decoder layers on each virtual pipeline stage (pp x vpp of them, virtual stage
    j * pp + rank) as Megatron-Core places them for these arguments: the 't' of each stage of
    --pipeline-model-parallel-layout; else --decoder-first/last-pipeline-num-layers with the
    rest even, or the layers with the embedding and/or the loss counted
    (--account-for-*-in-pipeline-split), each rank's divided over its chunks
    (get_num_layers_to_build); else an even split."""
    pp, n = args.pipeline_model_parallel_size, args.num_layers
    layout = getattr(args, "pipeline_model_parallel_layout", None)
    if layout:
        return [stage.count("t") for stage in parse_layout(layout)]
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None) or 1
    first = args.decoder_first_pipeline_num_layers
    last = args.decoder_last_pipeline_num_layers
    embed = bool(getattr(args, "account_for_embedding_in_pipeline_split", False))
    loss = bool(getattr(args, "account_for_loss_in_pipeline_split", False))
    if first is None and last is None:
        per_rank = [(n + embed + loss) // pp] * pp
    else:
        middle = pp - (first is not None) - (last is not None)
        rest = n - (first or 0) - (last or 0)
        each = rest // middle if middle else 0
        per_rank = ([first] if first is not None else []) + [each] * middle + \
            ([last] if last is not None else [])
    out = [per_rank[g % pp] // vpp for g in range(pp * vpp)]
    out[0] -= embed
    out[-1] -= loss
    return out


def parse_layout(text):
    """A --pipeline-model-parallel-layout string as a list of stages, each a list of layer
    symbols, as PipelineParallelLayerLayout.parse_str_to_list unrolls it (commas cosmetic,
    (...)*n and x*n repeated)."""
    import re
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return [list(stage) for stage in text.split("|")]


CP_COMM = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a"}


def expected(plan):
    """{dest: value} that the validated arguments must hold for the plan."""
    m, lay, t = plan["model"], plan["layout"], plan["training"]
    tr = train_expect.expected(plan)
    tp, pp, cp, vpp, zero = lay["tp"], lay["pp"], lay["cp"], lay["vpp"], lay["zero"]
    rope = m["position"] == "rope"
    want = {
        "num_layers": m["layers"], "hidden_size": m["hidden"],
        "ffn_hidden_size": m["ffn_hidden"], "num_attention_heads": m["heads"],
        "kv_channels": m["head_dim"],
        "group_query_attention": m["kv_heads"] != m["heads"],
        "seq_length": t["seq_len"],
        "max_position_embeddings": t["seq_len"] if rope else m["seq_len"],
        "normalization": "RMSNorm" if m["norm"] == "rmsnorm" else "LayerNorm",
        "layernorm_epsilon": m["norm_eps"],
        "swiglu": m["mlp"] == "swiglu",
        "position_embedding_type": "rope" if rope else "learned_absolute",
        "untie_embeddings_and_output_weights": not m["tied_embeddings"],
        "add_bias_linear": m["bias"], "add_qkv_bias": m["bias"] or m["qkv_bias"],
        "qk_layernorm": bool(m.get("qk_norm")),
        "tokenizer_type": "NullTokenizer", "vocab_size": m["vocab"],
        "make_vocab_size_divisible_by": t["pad_vocab"],
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "context_parallel_size": cp,
        # parallax's allgather is Megatron-Core's all_gather; p2p is the default, left unsaid
        "cp_comm_type": [CP_COMM.get(lay.get("cp_comm_type", "p2p"))],
        "virtual_pipeline_model_parallel_size": vpp if vpp > 1 else None,
        # validate_args turns sequence parallelism off at tp 1
        "sequence_parallel": bool(lay["sp"]) and tp > 1,
        "data_parallel_size": lay["dp"],
        # Megatron FSDP (v1) runs on the distributed optimizer: validate_args sets it
        "use_distributed_optimizer": zero >= 1, "use_megatron_fsdp": zero >= 2,
        "micro_batch_size": t["micro_batch"], "global_batch_size": t["global_batch"],
        "bf16": t["precision"] == "bf16", "fp16": t["precision"] == "fp16",
        "train_iters": tr["iters"], "lr": tr["lr"], "min_lr": tr["min_lr"],
        "lr_warmup_iters": tr["warmup"], "lr_decay_iters": tr["decay_iters"],
        "lr_decay_style": "WSD" if tr["wsd"] else "cosine",
        "lr_wsd_decay_iters": tr["wsd_iters"] if tr["wsd"] else None,
        "weight_decay": t["weight_decay"],
        "clip_grad": t["grad_clip"], "seed": t["seed"],
        "attention_dropout": t["dropout"], "hidden_dropout": t["dropout"],
        "recompute_granularity": None if lay["recompute"] == "none" else lay["recompute"],
    }
    if m["kv_heads"] != m["heads"]:
        want["num_query_groups"] = m["kv_heads"]
    if rope:
        want["rotary_base"] = int(m["rope_theta"])
        # Llama 3.1's scaling, as Megatron-Core fixes its frequency factors and 8192 context
        rs = m.get("rope_scaling") or {}
        llama31 = (rs.get("rope_type") == "llama3" and rs.get("low_freq_factor") == 1
                   and rs.get("high_freq_factor") == 4
                   and rs.get("original_max_position_embeddings") == 8192)
        want["use_rope_scaling"] = llama31
        if llama31:
            want["rope_scaling_factor"] = rs["factor"]
    if zero >= 2:
        want["data_parallel_sharding_strategy"] = "optim_grads" if zero == 2 else "optim_grads_params"
        want["ckpt_format"] = "fsdp_dtensor"
    # HSDP as the distributed optimizer's instances; buckets in parameters; offload
    want["num_distributed_optimizer_instances"] = lay.get("dp_replicate", 1)
    if lay.get("bucket_bytes"):
        width = 4 if t["precision"] == "fp32" else 2
        want["ddp_bucket_size"] = int(lay["bucket_bytes"] // width)
    off = bool(lay.get("offload_optimizer"))
    want.update(optimizer_cpu_offload=off)
    if off:
        want.update(optimizer_offload_fraction=1.0, use_precision_aware_optimizer=True)
    if lay["recompute"] == "full":
        want.update(recompute_method="uniform", recompute_num_layers=1)
    if t["optimizer"] in ("adam", "adamw", "adam8bit"):
        want.update(optimizer="adam", adam_beta1=t["beta1"], adam_beta2=t["beta2"],
                    adam_eps=t["eps"])
    recipe = t.get("fp8_recipe")
    if recipe:
        want.update(fp8=t["fp8_format"], fp8_recipe=recipe,
                    fp8_param_gather=bool(t["fp8_param_gather"]) and zero >= 1)
        if recipe == "delayed":
            want.update(fp8_amax_history_len=t["fp8_amax_history"], fp8_amax_compute_algo="max")
    else:
        want["fp8"] = None
    moe = m.get("moe") or {}
    if moe.get("experts"):
        want.update(num_experts=moe["experts"], moe_router_topk=moe["topk"],
                    moe_ffn_hidden_size=moe["expert_ffn"], moe_layer_freq=moe_layers(m),
                    expert_model_parallel_size=lay["ep"],
                    expert_tensor_parallel_size=lay["etp"],
                    moe_router_score_function=moe["score"],
                    moe_token_dispatcher_type=t.get("moe_dispatcher", "alltoall"))
        if t.get("moe_dispatcher") == "flex":  # on DeepEP's kernels
            want["moe_flex_dispatcher_backend"] = "deepep"
        if moe.get("shared_ffn"):
            want["moe_shared_expert_intermediate_size"] = moe["shared_ffn"]
        if moe.get("groups"):
            want.update(moe_router_num_groups=moe["groups"],
                        moe_router_group_topk=moe["topk_groups"])
    else:
        want["num_experts"] = None
    mla = m.get("mla") or {}
    if mla.get("kv_lora_rank"):
        want.update(multi_latent_attention=True, kv_lora_rank=mla["kv_lora_rank"],
                    qk_head_dim=mla["qk_nope_dim"], qk_pos_emb_head_dim=mla["qk_rope_dim"],
                    v_head_dim=mla["v_dim"])
        if mla.get("q_lora_rank"):
            want["q_lora_rank"] = mla["q_lora_rank"]
    if m.get("mtp_layers"):
        want["mtp_num_layers"] = m["mtp_layers"]
    return want


def compare(args, plan, extra=None):
    """Every way the namespace differs from the plan (and from extra, {dest: value}), as
    'args.X = got, expected want'."""
    out = []
    for key, want in {**expected(plan), **(extra or {})}.items():
        got = getattr(args, key, "<no such argument>")
        if isinstance(want, float) or isinstance(got, float):
            same = isinstance(got, (int, float)) and abs(got - want) <= 1e-12 * max(1, abs(want))
        else:
            same = got == want
        if not same:
            out.append(f"args.{key} = {got!r}, expected {want!r}")
    lay = plan["layout"]
    chunks = lay["pp"] * lay["vpp"]
    want_split = lay.get("stage_layers") or [plan["model"]["layers"] // chunks] * chunks
    if len(want_split) != chunks:  # one entry per stage (vpp 1)
        want_split = [want_split[g % lay["pp"]] for g in range(chunks)]
    try:
        got_split = stage_layers(args)
    except (AttributeError, TypeError, ZeroDivisionError) as e:
        got_split = f"<{e}>"
    if got_split != want_split:
        out.append(f"layers per pipeline stage {got_split}, expected {want_split}")
    return out
