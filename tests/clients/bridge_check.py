"""Megatron-Bridge reads `parallax export --format bridge` through its own run path.

For every plan of tests/clients/plans.txt: `parallax plan` writes the plan, `parallax export
--format bridge` its Megatron-Bridge section; then what scripts/training/run_recipe.py does with
it runs here, Megatron-Bridge's own code: the recipe the export names builds its ConfigContainer,
process_config_with_overrides applies the export's overrides (Hydra's parser), and
runtime_config_update resolves the mixed-precision recipe, sets the data-parallel size from
WORLD_SIZE (the plan's GPUs, as torchrun would) and runs ConfigContainer.validate(). The final
container's values are compared with the plan: layout, batch, sequence, optimizer, schedule,
precision and FP8, recompute, ZeRO and the model's architecture.

    python tests/clients/bridge_check.py build/parallax [--plans FILE] [PLAN_NAME ...]

Prints one verdict a plan and exits 1 when any plan is refused or differs, 0 when all pass.

Checked against Megatron-Bridge 0.6.2 with Megatron-Core 0.19.2 (tests/clients/bridge06.txt; the
final line prints the versions it ran). Bridge answers an override it cannot apply with a logged
warning and keeps the recipe's value, so a plan is accepted only when Bridge logs no warning; a
self-check first feeds it two such overrides (BREAKAGES) and fails unless both are caught.

What stands in for what needs a GPU or the network (each documented where it is made):
  - transformer_engine: Megatron-Bridge imports it unconditionally (peft/lora.py) and it loads
    CUDA libraries, so a stub module answers every attribute with an inert class and reports
    version 2.11.0 (within the pins of Megatron-Bridge 0.3.1 and 0.6.2). Nothing it
    stands for runs: no model is built. diffusers and modelopt, which 0.6's
    megatron.bridge.recipes imports for its diffusion and quantization recipes, are stubbed alike;
    typing.override (Python 3.12) is a no-op decorator on this 3.11.
  - torch.cuda.get_device_properties: the MoE recipes ask device 0 which token dispatcher it
    supports (training/flex_dispatcher_backend.py); it answers with the plan's device (compute
    capability and name of the cluster profile's GPU).
  - the Hugging Face hub: the recipes read their model's config.json from the hub
    (AutoBridge.from_hf_pretrained); tests/clients/bridge-hf holds those files for the recipes
    the plans use, placed as a hub cache with HF_HUB_OFFLINE=1.
"""

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import traceback
import types
import typing

import train_expect

HERE = os.path.dirname(os.path.abspath(__file__))
# Megatron-Core 0.19 imports typing.override (Python 3.12), a no-op decorator, on this 3.11
if not hasattr(typing, "override"):
    typing.override = lambda f: f
TE_VERSION = "2.11.0"
# Stubbed as inert modules (install_stubs): transformer_engine, and what Megatron-Bridge 0.6's
# megatron.bridge.recipes imports for recipes no plan uses: diffusers (the diffusion recipes) and
# modelopt (quantization and distillation).
STUBBED = {"transformer_engine", "diffusers", "modelopt"}


def install_te_stub():
    """transformer_engine as inert classes: importable, versioned, never run."""

    class Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Meta(name, (), {})

        def __call__(cls, *args, **kwargs):
            return Meta("instance", (), {})

    class Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = Meta(name, (), {})
            setattr(self, name, value)
            return value

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in STUBBED:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = Module(spec.name)
            module.__path__ = []
            if spec.name == "transformer_engine":
                module.__version__ = TE_VERSION
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


# Hub revisions Megatron-Bridge 0.6.2's recipes pin (recipes/qwen/h100/qwen3_moe.py)
PINNED = {"Qwen--Qwen3-30B-A3B": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"}


def install_hub(root):
    """tests/clients/bridge-hf/<org>--<name>.json as the hub cache's snapshot of org/name."""
    src = os.path.join(HERE, "bridge-hf")
    rev = "0" * 40
    for f in sorted(os.listdir(src)):
        if not f.endswith(".json"):
            continue
        repo = os.path.join(root, "models--" + f[: -len(".json")])
        os.makedirs(os.path.join(repo, "snapshots", rev))
        os.makedirs(os.path.join(repo, "refs"))
        shutil.copy(os.path.join(src, f), os.path.join(repo, "snapshots", rev, "config.json"))
        # a recipe that pins the config's revision (0.6's Qwen3-MoE ones) finds it there too
        pinned = PINNED.get(f[: -len(".json")])
        if pinned:
            os.makedirs(os.path.join(repo, "snapshots", pinned))
            shutil.copy(os.path.join(src, f), os.path.join(repo, "snapshots", pinned, "config.json"))
        with open(os.path.join(repo, "refs", "main"), "w") as out:
            out.write(rev)
    os.environ["HF_HUB_CACHE"] = root
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def read_plans(only, path=None):
    plans = []
    with open(path or os.path.join(HERE, "plans.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, args = line.split(None, 1)
            if only and name not in only:
                continue
            plans.append((name, shlex.split(args.replace("$CLIENTS", HERE))))
    return plans


def export(parallax, name, args, tmp):
    """The plan's JSON and its Megatron-Bridge section."""
    path = os.path.join(tmp, name + ".json")
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    subprocess.run([parallax, "plan", *args, "--top", "1", "-o", path], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    text = subprocess.run([parallax, "export", path, "--format", "bridge"], check=True, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout
    with open(path) as f:
        return json.load(f), text


def parse_export(text):
    """The recipe (`# recipe: NAME`) and the overrides: every word of every line that is not a
    comment, with the shell's quoting."""
    recipe, overrides = None, []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# recipe:"):
            recipe = s[len("# recipe:"):].split()[0]
        elif s and not s.startswith("#"):
            overrides += shlex.split(s)
    return recipe, overrides


def load_recipe(name):
    """run_recipe.py's lookup: a name megatron.bridge.recipes exports, or a dotted path to one it
    does not (called from a user's own script)."""
    import megatron.bridge.recipes as recipes

    if "." not in name:
        if not hasattr(recipes, name):
            raise AttributeError(f"Recipe '{name}' not found in megatron.bridge.recipes")
        return getattr(recipes, name)()
    module, fn = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), fn)()


# parallax's device profiles as CUDA would describe them: (major, minor, name)
DEVICES = {
    "a100-40gb": (8, 0, "NVIDIA A100-SXM4-40GB"),
    "a100-64gb": (8, 0, "NVIDIA A100-SXM-64GB"),
    "a100-80gb": (8, 0, "NVIDIA A100-SXM4-80GB"),
    "h100-sxm": (9, 0, "NVIDIA H100 80GB HBM3"),
    "h200": (9, 0, "NVIDIA H200"),
    "b200": (10, 0, "NVIDIA B200"),
    "gb200": (10, 0, "NVIDIA GB200"),
}


def stub_device(plan):
    """torch.cuda.get_device_properties answering with the plan's GPU."""
    import torch

    dev = plan["profile"]["device"]
    major, minor, name = DEVICES[dev["name"]]
    props = types.SimpleNamespace(major=major, minor=minor, name=name,
                                  total_memory=dev["memory_bytes"],
                                  multi_processor_count=dev["sm_count"])
    torch.cuda.get_device_properties = lambda device=None: props


class Warned(logging.Handler):
    """Every warning Megatron-Bridge and Megatron-Core log: Bridge answers an override it cannot
    apply (a key it does not have, a _target_ outside its allowlist) with a warning and goes on
    with the recipe's value, so a warning is a value of the plan dropped."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        if record.name.startswith("megatron"):
            self.messages.append(f"{record.name}: {record.getMessage()}"[:300])


def run_bridge(plan, recipe, overrides):
    """Megatron-Bridge's run path up to the training loop: recipe, overrides, runtime update;
    the warnings logged while the overrides and the runtime update run."""
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    stub_device(plan)
    os.environ["WORLD_SIZE"] = str(plan["gpus"])
    cfg = load_recipe(recipe)
    warned = Warned()
    logging.getLogger().addHandler(warned)
    try:
        cfg = process_config_with_overrides(cfg, cli_overrides=overrides)
        runtime_config_update(cfg)
    finally:
        logging.getLogger().removeHandler(warned)
    return cfg, warned.messages


def expected(plan):
    """(path, value) pairs the final ConfigContainer must hold, from the plan alone."""
    import torch

    m, l, t = plan["model"], plan["layout"], plan["training"]
    tr = train_expect.expected(plan)
    moe = m.get("moe")
    mla = m.get("mla")
    seq = t["seq_len"]
    e = [
        ("model.tensor_model_parallel_size", l["tp"]),
        ("model.pipeline_model_parallel_size", l["pp"]),
        ("model.virtual_pipeline_model_parallel_size", l["vpp"] if l["vpp"] > 1 else None),
        ("model.context_parallel_size", l["cp"]),
        ("model.sequence_parallel", bool(l["sp"])),
        ("data_parallel_size", l["dp"]),
        ("model.seq_length", seq),
        ("dataset.seq_length", seq),
        ("train.micro_batch_size", t["micro_batch"]),
        ("train.global_batch_size", t["global_batch"]),
        ("train.train_iters", tr["iters"]),
        ("optimizer.lr", tr["lr"]),
        ("optimizer.min_lr", tr["min_lr"]),
        ("optimizer.weight_decay", t["weight_decay"]),
        ("optimizer.clip_grad", t["grad_clip"]),
        ("scheduler.lr_warmup_iters", tr["warmup"]),
        ("scheduler.lr_decay_iters", tr["decay_iters"]),
        ("scheduler.lr_decay_style", "WSD" if tr["wsd"] else "cosine"),
        ("scheduler.lr_wsd_decay_iters", tr["wsd_iters"] if tr["wsd"] else None),
        ("rng.seed", t["seed"]),
        ("optimizer.use_distributed_optimizer", l["zero"] >= 1),
        ("ddp.use_distributed_optimizer", l["zero"] >= 1),
        ("ddp.use_megatron_fsdp", l["zero"] >= 2),
        ("ddp.overlap_grad_reduce", bool(l["overlap_dp"])),
        ("ddp.overlap_param_gather", bool(l["overlap_dp"]) and l["zero"] >= 1),
        ("model.tp_comm_overlap", bool(l["overlap_tp"])),
        ("model.hidden_dropout", t["dropout"]),
        ("model.attention_dropout", t["dropout"]),
    ]
    if t["optimizer"] == "sgd-momentum":
        e += [("optimizer.optimizer", "sgd"), ("optimizer.sgd_momentum", t["momentum"])]
    else:
        e += [("optimizer.optimizer", "adam"), ("optimizer.adam_beta1", t["beta1"]),
              ("optimizer.adam_beta2", t["beta2"]), ("optimizer.adam_eps", t["eps"])]
    e += [("ddp.num_distributed_optimizer_instances", l.get("dp_replicate", 1)),
          ("optimizer.optimizer_cpu_offload", bool(l.get("offload_optimizer"))),
          ("optimizer.use_precision_aware_optimizer", bool(l.get("offload_optimizer")))]
    if l["cp"] > 1:  # in Megatron-Core's spelling, always given: a recipe may set its own
        e.append(("model.cp_comm_type", {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a"}[
            l.get("cp_comm_type", "p2p")]))
    if l.get("bucket_bytes"):
        e.append(("ddp.bucket_size", int(l["bucket_bytes"] // (4 if t["precision"] == "fp32" else 2))))
    if l["zero"] >= 2:
        e += [("ddp.data_parallel_sharding_strategy",
               "optim_grads" if l["zero"] == 2 else "optim_grads_params"),
              ("checkpoint.ckpt_format", "fsdp_dtensor")]
    # recompute: Megatron-Core's selective recompute of the attention core is parallax's
    rc = l["recompute"]
    e += [("model.recompute_granularity", None if rc == "none" else rc),
          ("model.recompute_method", "uniform" if rc == "full" else None),
          ("model.recompute_num_layers", 1 if rc == "full" else None)]
    if rc == "selective":
        e.append(("model.recompute_modules", ["core_attn"]))
    # precision: the model's, the optimizer's and the gradient reduction's
    prec = t["precision"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prec]
    e += [("model.bf16", prec == "bf16"), ("model.fp16", prec == "fp16"),
          ("model.params_dtype", dtype), ("optimizer.bf16", prec == "bf16"),
          ("optimizer.fp16", prec == "fp16"),
          ("ddp.grad_reduce_in_fp32", t["grad_dtype"] == "fp32")]
    if l["pp"] > 1:
        e.append(("model.pipeline_dtype", dtype))
    fp8 = t.get("fp8_recipe", "none")
    if fp8 != "none":
        pg = bool(t.get("fp8_param_gather")) and l["zero"] >= 1
        e += [("model.fp8", t["fp8_format"]),
              ("model.fp8_recipe", {"delayed": "delayed", "tensorwise": "tensorwise",
                                    "blockwise": "blockwise", "mxfp8": "mxfp8"}[fp8]),
              ("model.fp8_param", pg),
              ("model.first_last_layers_bf16", False),
              ("model.fp8_dot_product_attention", bool(t.get("fp8_attention")))]
        if fp8 == "delayed":
            e += [("model.fp8_amax_history_len", t["fp8_amax_history"]),
                  ("model.fp8_amax_compute_algo", "max")]
    else:
        e.append(("model.fp8", None))
    # the architecture
    swiglu = m["mlp"] == "swiglu"
    e += [
        ("model.num_layers", m["layers"]),
        ("model.hidden_size", m["hidden"]),
        ("model.num_attention_heads", m["heads"]),
        ("model.vocab_size", t["vocab_padded"]),
        ("model.normalization", "RMSNorm" if m["norm"] == "rmsnorm" else "LayerNorm"),
        ("model.layernorm_epsilon", m["norm_eps"]),
        ("model.gated_linear_unit", swiglu),
        ("activation", "silu" if swiglu else "gelu"),
        ("model.position_embedding_type", "rope" if m["position"] == "rope" else "learned_absolute"),
        ("model.add_bias_linear", bool(m["bias"])),
        ("model.add_qkv_bias", bool(m["bias"] or m["qkv_bias"])),
        ("model.share_embeddings_and_output_weights", bool(m["tied_embeddings"])),
        ("model.qk_layernorm", bool(m.get("qk_norm", False))),
        ("model.layernorm_zero_centered_gamma", False),
    ]
    if m["position"] == "rope":
        rs = m.get("rope_scaling")
        e += [("model.rotary_base", m["rope_theta"]),
              ("model.rope_scaling", rs is not None),
              ("model.rotary_scaling_factor", None)]
        if rs:
            e.append(("model.rope_scaling_factor", rs["factor"]))
    if mla:
        e += [("model.multi_latent_attention", True),
              ("model.q_lora_rank", mla["q_lora_rank"] or None),
              ("model.kv_lora_rank", mla["kv_lora_rank"]),
              ("model.qk_head_dim", mla["qk_nope_dim"]),
              ("model.qk_pos_emb_head_dim", mla["qk_rope_dim"]),
              ("model.v_head_dim", mla["v_dim"])]
    else:
        e += [("model.num_query_groups", m["kv_heads"]), ("model.kv_channels", m["head_dim"])]
    e.append(("model.mtp_num_layers", m.get("mtp_layers") or None))
    if moe:
        freq = [1 if i >= moe["first_dense"] and (i - moe["first_dense"] + 1) % moe["layer_freq"] == 0
                else 0 for i in range(m["layers"])]
        e += [
            ("model.num_moe_experts", moe["experts"]),
            ("model.moe_router_topk", moe["topk"]),
            ("model.moe_ffn_hidden_size", moe["expert_ffn"]),
            ("model.moe_shared_expert_intermediate_size", moe["shared_ffn"] or None),
            ("model.moe_shared_expert_gate", bool(moe["shared_gate"])),
            ("model.moe_layer_freq", freq),
            ("model.expert_model_parallel_size", l["ep"]),
            ("model.expert_tensor_parallel_size", l["etp"]),
            ("model.moe_router_score_function", moe["score"]),
            ("model.moe_router_num_groups", moe["groups"] or None),
            ("model.moe_router_group_topk", moe["topk_groups"] or None),
            ("model.moe_aux_loss_coeff", moe["aux_loss_coeff"]),
            ("model.moe_expert_capacity_factor", moe["capacity_factor"] or None),
            ("model.moe_pad_expert_input_to_capacity", moe["capacity_factor"] > 0),
            ("model.moe_token_dispatcher_type", t.get("moe_dispatcher", "alltoall")),
            ("model.moe_grouped_gemm", True),
            ("model.moe_router_force_load_balancing", bool(t.get("moe_force_balance"))),
        ]
        if moe["aux_loss_coeff"] == 0:
            e.append(("model.moe_router_load_balancing_type", "none"))
        if t.get("moe_dispatcher") == "flex":  # on DeepEP's kernels
            e.append(("model.moe_flex_dispatcher_backend", "deepep"))
        if any(f == 0 for f in freq):
            e.append(("model.ffn_hidden_size", m["ffn_hidden"]))
    else:
        e += [("model.ffn_hidden_size", m["ffn_hidden"]), ("model.num_moe_experts", None)]
    # the pipeline split: parallax's stage layers, as Megatron-Core assigns them
    stages = l.get("stage_layers")
    if stages:
        chunks = l["pp"] * l["vpp"]
        if len(stages) != chunks:  # one entry per stage (vpp 1)
            stages = [stages[g % l["pp"]] for g in range(chunks)]
        e.append(("stage_layers", stages))
    return e


def stage_layers(cfg):
    """Transformer layers per virtual pipeline stage (virtual stage j * pp + rank) as
    Megatron-Core will place them: its parsed layout's decoder layers, else each rank's share
    (first/last stage counts, or the embedding and/or the loss counted as layers) divided over
    its chunks, less the embedding's and the loss's places."""
    mc = cfg.model
    pp = mc.pipeline_model_parallel_size
    vpp = mc.virtual_pipeline_model_parallel_size or 1
    layout = getattr(mc, "pipeline_model_parallel_layout", None)
    if layout is not None:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

        if isinstance(layout, str):
            layout = PipelineParallelLayerLayout.from_str(layout, pp)
        chunks = layout.virtual_pipeline_model_parallel_size
        return [sum(1 for x in layout.layout[g % pp][g // pp] if str(x).endswith("decoder"))
                for g in range(pp * chunks)]
    first = mc.num_layers_in_first_pipeline_stage
    last = mc.num_layers_in_last_pipeline_stage
    embed = bool(getattr(mc, "account_for_embedding_in_pipeline_split", False))
    loss = bool(getattr(mc, "account_for_loss_in_pipeline_split", False))
    rest, middle = mc.num_layers + embed + loss, pp
    if first is not None:
        rest, middle = rest - first, middle - 1
    if last is not None:
        rest, middle = rest - last, middle - 1
    mid = [rest // middle] * middle if middle > 0 else []
    per_rank = ([first] if first is not None else []) + mid + ([last] if last is not None else [])
    out = [per_rank[g % pp] // vpp for g in range(pp * vpp)]
    out[0] -= embed
    out[-1] -= loss
    return out


def actual(cfg, path):
    if path == "data_parallel_size":
        return cfg.data_parallel_size
    if path == "activation":
        return getattr(cfg.model.activation_func, "__name__", str(cfg.model.activation_func))
    if path == "stage_layers":
        return stage_layers(cfg)
    if path == "model.moe_layer_freq":
        v = cfg.model.moe_layer_freq
        return v if isinstance(v, list) else [1 if i % v == 0 else 0 for i in range(cfg.model.num_layers)]
    obj = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    if path == "model.num_query_groups" and obj is None:
        return cfg.model.num_attention_heads
    return obj


def same(want, got):
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and float(got) == float(want)
    if isinstance(want, list):
        return list(got) == want if got is not None else False
    return want == got and type(want) is type(got) if isinstance(want, bool) else want == got


def check(parallax, name, args, tmp):
    try:
        plan, text = export(parallax, name, args, tmp)
    except subprocess.CalledProcessError as exc:
        return "NO PLAN", f"{exc.cmd[1]} exited {exc.returncode}: {exc.stderr.strip()[-400:]}"
    recipe, overrides = parse_export(text)
    if not recipe:
        return "REFUSED", "the export names no recipe (# recipe: ...)"
    try:
        cfg, warnings = run_bridge(plan, recipe, overrides)
    except BaseException as exc:  # the client's own refusal, in its words
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return "REFUSED", f"{recipe}: {last[:400]}"
    bad = []
    for path, want in expected(plan):
        try:
            got = actual(cfg, path)
        except AttributeError as exc:
            bad.append(f"{path}: {exc}")
            continue
        if not same(want, got):
            bad.append(f"{path}: expected {want!r}, got {got!r}")
    if bad:
        return "DIFFERS", f"{recipe}: " + "; ".join(bad)
    if warnings:
        return "WARNED", f"{recipe}: " + "; ".join(warnings)
    return "ACCEPTED", recipe


# What the check must not let through (each the way an export for 0.3.1 spoke): a precision
# changed through dataclasses.replace, which 0.6 refuses with a logged warning and keeps the
# recipe's; an override of a key the config does not have, which it skips with a warning.
BREAKAGES = [
    ("a precision through dataclasses.replace",
     ["~mixed_precision", "+mixed_precision={_target_:dataclasses.replace,_args_:[{_target_:"
      "megatron.bridge.training.mixed_precision.bf16_mixed}],grad_reduce_in_fp32:false}"]),
    ("a key the optimizer config lacks", ["optimizer.no_such_key=1"]),
]


def self_check(parallax, first, tmp):
    """Each breakage, added to the first plan's overrides, must be refused or warned about."""
    name, args = first
    plan, text = export(parallax, name, args, tmp)
    recipe, overrides = parse_export(text)
    good = True
    for what, extra in BREAKAGES:
        try:
            _, warnings = run_bridge(plan, recipe, overrides + extra)
            caught = bool(warnings)
        except BaseException:  # refused: caught too
            caught = True
        print(f"self-check {'ok' if caught else 'FAILED'}: {what} {'is caught' if caught else 'passes unseen'}")
        good &= caught
    return good


def main():
    if len(sys.argv) < 2:
        print("usage: bridge_check.py PARALLAX [--plans FILE] [PLAN_NAME ...]", file=sys.stderr)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    names, plans_file = sys.argv[2:], None
    if names[:1] == ["--plans"] and len(names) > 1:
        plans_file, names = names[1], names[2:]
    tmp = tempfile.mkdtemp(prefix="px_bridge_")
    try:
        install_hub(os.path.join(tmp, "hub"))
        install_te_stub()
        import megatron.bridge.recipes  # noqa: F401  (import once, before the plans)

        plans = read_plans(set(names), plans_file)
        if not self_check(parallax, plans[0], tmp):
            return 1
        ok = 0
        for name, args in plans:
            verdict, detail = check(parallax, name, args, tmp)
            ok += verdict == "ACCEPTED"
            print(f"{name:24s} {verdict:9s} {detail}", flush=True)
        from megatron.bridge.package_info import __version__ as bridge_version
        from megatron.core.package_info import __version__ as core_version

        print(f"megatron-bridge {bridge_version} (megatron-core {core_version}): {ok}/{len(plans)} plans "
              "accepted with the plan's values and no warning")
        return 0 if ok == len(plans) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
