"""parallax's torchtitan exports read by torchtitan's own config manager.

    torchtitan_check.py 0.3|0.2 PARALLAX PLANS.txt WORKDIR

Runs in the environment scripts/clients.sh builds (tests/clients/torchtitan03.txt or
torchtitan02.txt). For every plan of PLANS.txt: `parallax plan` writes it, `parallax export`
writes the torchtitan 0.3 command line (--format torchtitan) or the torchtitan 0.2 TOML job file
(--format torchtitan-toml), and that version's ConfigManager.parse_args reads it: 0.3 the
arguments after `-m torchtitan.train`, 0.2 `--job.config_file FILE`. The values torchtitan ends
up with are compared with the plan's: every degree, the batch and its micro-batches, the
sequence, the steps, activation checkpointing, precision, FP8, optimizer and schedule; the
degrees go through torchtitan's ParallelDims validation, an even pipeline split through its
generate_llm_fqn_per_model_part, and the model it names is compared with the plan's shape.
Prints a verdict per plan and "N passed, M failed"; exits 1 on any failure.
"""

import json
import logging
import math
import os
import shlex
import subprocess
import sys

import train_expect

# parallax model name -> (torchtitan module, flavor, 0.3 config function); the models
# torchtitan does not build are absent
TITAN_MODELS = {
    "llama3-8b": ("llama3", "8B", "llama3_8b"),
    "llama31-8b.config": ("llama3", "8B", "llama3_8b"),
    "llama3-70b": ("llama3", "70B", "llama3_70b"),
    "llama3-405b": ("llama3", "405B", "llama3_405b"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "gpt-oss-120b": ("gpt_oss", "120b", "gpt_oss_120b"),
}


class Mismatch(Exception):
    pass


class Checker:
    def __init__(self, name):
        self.name = name
        self.checks = 0

    def eq(self, what, got, want):
        self.checks += 1
        if got != want:
            raise Mismatch(f"{what}: torchtitan has {got!r}, the plan says {want!r}")

    def true(self, what, cond):
        self.checks += 1
        if not cond:
            raise Mismatch(what)


def plans(path, clients):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, rest = line.split(None, 1)
            yield name, shlex.split(rest.replace("$CLIENTS", clients))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Mismatch(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def cli_args(text):
    """The arguments after `-m torchtitan.train` of the exported command line."""
    lines = [l for l in text.splitlines() if not l.startswith("#")]
    words = shlex.split(" ".join(l.rstrip("\\").strip() for l in lines))
    return words[words.index("torchtitan.train") + 1:]


def expected_dp(version, lay, ep):
    """(replicate, shard, reshard) as docs/exports.md's table maps the plan's data parallelism."""
    dp, tp, pp, cp, zero = lay["dp"], lay["tp"], lay["pp"], lay["cp"], lay["zero"]
    ddp_ok = ep <= 1 and dp > 1 and (version == "0.3" or cp > 1 or (tp == 1 and pp == 1))
    rep, shard = (dp, 1) if zero == 0 and ddp_ok else (1, dp)
    if lay.get("dp_replicate", 1) > 1:  # HSDP: the plan's own split
        rep, shard = lay["dp_replicate"], lay["dp_shard"]
    reshard = ("never" if lay.get("keep_gathered") else "always") if zero == 3 else \
        "never" if shard * cp > 1 else "default"
    return rep, shard, reshard


def notes_expected(version, plan, text, c):
    """The NOT EXPRESSIBLE lines the plan must get."""
    lay, tr, model = plan["layout"], plan["training"], plan["model"]
    want = []
    if model["name"] not in TITAN_MODELS:
        want.append("NOT EXPRESSIBLE: the model " + model["name"])
    if lay["zero"] in (1, 2) and lay["dp"] * lay["cp"] > 1:
        want.append(f"NOT EXPRESSIBLE: ZeRO-{lay['zero']}")
    if lay["recompute"] == "selective":
        want.append("NOT EXPRESSIBLE: selective recompute")
    if tr["precision"] == "fp16":
        want.append("NOT EXPRESSIBLE: fp16 mixed precision")
    cpc = lay.get("cp_comm_type", "p2p")
    if lay["cp"] > 1 and cpc == "a2a":
        want.append("NOT EXPRESSIBLE: Ulysses context parallelism")
    if lay["cp"] > 1 and cpc == "p2p" and version == "0.3":
        want.append("NOT EXPRESSIBLE: the K/V ring")
    if model.get("mtp_layers", 0) > 0:
        want.append("NOT EXPRESSIBLE: the model's %d multi-token prediction" % model["mtp_layers"])
    for i, n in enumerate(lay.get("stage_layers") or []):
        if n == 0 and 0 < i < len(lay["stage_layers"]) - 1:
            want.append(f"NOT EXPRESSIBLE: pipeline stage {i} of the layout string")
    recipe = tr.get("fp8_recipe", "none")
    if recipe != "none" and version == "0.3":
        want.append(f"NOT EXPRESSIBLE: FP8 GEMMs ({recipe})")
    if recipe == "delayed" and version == "0.2":
        want.append("NOT EXPRESSIBLE: delayed scaling")
    for w in want:
        c.true(f"the export lacks '# {w}'", ("# " + w) in text)


def check_model(version, cfg, plan, c, args):
    model = plan["model"]
    titan = TITAN_MODELS.get(model["name"])
    if version == "0.3":
        if titan is None:
            c.eq("--module", args[args.index("--module") + 1], "MODULE")
            c.eq("--config", args[args.index("--config") + 1], "CONFIG")
            return
        c.eq("model_spec.name", cfg.model_spec.name, titan[0])
        c.eq("model_spec.flavor", cfg.model_spec.flavor, titan[1])
        m = cfg.model_spec.model
        c.eq("model layers", len(m.layers), model["layers"])
        c.eq("model dim", m.dim, model["hidden"])
        c.eq("model vocab_size", m.vocab_size, model["vocab"])
        return
    if titan is None:
        c.eq("model.name", cfg.model.name, "MODEL")
        c.eq("model.flavor", cfg.model.flavor, "FLAVOR")
        return
    c.eq("model.name", cfg.model.name, titan[0])
    c.eq("model.flavor", cfg.model.flavor, titan[1])
    from torchtitan.protocols.train_spec import get_train_spec

    margs = get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
    c.eq("model n_layers", margs.n_layers, model["layers"])
    c.eq("model dim", margs.dim, model["hidden"])
    c.eq("model n_heads", margs.n_heads, model["heads"])
    c.eq("model vocab_size", margs.vocab_size, model["vocab"])


def check_pipeline(version, par, plan, c):
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    lay, model = plan["layout"], plan["model"]
    layers = model["layers"]
    c.eq("pipeline_parallel_microbatch_size", par.pipeline_parallel_microbatch_size,
         plan["training"]["micro_batch"])
    sched = "Interleaved1F1B" if lay["vpp"] > 1 else "GPipe" if lay["schedule"] == "gpipe" else "1F1B"
    c.eq("pipeline_parallel_schedule", par.pipeline_parallel_schedule, sched)
    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    c.eq("single-stage schedule", single, lay["vpp"] == 1)
    if lay.get("stage_layers"):
        parts = par.module_fqns_per_model_part
        c.true("module_fqns_per_model_part is set", parts is not None)
    elif version == "0.3":
        # pipeline_llm's own count of virtual stages and its split of the layers
        from torchtitan.distributed.parallel_dims import ParallelDims
        from torchtitan.distributed.pipeline_parallel import (
            _generate_llm_fqn_per_model_part,
            _get_pipeline_metadata,
        )

        class Layers:  # all _get_pipeline_metadata reads of the model: its layers
            pass

        shape = Layers()
        shape.layers = [None] * layers
        stages, n, first, last = _get_pipeline_metadata(ParallelDims.from_config(par, plan["gpus"]), par, shape)
        parts = _generate_llm_fqn_per_model_part(stages, n, first, last)
    else:
        from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

        lps = par.pipeline_parallel_layers_per_stage
        first, last = (par.pipeline_parallel_first_stage_less_layers,
                       par.pipeline_parallel_last_stage_less_layers)
        # 0.2's pipeline_llm counts the virtual stages inline: the same formula
        stages = math.ceil((layers + first + last) / lps)
        parts = generate_llm_fqn_per_model_part(stages, layers, first, last)
    want = lay.get("stage_layers") or [layers // (lay["pp"] * lay["vpp"])] * (lay["pp"] * lay["vpp"])
    # a middle stage of prediction modules alone has no module here (a NOT EXPRESSIBLE note):
    # 0.3 drops its empty entry, 0.2 keeps it empty
    alone = sum(1 for i, n in enumerate(want) if n == 0 and 0 < i < len(want) - 1)
    if alone:
        parts = [p for p in parts if p]
    c.eq("virtual pipeline stages", len(parts), lay["pp"] * lay["vpp"] - alone)
    counts = [sum(1 for m in p if m.startswith("layers.")) for p in parts]
    want = [n for i, n in enumerate(want) if n or i in (0, len(want) - 1)]
    c.eq("layers per pipeline stage", counts, want)
    order = [m for p in parts for m in p]
    out = "lm_head" if version == "0.3" else "output"
    c.eq("pipeline modules in order", order,
         ["tok_embeddings"] + [f"layers.{i}" for i in range(layers)] + ["norm", out])


def check(version, cfg, plan, text, args):
    c = Checker(plan["model"]["name"])
    lay, tr = plan["layout"], plan["training"]
    sch = train_expect.expected(plan)
    par, training = cfg.parallelism, cfg.training
    ep = lay.get("ep", 1) or 1
    rep, shard, reshard = expected_dp(version, lay, ep)
    c.eq("data_parallel_replicate_degree", par.data_parallel_replicate_degree, rep)
    c.eq("data_parallel_shard_degree", par.data_parallel_shard_degree, shard)
    c.eq("fsdp_reshard_after_forward", par.fsdp_reshard_after_forward, reshard)
    c.eq("tensor_parallel_degree", par.tensor_parallel_degree, lay["tp"])
    c.eq("context_parallel_degree", par.context_parallel_degree, lay["cp"])
    c.eq("pipeline_parallel_degree", par.pipeline_parallel_degree, lay["pp"])
    c.eq("expert_parallel_degree", par.expert_parallel_degree, ep)
    c.eq("enable_cpu_offload", training.enable_cpu_offload, bool(lay.get("offload_optimizer")))
    if version == "0.2" and lay["cp"] > 1:  # the ring is PyTorch's alltoall rotation
        c.eq("context_parallel_rotate_method", par.context_parallel_rotate_method,
             "allgather" if lay.get("cp_comm_type") == "allgather" else "alltoall")
    if version == "0.3":
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
        from torchtitan.distributed.parallel_dims import ParallelDims

        ParallelDims.from_config(par, plan["gpus"])  # torchtitan's own degree rules
        if lay["tp"] > 1:
            c.eq("enable_sequence_parallel", par.enable_sequence_parallel, lay["sp"])
        c.eq("enable_async_tensor_parallel", cfg.compile.enable_async_tensor_parallel,
             lay["overlap_tp"] and lay["tp"] > 1)
        ac = cfg.activation_checkpoint
        kind = "none" if ac is None else "full" if isinstance(ac, FullAC.Config) else \
            "selective" if isinstance(ac, SelectiveAC.Config) else type(ac).__qualname__
        c.eq("activation_checkpoint", kind, lay["recompute"])
        group = cfg.optimizer.param_groups[0]
        c.eq("optimizer_name", group.optimizer_name, "AdamW")
        kw = group.optimizer_kwargs
        c.eq("lr", kw["lr"], sch["lr"])
        c.eq("betas", tuple(kw["betas"]), (tr["beta1"], tr["beta2"]))
        c.eq("eps", kw["eps"], tr["eps"])
        c.eq("weight_decay", kw["weight_decay"], tr["weight_decay"])
        seed = cfg.debug.seed
    else:
        from torchtitan.distributed.parallel_dims import ParallelDims

        ParallelDims(dp_shard=par.data_parallel_shard_degree, dp_replicate=par.data_parallel_replicate_degree,
                     cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                     pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                     etp=par.expert_tensor_parallel_degree, world_size=plan["gpus"])
        if ep > 1:
            c.eq("expert_tensor_parallel_degree", par.expert_tensor_parallel_degree, lay["etp"])
            c.eq("expert_parallel_comm_backend", par.expert_parallel_comm_backend,
                 "deepep" if plan["training"].get("moe_dispatcher") == "flex" else "standard")
        c.eq("enable_async_tensor_parallel", par.enable_async_tensor_parallel,
             lay["overlap_tp"] and lay["tp"] > 1)
        c.eq("activation_checkpoint.mode", cfg.activation_checkpoint.mode, lay["recompute"])
        if lay["recompute"] == "selective":
            c.eq("selective_ac_option", cfg.activation_checkpoint.selective_ac_option, "op")
        o = cfg.optimizer
        c.eq("optimizer.name", o.name, "AdamW")
        c.eq("lr", o.lr, sch["lr"])
        c.eq("beta1, beta2", (o.beta1, o.beta2), (tr["beta1"], tr["beta2"]))
        c.eq("eps", o.eps, tr["eps"])
        c.eq("weight_decay", o.weight_decay, tr["weight_decay"])
        recipe = tr.get("fp8_recipe", "none")
        conv = cfg.model.converters
        if recipe == "none":
            c.eq("model.converters", conv, [])
        elif recipe == "mxfp8":
            c.true(f"model.converters {conv} has quantize.linear.mx", "quantize.linear.mx" in conv)
            c.eq("quantize.linear.mx.filter_fqns", cfg.quantize.linear.mx.filter_fqns[0], "output")
        else:
            f8 = cfg.quantize.linear.float8
            c.true(f"model.converters {conv} has quantize.linear.float8", "quantize.linear.float8" in conv)
            c.eq("float8 recipe_name", f8.recipe_name, "rowwise" if recipe == "blockwise" else None)
            c.eq("float8 filter_fqns", f8.filter_fqns[0], "output")
            gather = bool(tr.get("fp8_param_gather")) and recipe in ("delayed", "tensorwise") and shard > 1
            c.eq("enable_fsdp_float8_all_gather", f8.enable_fsdp_float8_all_gather, gather)
        seed = cfg.debug.seed
    # batch: torchtitan's data-parallel degree is replicate x shard, its gradient accumulation
    # global / (local x that degree); with pipeline parallelism the local batch is split into
    # pipeline micro-batches instead
    dp = par.data_parallel_replicate_degree * par.data_parallel_shard_degree
    c.eq("data-parallel degree", dp, lay["dp"])
    c.eq("global_batch_size", training.global_batch_size, tr["global_batch"])
    accum = training.global_batch_size // (training.local_batch_size * dp)
    c.eq("local x accumulation x dp", training.local_batch_size * accum * dp, tr["global_batch"])
    if lay["pp"] > 1:
        c.eq("gradient accumulation steps", accum, 1)
        c.eq("pipeline micro-batches", training.local_batch_size // par.pipeline_parallel_microbatch_size,
             tr["micro_batches"])
        check_pipeline(version, par, plan, c)
    else:
        c.eq("local_batch_size", training.local_batch_size, tr["micro_batch"])
        c.eq("gradient accumulation steps", accum, tr["micro_batches"])
    c.eq("seq_len", training.seq_len, tr["seq_len"])
    c.eq("steps", training.steps, sch["iters"])
    # a WSD decay as its share of the steps (torchtitan rounds it back to steps)
    want_ratio = float("%.12g" % (sch["wsd_iters"] / sch["iters"])) if sch["wsd"] else None
    c.eq("decay_ratio", cfg.lr_scheduler.decay_ratio, want_ratio)
    c.eq("max_norm", training.max_norm, tr["grad_clip"] if tr["grad_clip"] > 0 else float("inf"))
    c.eq("mixed_precision_param", training.mixed_precision_param,
         "float32" if tr["precision"] == "fp32" else "bfloat16")
    c.eq("mixed_precision_reduce", training.mixed_precision_reduce, "float32")
    c.eq("lr_scheduler.warmup_steps", cfg.lr_scheduler.warmup_steps, sch["warmup"])
    c.eq("lr_scheduler.decay_type", cfg.lr_scheduler.decay_type, "cosine")
    c.eq("lr_scheduler.min_lr_factor", cfg.lr_scheduler.min_lr_factor, float("%.12g" % (sch["min_lr"] / sch["lr"])))
    c.eq("debug.seed", seed, tr["seed"])
    check_model(version, cfg, plan, c, args)
    notes_expected(version, plan, text, c)
    return c.checks


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("0.2", "0.3"):
        print(__doc__, file=sys.stderr)
        return 2
    version, parallax, plans_txt, work = sys.argv[1:]
    clients = os.path.dirname(os.path.abspath(plans_txt))
    os.makedirs(work, exist_ok=True)
    logging.disable(logging.WARNING)  # torchtitan's warnings about missing tokenizer files
    from torchtitan.config import ConfigManager

    manager = ConfigManager()
    os.environ["PARALLAX_UNCALIBRATED"] = "1"
    passed = failed = 0
    for name, plan_args in plans(plans_txt, clients):
        plan_path = os.path.join(work, name + ".json")
        try:
            run([parallax, "plan", *plan_args, "--top", "1", "-o", plan_path])
            with open(plan_path) as f:
                plan = json.load(f)
            if version == "0.3":
                text = run([parallax, "export", plan_path, "--format", "torchtitan"])
                args = cli_args(text)
                if "MODULE" in args:  # a model torchtitan does not build: load the rest on llama3's
                    args = [{"MODULE": "llama3", "CONFIG": "llama3_debugmodel"}.get(a, a) for a in args]
                    cfg = manager.parse_args(args)
                    args = cli_args(text)
                else:
                    cfg = manager.parse_args(args)
            else:
                text = run([parallax, "export", plan_path, "--format", "torchtitan-toml"])
                toml_path = os.path.join(work, name + ".toml")
                with open(toml_path, "w") as f:
                    f.write(text)
                args = []
                cfg = manager.parse_args(["--job.config_file", toml_path])
            n = check(version, cfg, plan, text, args)
            print(f"{name}: torchtitan {version} accepts it ({n} values equal the plan's)")
            passed += 1
        except (Exception, SystemExit) as e:  # a refusal (tyro exits on a bad flag) is a verdict too
            print(f"{name}: torchtitan {version} FAILED: {type(e).__name__}: {e}")
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
