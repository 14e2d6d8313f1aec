#!/usr/bin/env python3
"""pytorch_check.py — the executor's model against PyTorch: one forward and backward of a GPT
(layernorm, GELU, learned positions: GPT-2 and the zoo's tiny) with the weights and the batch
that parallax exported (build/exec_dump PLAN.json OUT.json: its CPU backend in fp32), in
float64, then parallax's loss and the norm of every gradient tensor against PyTorch's.

    python3 scripts/pytorch_check.py tiny.dump

Prints one line per tensor and exits 1 when the loss differs by more than 1e-5 relative or a
gradient's norm by more than 1e-4 relative (parallax computes in fp32: about 1e-7 per operation,
accumulated over a few hundred operations; the reference is float64), 77 without torch.
scripts/gpu.sh's pytorch step runs it.
"""
import json
import math
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: pytorch_check.py DUMP.json", file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        d = json.load(f)
    m = d["model"]
    if m["norm"] != "layernorm" or m["mlp"] != "gelu" or m["position"] != "learned":
        print("pytorch_check.py: only GPT-2-style models (layernorm, gelu, learned positions)",
              file=sys.stderr)
        return 2
    if m["dropout"] != 0:
        print("pytorch_check.py: the plan has dropout: make it with --dropout 0", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("pytorch_check.py: no torch in this python3")
        return 77
    torch.set_default_dtype(torch.float64)
    W = {k: torch.tensor(v["data"], dtype=torch.float64).reshape(v["shape"]).requires_grad_()
         for k, v in d["weights"].items()}
    L, C, H, KV, D = m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["head_dim"]
    eps = m["norm_eps"]
    tok = torch.tensor(d["tokens"], dtype=torch.long)
    x, y = tok[:, :-1], tok[:, 1:]
    B, T = x.shape

    def b(name):
        return W.get(name)

    h = W["embed.wte"][x] + W["embed.wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = "layer.%d." % l
        a = F.layer_norm(h, (C,), W[p + "ln1.w"], b(p + "ln1.b"), eps)
        qkv = F.linear(a, W[p + "attn.qkv.w"], b(p + "attn.qkv.b"))
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
        v = v.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        s = s.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        o = (s @ v).transpose(1, 2).reshape(B, T, H * D)
        h = h + F.linear(o, W[p + "attn.proj.w"], b(p + "attn.proj.b"))
        a = F.layer_norm(h, (C,), W[p + "ln2.w"], b(p + "ln2.b"), eps)
        f = F.gelu(F.linear(a, W[p + "mlp.fc1.w"], b(p + "mlp.fc1.b")), approximate="tanh")
        h = h + F.linear(f, W[p + "mlp.fc2.w"], b(p + "mlp.fc2.b"))
    h = F.layer_norm(h, (C,), W["final_ln.w"], b("final_ln.b"), eps)
    out = W["embed.wte"] if m["tied_embeddings"] else W["logits.w"]
    logits = h @ out[: m["vocab"]].T
    loss = F.cross_entropy(logits.reshape(-1, m["vocab"]), y.reshape(-1))
    loss.backward()

    bad = 0
    rel = abs(loss.item() - d["loss"]) / abs(loss.item())
    print("%-24s %16s %16s %10s" % ("", "parallax (fp32)", "pytorch (fp64)", "rel diff"))
    print("%-24s %16.9f %16.9f %10.2e" % ("loss", d["loss"], loss.item(), rel))
    bad += rel > 1e-5
    for name, g in d["grads"].items():
        ours = math.sqrt(sum(v * v for v in g))
        theirs = W[name].grad.norm().item()
        r = abs(ours - theirs) / max(theirs, 1e-30)
        bad += r > 1e-4
        print("%-24s %16.9g %16.9g %10.2e%s" % ("|d " + name + "|", ours, theirs, r,
                                                 "  FAILED" if r > 1e-4 else ""))
    print("pytorch_check.py: %s" % ("ok" if not bad else "%d values beyond tolerance" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
