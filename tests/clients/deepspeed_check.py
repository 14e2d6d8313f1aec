"""DeepSpeed 0.19.8 reads `parallax export --format deepspeed` with its own config classes.

For every plan of tests/clients/plans.txt: `parallax plan` writes the plan, `parallax export
--format deepspeed` the JSON (its warnings on stderr); DeepSpeedConfig parses the JSON as
deepspeed.initialize would, with an mpu that reports the plan's data-parallel size, as
Megatron-DeepSpeed's does (DeepSpeed checks train_batch_size = micro-batch x accumulation x
that size). The parsed values are compared with the plan: batch sizes, ZeRO stage and overlap,
precision (bf16 / fp16 with parallax's loss scaling, the gradients' dtype), gradient clipping,
the optimizer (built as torch.optim's class of that name from the parsed parameters, as DeepSpeed
builds its own from them) and the learning-rate schedule (DeepSpeed's WarmupCosineLR, stepped: a
linear warm-up, never above the peak, min_lr at the last step), and the activation checkpointing
block of full recompute. Nothing is stubbed: the config path needs no GPU.

    python tests/clients/deepspeed_check.py build/parallax [--plans FILE] [PLAN_NAME ...]

Prints one verdict a plan and exits 1 when any plan is refused or differs, 0 when all pass.
"""

import json
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import traceback

import train_expect

HERE = os.path.dirname(os.path.abspath(__file__))


def read_plans(only, path=None):
    plans = []
    with open(path or os.path.join(HERE, "plans.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, args = line.split(None, 1)
            if not only or name in only:
                plans.append((name, shlex.split(args.replace("$CLIENTS", HERE))))
    return plans


def export(parallax, name, args, tmp):
    """The plan, the DeepSpeed JSON and what the export warned."""
    path = os.path.join(tmp, name + ".json")
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    subprocess.run([parallax, "plan", *args, "--top", "1", "-o", path], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = subprocess.run([parallax, "export", path, "--format", "deepspeed"], check=True, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(path) as f:
        return json.load(f), out.stdout, out.stderr


class Mpu:
    """The data-parallel group as Megatron-DeepSpeed's mpu reports it to DeepSpeedConfig."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0


def init_dist():
    """A one-process gloo group, so that DeepSpeedConfig asks the mpu (it falls back to a world
    of 1 when deepspeed.comm has none). DeepSpeed's CPU backend compiles its shared-memory
    collective on first use: into the environment's own directory, cached with it."""
    import logging

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.ERROR)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)


def schedule(cfg, warm):
    """DeepSpeed's own scheduler of the parsed type and parameters on a torch optimizer of the
    parsed type and parameters; returns {step: learning rate} and the optimizer. A real run has
    up to millions of steps: every warm-up step, 2000 after it and the last are asked for, each
    by its number (the scheduler's step(last_batch_iteration))."""
    import torch
    from deepspeed.runtime import lr_schedules

    name = cfg.optimizer_name
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}.get(name) or getattr(torch.optim, name)
    opt = cls([torch.nn.Parameter(torch.zeros(1))], **cfg.optimizer_params)
    sched = getattr(lr_schedules, cfg.scheduler_name)(opt, **cfg.scheduler_params)
    total = cfg.scheduler_params["total_num_steps"]
    points = set(range(min(warm + 1, total)))
    points |= {warm + (total - 1 - warm) * i // 2000 for i in range(2001)} if total > warm else set()
    lrs = {}
    for k in sorted(points):
        sched.step(k)
        lrs[k] = opt.param_groups[0]["lr"]
    return lrs, opt


def check(parallax, name, args, tmp):
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        plan, text, warned = export(parallax, name, args, tmp)
    except subprocess.CalledProcessError as exc:
        return "NO PLAN", f"{exc.cmd[1]} exited {exc.returncode}: {exc.stderr.strip()[-400:]}"
    l, t = plan["layout"], plan["training"]
    tr = train_expect.expected(plan)
    try:
        cfg = DeepSpeedConfig(json.loads(text), mpu=Mpu(l["dp"]))
        lrs, opt = schedule(cfg, tr["warmup"])
    except BaseException as exc:  # the client's own refusal, in its words
        return "REFUSED", traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]
    prec = t["precision"]
    want = [
        ("world_size", l["dp"], cfg.world_size),
        ("train_batch_size", t["global_batch"], cfg.train_batch_size),
        ("train_micro_batch_size_per_gpu", t["micro_batch"], cfg.train_micro_batch_size_per_gpu),
        ("gradient_accumulation_steps", t["micro_batches"], cfg.gradient_accumulation_steps),
        ("zero_optimization_stage", l["zero"], int(cfg.zero_optimization_stage)),
        ("zero_config.overlap_comm", bool(l["overlap_dp"]), cfg.zero_config.overlap_comm),
        ("gradient_clipping", t["grad_clip"], cfg.gradient_clipping),
        ("bfloat16_config.enabled", prec == "bf16", cfg.bfloat16_config.enabled),
        ("float16_config.enabled", prec == "fp16", cfg.float16_config.enabled),
    ]
    if prec == "fp16":
        fc = cfg.float16_config
        want += [("fp16 loss scale (dynamic)", 0, fc.loss_scale),
                 ("fp16 initial_scale_power", 16, fc.initial_scale_power),
                 ("fp16 loss_scale_window", 2000, fc.loss_scale_window),
                 ("fp16 hysteresis", 1, fc.hysteresis)]
    if prec != "fp32" and (l["zero"] >= 1 or t["grad_dtype"] == prec):
        want.append(("grad_accum_dtype", t["grad_dtype"], cfg.grad_accum_dtype))
    if prec != "fp32" and l["zero"] == 0 and t["grad_dtype"] != prec:
        want.append(("warned: fp32 gradients without ZeRO", True,
                     "NOT EXPRESSIBLE: fp32 gradients" in warned))
    group = opt.param_groups[0]
    if t["optimizer"] == "sgd-momentum":
        want += [("optimizer", "SGD", cfg.optimizer_name), ("momentum", t["momentum"], group["momentum"])]
    else:
        want += [("optimizer", "adamw", cfg.optimizer_name),
                 ("betas", (t["beta1"], t["beta2"]), tuple(group["betas"])),
                 ("eps", t["eps"], group["eps"])]
    want.append(("weight_decay", t["weight_decay"], group["weight_decay"]))
    # the schedule, in DeepSpeed's convention of counting: a linear warm-up from 0 (lr k/W at step
    # k; parallax's executor starts at lr/W, one step ahead), then a cosine that never rises and
    # ends at min_lr on the last step
    # (at the decay's end, which is the last step unless the decay ends after the training;
    # the training's length itself a warning: the training loop's, not a config setting)
    warm, end = tr["warmup"], max(tr["decay_iters"], tr["iters"])
    steps = sorted(lrs)
    want += [("scheduler", "WarmupCosineLR", cfg.scheduler_name),
             ("total_num_steps (the decay's end)", end, cfg.scheduler_params["total_num_steps"]),
             ("lr at the last step", tr["min_lr"], lrs[end - 1]),
             ("lr never above the peak", True, max(lrs.values()) <= tr["lr"]),
             ("lr never rising after warm-up", True,
              all(lrs[a] >= lrs[b] for a, b in zip(steps, steps[1:]) if a >= warm)),
             ("warned: the iterations", True, f"train for {tr['iters']} iterations" in warned)]
    for k in range(warm):
        want.append((f"lr at warm-up step {k} (linear)", tr["lr"] * k / warm, lrs[k]))
    ac = cfg.activation_checkpointing_config
    if l["recompute"] == "full":
        want += [("activation_checkpointing.partition_activations", bool(l["sp"]), ac.partition_activations),
                 ("activation_checkpointing in the JSON", True, "activation_checkpointing" in json.loads(text))]
    else:
        want.append(("activation_checkpointing in the JSON", False, "activation_checkpointing" in json.loads(text)))
    # sharding and offload: the offload block, the buckets (elements of the gradients' and the
    # parameters' dtype), ZeRO-3's limits when parameters stay gathered, HSDP said on stderr
    zc = cfg.zero_config
    off = zc.offload_optimizer
    want.append(("zero_config.offload_optimizer.device", "cpu" if l.get("offload_optimizer") else "none",
                 "none" if off is None else str(getattr(off.device, "value", off.device))))
    size = {"fp32": 4, "bf16": 2, "fp16": 2}
    if l.get("bucket_bytes"):
        want.append(("reduce_bucket_size", int(l["bucket_bytes"] // size[t["grad_dtype"]]), zc.reduce_bucket_size))
        gather = zc.prefetch_bucket_size if l["zero"] == 3 else zc.allgather_bucket_size
        want.append(("gather bucket size", int(l["bucket_bytes"] // size[prec]), gather))
    if l["zero"] == 3 and l.get("keep_gathered"):
        m = plan["model"]
        least = m["layers"] * 12 * m["hidden"] ** 2  # a transformer's 12 l h^2 (Narayanan 2021)
        want += [("stage3_max_live_parameters >= 12 l h^2", True, zc.max_live_parameters >= least),
                 ("stage3_max_reuse_distance >= 12 l h^2", True, zc.max_reuse_distance >= least)]
    if l.get("dp_replicate", 1) > 1:
        want.append(("warned: HSDP", True, "NOT EXPRESSIBLE: HSDP" in warned))
    # what the JSON cannot hold is said on stderr, with the plan's degrees
    if l["tp"] > 1 or l["pp"] > 1 or l["cp"] > 1:
        want.append(("warned: tp/pp/cp", True,
                     f"set tp {l['tp']}, pp {l['pp']}, cp {l['cp']}" in warned))
    if plan["model"].get("moe"):
        want.append(("warned: experts", True, "NOT EXPRESSIBLE: the" in warned and "experts over ep" in warned))
    if t.get("fp8_recipe", "none") != "none":
        want.append(("warned: FP8", True, "NOT EXPRESSIBLE: FP8 training" in warned))
    bad = []
    for what, w, got in want:
        same = (math.isclose(w, got, rel_tol=1e-12, abs_tol=1e-15)
                if isinstance(w, float) and isinstance(got, (int, float)) and not isinstance(got, bool)
                else w == got)
        if not same:
            bad.append(f"{what}: expected {w!r}, got {got!r}")
    if bad:
        return "DIFFERS", "; ".join(bad)
    return "ACCEPTED", f"dp {l['dp']}, ZeRO-{l['zero']}, {prec}, {cfg.optimizer_name}, {cfg.scheduler_name}"


def main():
    if len(sys.argv) < 2:
        print("usage: deepspeed_check.py PARALLAX [--plans FILE] [PLAN_NAME ...]", file=sys.stderr)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    names, plans_file = sys.argv[2:], None
    if names[:1] == ["--plans"] and len(names) > 1:
        plans_file, names = names[1], names[2:]
    init_dist()
    plans = read_plans(set(names), plans_file)
    ok = 0
    with tempfile.TemporaryDirectory(prefix="px_deepspeed_") as tmp:
        for name, args in plans:
            verdict, detail = check(parallax, name, args, tmp)
            ok += verdict == "ACCEPTED"
            print(f"{name:24s} {verdict:9s} {detail}", flush=True)
    print(f"deepspeed: {ok}/{len(plans)} plans accepted with the plan's values")
    return 0 if ok == len(plans) else 1


if __name__ == "__main__":
    sys.exit(main())
