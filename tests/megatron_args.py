#!/usr/bin/env python3
"""Checks parallax's Megatron-LM export against Megatron-LM's own argument parser.

Usage: MEGATRON_LM=<Megatron-LM checkout> python3 tests/megatron_args.py PARALLAX [PYTHON]

For a DeepSeek-V3-like and a Qwen3-MoE-like plan (zoo models deepseek-v3 and qwen3-30b-a3b,
layouts written by exec_mkplan's sibling `parallax plan ... -o`) and FP8 plans of Llama-3 under
each recipe (blockwise, delayed with its amax history, mxfp8 on B200, FP8 parameters under the
distributed optimizer and under Megatron FSDP), it exports the Megatron flags, runs
megatron/training/arguments.py's parse_args on them, then validate_args with the plan's world
size, and compares the parsed values with what the plan says. Exits 77 (skipped) with a
message when MEGATRON_LM is not set or torch cannot be imported; 1 on the first mismatch or
parser error.

What is stubbed, and nothing else:
  - typing.override, when the Python is older than 3.12 (Megatron-LM's HEAD imports it from
    typing; it is a no-op decorator);
  - the world size: validate_args reads args.world_size, which parse_args takes from the
    WORLD_SIZE environment variable that torchrun sets; it is set to the plan's GPUs here;
  - torch.cuda.get_device_capability, which validate_args calls for --moe-grouped-gemm (it
    asserts compute capability >= 8) and which needs a GPU driver: it returns the plan's
    device, (9, 0) for H100 and (10, 0) for B200; likewise arguments.get_device_arch_version
    (the device's major version, read for tp > 1 to decide on CUDA_DEVICE_MAX_CONNECTIONS):
    9 or 10.
No other GPU, NCCL or torch.distributed call is made.
"""
import os
import re
import shlex
import subprocess
import sys


def export_flags(parallax, plan_args, tmp):
    plan = os.path.join(tmp, "plan.json")
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1")
    subprocess.run([parallax, "plan", *plan_args, "-o", plan, "--top", "1"], check=True,
                   env=env, stdout=subprocess.DEVNULL)
    out = subprocess.run([parallax, "export", plan, "--format", "megatron"], check=True,
                         env=env, capture_output=True, text=True).stdout
    body = out.split("MEGATRON_ARGS=\\\n", 1)[1]
    flags = shlex.split(body.replace("\\\n", " "))
    return out, flags


def check(name, args, key, want):
    got = getattr(args, key)
    if got != want:
        print(f"FAILED {name}: args.{key} = {got!r}, expected {want!r}")
        sys.exit(1)
    print(f"  {key} = {got!r}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    root = os.environ.get("MEGATRON_LM")
    if not root or not os.path.isfile(os.path.join(root, "megatron/training/arguments.py")):
        print("megatron_args: skipped: set MEGATRON_LM to a Megatron-LM checkout "
              "(megatron/training/arguments.py not found)")
        return 77
    try:
        import torch  # noqa: F401  (arguments.py imports it)
    except ImportError as e:
        print(f"megatron_args: skipped: torch cannot be imported ({e}); "
              "pip install torch --index-url https://download.pytorch.org/whl/cpu")
        return 77
    import typing
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python < 3.12: see the docstring
    sys.path.insert(0, root)
    import warnings
    warnings.filterwarnings("ignore")
    from megatron.training import arguments
    import torch

    import tempfile
    cases = [
        ("deepseek-v3-like",
         ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024", "--gbs", "4096",
          "--seq", "4096", "--tp", "2", "--sp", "--cp", "1", "--pp-layers", "7,8,8,8,8,8,8,6", "--ep", "64",
          "--etp", "1", "--zero", "1", "--mbs", "1", "--recompute", "full", "--vpp", "1",
          "--overlap-ep", "--allow-cross-node-tp"],
         {"num_experts": 256, "moe_router_topk": 8, "expert_model_parallel_size": 64,
          "expert_tensor_parallel_size": 1, "moe_ffn_hidden_size": 2048,
          "moe_shared_expert_intermediate_size": 2048, "moe_router_score_function": "sigmoid",
          "moe_router_num_groups": 8, "moe_router_group_topk": 4,
          "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True,
          "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "mtp_num_layers": 1,
          "sequence_parallel": True, "tensor_model_parallel_size": 2,
          "pipeline_model_parallel_size": 8, "decoder_first_pipeline_num_layers": 7,
          "decoder_last_pipeline_num_layers": 6},
         [0] * 3 + [1] * 58, 1024),
        ("qwen3-moe-like",
         ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "512",
          "--seq", "4096", "--tp", "1", "--cp", "1", "--pp", "2", "--ep", "8", "--etp", "1", "--zero", "1",
          "--mbs", "1", "--recompute", "none", "--vpp", "1", "--schedule", "1f1b"],
         {"num_experts": 128, "moe_router_topk": 8, "expert_model_parallel_size": 8,
          "expert_tensor_parallel_size": 1, "moe_ffn_hidden_size": 768,
          "moe_router_score_function": "softmax", "moe_token_dispatcher_type": "alltoall",
          "moe_grouped_gemm": True, "tensor_model_parallel_size": 1,
          "pipeline_model_parallel_size": 2},
         [1] * 48, 64),
        # the planner's first choices for these models on dgx-h100 (docs/moe.md)
        ("deepseek-v3-planned",
         ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024", "--gbs", "1024",
          "--seq", "4096", "--tp", "4", "--sp", "--cp", "2", "--pp", "1", "--ep", "256", "--etp", "1",
          "--zero", "1", "--mbs", "1", "--recompute", "none", "--vpp", "1"],
         {"num_experts": 256, "expert_model_parallel_size": 256, "expert_tensor_parallel_size": 1,
          "tensor_model_parallel_size": 4, "context_parallel_size": 2,
          "pipeline_model_parallel_size": 1, "multi_latent_attention": True, "mtp_num_layers": 1},
         [0] * 3 + [1] * 58, 1024),
        ("qwen3-235b-a22b-planned",
         ["--model", "qwen3-235b-a22b", "--cluster", "dgx-h100", "--gpus", "256", "--gbs", "1024",
          "--seq", "4096", "--tp", "1", "--cp", "2", "--pp", "16",
          "--pp-layers", "5,6,6,6,6,6,6,6,6,6,6,6,6,6,6,5", "--ep", "8", "--etp", "1", "--zero", "1",
          "--mbs", "1", "--recompute", "none", "--vpp", "1"],
         {"num_experts": 128, "moe_router_topk": 8, "expert_model_parallel_size": 8,
          "expert_tensor_parallel_size": 1, "moe_ffn_hidden_size": 1536,
          "context_parallel_size": 2, "pipeline_model_parallel_size": 16,
          "decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 5},
         [1] * 94, 256),
        # FP8: --precision fp8 is bf16 with FP8 GEMMs (recipe delayed unless --fp8-recipe);
        # parallax's recipe and format names are Megatron's
        ("llama3-8b-fp8-blockwise",
         ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "128",
          "--seq", "8192", "--precision", "fp8", "--fp8-recipe", "blockwise", "--fp8-param-gather",
          "--tp", "2", "--sp", "--pp", "1", "--cp", "1", "--zero", "1", "--mbs", "1",
          "--recompute", "none", "--vpp", "1"],
         {"bf16": True, "fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": True,
          "use_distributed_optimizer": True, "tensor_model_parallel_size": 2},
         None, 16),
        ("llama3-70b-fp8-delayed",
         ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "128",
          "--seq", "8192", "--precision", "fp8", "--fp8-format", "e4m3", "--fp8-amax-history", "256",
          "--tp", "4", "--sp", "--pp", "8", "--cp", "1", "--zero", "1", "--mbs", "1",
          "--recompute", "selective", "--vpp", "5"],
         {"bf16": True, "fp8": "e4m3", "fp8_recipe": "delayed", "fp8_param_gather": False,
          "fp8_amax_history_len": 256, "fp8_amax_compute_algo": "max",
          "pipeline_model_parallel_size": 8, "virtual_pipeline_model_parallel_size": 5},
         None, 64),
        ("llama3-70b-fp8-params-fsdp",
         ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "128",
          "--seq", "8192", "--precision", "fp8", "--fp8-param-gather",
          "--tp", "8", "--sp", "--pp", "1", "--cp", "1", "--zero", "2", "--mbs", "1",
          "--recompute", "selective", "--vpp", "1"],
         {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param_gather": True,
          "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max", "use_megatron_fsdp": True,
          "ckpt_format": "fsdp_dtensor"},
         None, 64),
        ("llama3-8b-mxfp8-b200",
         ["--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "16", "--gbs", "128",
          "--seq", "8192", "--precision", "fp8", "--fp8-recipe", "mxfp8", "--fp8-param-gather",
          "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1", "--mbs", "2",
          "--recompute", "none", "--vpp", "1"],
         {"bf16": True, "fp8": "hybrid", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
          "use_distributed_optimizer": True},
         None, 16),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, plan_args, want, layers, world in cases:
            # the plan's device (see the docstring): B200 is compute capability 10.0
            arch = 10 if "dgx-b200" in plan_args else 9
            torch.cuda.get_device_capability = lambda device=None, a=arch: (a, 0)
            arguments.get_device_arch_version = lambda a=arch: a
            out, flags = export_flags(parallax, plan_args, tmp)
            print(f"{name}: {len(flags)} tokens of Megatron flags")
            print("\n".join("  " + l for l in out.splitlines() if l.startswith("#")))
            # the environment the export's comments ask for
            if "export CUDA_DEVICE_MAX_CONNECTIONS=1" in out:
                os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
            else:
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
            os.environ["WORLD_SIZE"] = str(world)
            os.environ["RANK"] = "0"
            sys.argv = ["pretrain_gpt.py", *flags,
                        # not the plan's business, but parse_args/validate_args need them
                        "--tokenizer-type", "NullTokenizer", "--vocab-size", "129280",
                        "--mock-data"]
            try:
                args = arguments.parse_args()
                print(f"  parse_args: ok (world size {args.world_size})")
                arguments.validate_args(args, {})
                print("  validate_args: ok")
            except SystemExit as e:
                print(f"FAILED {name}: the parser exited ({e.code}) on the exported flags")
                return 1
            except (AssertionError, ValueError, TypeError, KeyError) as e:
                print(f"FAILED {name}: {type(e).__name__}: {e}")
                return 1
            for k, v in want.items():
                check(name, args, k, v)
            if layers is not None:
                check(name, args, "moe_layer_freq", layers)
    print("megatron_args: every export parses and validates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
