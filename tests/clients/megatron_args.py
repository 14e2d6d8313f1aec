#!/usr/bin/env python3
"""Checks parallax's Megatron-LM export with Megatron-LM's own argument parser.

Usage: [MEGATRON_LM=<Megatron-LM checkout>] PYTHON tests/clients/megatron_args.py PARALLAX [NAME...]

For every plan of tests/clients/plans.txt and the MoE and FP8 layouts of megatron_expect.EXTRA,
it exports the plan with `parallax export --format megatron`, sources the export in a clean
bash (the environment it sets and its MEGATRON_ARGS array), runs megatron/training/arguments.py's
parse_args on the array with the plan's world size, then validate_args with that environment,
builds the tokenizer the flags name (Megatron-Core's build_tokenizer, which pads the
vocabulary), checks an explicit pipeline layout with PipelineParallelLayerLayout, and compares
the values Megatron-LM ends up with against the plan (megatron_expect.py); first it breaks good
exports in the ways of megatron_expect.BREAKAGES, each of which Megatron-LM must reject (the
rules megatron_fixture.py mirrors, shown by Megatron-LM itself). One line per plan:
"ok NAME" or "FAILED NAME: ..." with Megatron-LM's own message; exit 1 when any failed, 77
(skipped) when torch cannot be imported or no Megatron-LM can be had. NAMEs limit the plans.

Which Megatron-LM: the checkout MEGATRON_LM names, else the megatron-core wheel of PyPI
(MEGATRON_CORE below), which carries megatron/training since core_v0.17.0, downloaded with pip
once into the clients' cache. The Python is scripts/clients.sh megatron's (torch and packaging;
tests/clients/megatron.txt). Checked against Megatron-LM d98e8a64 (NVIDIA/Megatron-LM,
2026-08-22) and megatron-core 0.19.2.

What is stubbed, and nothing else:
  - typing.override, when the Python is older than 3.12 (Megatron-LM imports it from typing;
    it is a no-op decorator);
  - the world size: parse_args takes args.world_size from the WORLD_SIZE that torchrun sets;
    it is set to the plan's GPUs here;
  - torch.cuda.get_device_capability, which validate_args calls for --moe-grouped-gemm and which
    needs a GPU driver, and megatron.training.arguments.get_device_arch_version (read for tp or
    cp > 1 to decide on CUDA_DEVICE_MAX_CONNECTIONS): both return the plan's device, 8 for
    A100, 9 for H100, 10 for B200.
No other GPU, NCCL or torch.distributed call is made.
"""
import contextlib
import io
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the helpers below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_expect  # noqa: E402


def check_one(arguments, torch, name, plan, text, extra):
    """The problems Megatron-LM finds with one export (an empty list: none)."""
    arch = megatron_expect.device_arch(plan)
    torch.cuda.get_device_capability = lambda device=None, a=arch: (a, 0)
    arguments.get_device_arch_version = lambda a=arch: a
    try:
        env, flags = megatron_expect.source(text)
    except ValueError as e:
        return [str(e)]
    os.environ["WORLD_SIZE"] = str(plan["gpus"])
    os.environ["RANK"] = "0"
    # the data source is the user's; --mock-data stands for it
    sys.argv = ["pretrain_gpt.py", *flags, "--mock-data"]
    # from a shell without CUDA_DEVICE_MAX_CONNECTIONS, then from one that had it at 1
    for before in (None, "1"):
        megatron_expect.apply_env(env, before)
        shell = "" if before is None else " (in a shell with CUDA_DEVICE_MAX_CONNECTIONS=1)"
        said = io.StringIO()  # argparse's usage and error, of which the error line is kept
        try:
            with contextlib.redirect_stderr(said):
                args = arguments.parse_args()
            arguments.validate_args(args, {})
        except SystemExit as e:
            error = [l for l in said.getvalue().splitlines() if ": error: " in l]
            return [f"parse_args exited ({e.code}){shell}: " +
                    (error[-1].split(": error: ", 1)[1] if error else "no message")]
        except (AssertionError, ValueError, TypeError, KeyError, RuntimeError) as e:
            return [f"validate_args{shell}: {type(e).__name__}: {e}"]
    problems = megatron_expect.compare(args, plan, extra)
    if getattr(args, "pipeline_model_parallel_layout", None):
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout)
        try:
            PipelineParallelLayerLayout(args.pipeline_model_parallel_layout,
                                        args.pipeline_model_parallel_size).validate_layer_layout(
                args.num_layers, args.mtp_num_layers)
        except AssertionError as e:
            problems.append(f"PipelineParallelLayerLayout: {e}")
    if getattr(args, "tokenizer_type", None):
        from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
        try:
            build_tokenizer(args)
            if args.padded_vocab_size != plan["training"]["vocab_padded"]:
                problems.append(f"padded vocabulary {args.padded_vocab_size}, the plan's is "
                                f"{plan['training']['vocab_padded']}")
        except Exception as e:  # what the tokenizer says is the verdict
            problems.append(f"build_tokenizer: {type(e).__name__}: {e}")
    return problems


# The megatron-core release whose wheel carries megatron/training (since Megatron-LM 9088d4fb,
# core_v0.17.0): the Megatron-LM the check runs when MEGATRON_LM names no checkout.
MEGATRON_CORE = "0.19.2"


def megatron_core_from_pypi():
    """The megatron-core wheel from PyPI, unpacked once into the clients' cache; its folder, or
    None (with a message) when it cannot be had. The wheel is built for Python 3.12 (its one
    compiled module, the dataset helpers, is never imported here) and megatron-core asks for
    3.12, so pip downloads it for that version and the check runs its Python files on the
    clients' Python with typing.override stubbed (see the docstring)."""
    import subprocess
    import zipfile
    cache = os.environ.get("PARALLAX_CLIENTS_DIR") or os.path.expanduser("~/.cache/parallax/clients")
    root = os.path.join(cache, f"megatron-core-{MEGATRON_CORE}")
    done = os.path.join(root, ".unpacked")
    if os.path.isfile(done):
        return root
    wheels = os.path.join(cache, "wheels")
    os.makedirs(wheels, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                        "--no-deps", "--only-binary", ":all:", "--python-version", "3.12",
                        "-d", wheels, f"megatron-core=={MEGATRON_CORE}"],
                       capture_output=True, text=True)
    found = [w for w in os.listdir(wheels) if w.startswith(f"megatron_core-{MEGATRON_CORE}-")]
    if r.returncode != 0 or not found:
        print(f"megatron_args: skipped: no MEGATRON_LM checkout, and megatron-core=={MEGATRON_CORE} "
              f"cannot be downloaded: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
        return None
    with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
        z.extractall(root)
    open(done, "w").close()  # last, so that an interrupted unpacking is started over
    return root


def quiet(f, *args):
    """f(*args) with standard output discarded: validate_args prints every argument."""
    with open(os.devnull, "w") as null:
        saved, sys.stdout = sys.stdout, null
        try:
            return f(*args)
        finally:
            sys.stdout = saved


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    only = set(sys.argv[2:])
    root = os.environ.get("MEGATRON_LM")
    if root and not os.path.isfile(os.path.join(root, "megatron/training/arguments.py")):
        print(f"megatron_args: MEGATRON_LM={root} has no megatron/training/arguments.py")
        return 2
    if not root:
        root = megatron_core_from_pypi()
        if not root:
            return 77
    print(f"megatron_args: Megatron-LM from {root}")
    try:
        import torch
    except ImportError as e:
        print(f"megatron_args: skipped: torch cannot be imported ({e}); "
              "use the Python of scripts/clients.sh megatron")
        return 77
    import typing
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python < 3.12: see the docstring
    sys.path.insert(0, root)
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from megatron.training import arguments

    failed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        missed = megatron_expect.self_check(
            lambda n, p, t: quiet(check_one, arguments, torch, n, p, t, {}), parallax, tmp)
        for m in missed:
            print(f"FAILED self-check: {m}")
        print(f"megatron_args: {len(megatron_expect.BREAKAGES) - len(missed)}/"
              f"{len(megatron_expect.BREAKAGES)} broken exports rejected")
        for name, plan, text, extra in megatron_expect.cases(parallax, tmp, only):
            total += 1
            problems = quiet(check_one, arguments, torch, name, plan, text, extra)
            if problems:
                failed += 1
                print(f"FAILED {name}: " + "; ".join(problems))
            else:
                print(f"ok {name}")
    print(f"megatron_args: Megatron-LM accepted {total - failed}/{total} exports")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
