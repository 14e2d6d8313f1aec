"""The training figures parallax's exports write for a plan, recomputed here from the plan and the
zoo's recipes (docs/exports.md, "Training length and schedule") for the client checks to compare
what each client ends up with against.

expected(plan) -> {"iters", "warmup", "lr", "min_lr", "decay_iters", "wsd", "wsd_iters"}:
iterations from the plan's train_tokens (ceil of tokens / (global batch x sequence)), else its
steps when not the default, else the recipe's tokens; the peak and minimum from the plan when
either is not the default, else the recipe's; the warm-up likewise; the decay the recipe's when
its learning rate is used, else cosine to the last iteration. A recipe counts only for the zoo
model it belongs to, unchanged.
"""
import json
import math
import os

# model/fields.c's defaults: a figure equal to its default counts as not set
DEFAULTS = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "steps": 100}
ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "model", "zoo")
NOT_SHAPE = ("recipe", "source", "description", "schema_version")


def _same(zoo, model):
    """Every figure the zoo file gives is the plan's model's."""
    for k, v in zoo.items():
        if k in NOT_SHAPE or k not in model:
            continue
        if isinstance(v, dict):
            if not isinstance(model[k], dict) or not _same(v, model[k]):
                return False
        elif v != model[k]:
            return False
    return True


def recipe(model):
    path = os.path.join(ZOO, model.get("name", "") + ".json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        zoo = json.load(f)
    r = zoo.get("recipe")
    return r if r and _same(zoo, model) else None


def expected(plan):
    t = plan["training"]
    r = recipe(plan["model"])
    bt = t["global_batch"] * t["seq_len"]
    per = lambda tokens: math.ceil(tokens / bt)
    if t.get("train_tokens", 0) > 0:
        iters = per(t["train_tokens"])
    elif t["steps"] != DEFAULTS["steps"] or not r:
        iters = t["steps"]
    else:
        iters = per(r["train_tokens"])
    lr_set = t["lr"] != DEFAULTS["lr"] or t["min_lr"] != DEFAULTS["min_lr"]
    use = r is not None and not lr_set
    lr, min_lr = (r["lr"], r["min_lr"]) if use else (t["lr"], t["min_lr"])
    if t["warmup_steps"] != DEFAULTS["warmup_steps"] or not r or not (
            r.get("warmup_steps") or r.get("warmup_tokens")):
        warmup = t["warmup_steps"]
    else:
        warmup = per(r["warmup_tokens"]) if r.get("warmup_tokens") else r["warmup_steps"]
    decay = iters
    if use and r.get("decay_end_tokens"):
        decay = per(r["decay_end_tokens"])
    elif use and r.get("decay_end_steps"):
        decay = r["decay_end_steps"]
    wsd = use and r.get("decay_style") == "wsd"
    wsd_iters = min(per(r["wsd_decay_tokens"]), decay) if wsd else 0
    if warmup >= decay:
        warmup = decay - 1 if decay > 1 else 0
    return {"iters": iters, "warmup": warmup, "lr": lr, "min_lr": min_lr, "decay_iters": decay,
            "wsd": wsd, "wsd_iters": wsd_iters}
