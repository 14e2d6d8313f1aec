#!/usr/bin/env python3
"""Checks parallax's Megatron-LM export without a Megatron-LM checkout: against a fixture taken
from Megatron-LM's own parser, and the rules of its validate_args that parallax's exports rely
on, written here.

Usage: PYTHON tests/clients/megatron_fixture.py PARALLAX [FIXTURE] [NAME...]

FIXTURE (default: the megatron_args_*.json beside this file) is what megatron_fixture_gen.py
took from Megatron-LM's parser: every option with its dest, action, type, choices, nargs and
default. An argparse parser is built from it, as strict as Megatron-LM's (allow_abbrev off;
an unknown flag, a value of the wrong type or outside the choices is an error), and for every
plan of tests/clients/plans.txt and of megatron_expect.EXTRA the export is sourced in a clean bash, its MEGATRON_ARGS parsed,
the rules below applied with the environment it sets, and the values compared with the plan
(megatron_expect.py). One line per plan: "ok NAME" or "FAILED NAME: ..."; exit 1 when any
failed. First it breaks good exports in the ways of megatron_expect.BREAKAGES and requires
each to fail. megatron_args.py runs the real parse_args and validate_args where a checkout exists;
this check is what CI runs everywhere else.

Each rule cites the line of megatron/training/arguments.py at the fixture's commit (d98e8a64)
it mirrors, or the Megatron-Core file.
"""
import argparse
import ast
import glob
import json
import math
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the helpers below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_expect  # noqa: E402


class Rejected(Exception):
    """What Megatron-LM would say on these flags."""


# ---- the parser, from the fixture ----

def eval_pattern(text):
    """arguments.py _eval_pattern (line 245): a Python list expression of digits, commas,
    brackets, parentheses, + and *. Evaluated here as a literal tree, not by eval."""
    import re
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"Invalid pattern: {text}")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a * b
        raise ValueError(f"Invalid pattern: {text}")
    return ev(ast.parse(text, mode="eval"))


def freq_type(x):
    """moe_freq_type (line 327), no_rope_freq_type (304) and la_freq_type (352): an int, or a
    list pattern."""
    return eval_pattern(x) if "[" in x else int(x)


def tuple_type(x):
    """tuple_type (line 377): "1,2,3" or "(1,2,3)"."""
    return tuple(int(i) for i in x.strip("()").split(","))


CONVERTERS = {"int": int, "float": float, "str": str, "bool": bool,
              "moe_freq_type": freq_type, "no_rope_freq_type": freq_type,
              "la_freq_type": freq_type, "tuple_type": tuple_type}


def unknown_type(name):
    def convert(x):
        raise argparse.ArgumentTypeError(f"this check has no converter for Megatron's type {name}")
    return convert


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Rejected(f"parse_args: {message}")


def build_parser(fixture):
    p = Parser(prog="pretrain_gpt.py", allow_abbrev=fixture["allow_abbrev"], add_help=False)
    actions = {"store": "store", "store_true": "store_true", "store_false": "store_false",
               "store_const": "store_const", "append": "append", "count": "count",
               "boolean_optional": argparse.BooleanOptionalAction}
    for o in fixture["options"]:
        kw = {"dest": o["dest"], "action": actions[o["action"]], "default": o["default"]}
        t = o.get("type")
        if t is not None:
            # an Enum's members are given by name: its choices are the names
            kw["type"] = str if t.startswith("enum:") else CONVERTERS.get(t) or unknown_type(t)
        for key in ("choices", "nargs", "const"):
            if key in o:
                kw[key] = o[key]
        if o.get("required"):
            kw["required"] = True
        p.add_argument(*o["flags"], **kw)
    return p


# ---- the rules of validate_args parallax relies on ----

def validate(a, env, world, arch):
    """Applies the rules to the parsed namespace a (changing it as validate_args does); raises
    Rejected with Megatron-LM's words where it would assert."""
    def need(cond, why):
        if not cond:
            raise Rejected(f"validate_args: {why}")

    a.world_size = world
    model = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    need(world % model == 0,                                                   # line 432
         f"world size ({world}) is not divisible by total_model_size ({model})")
    a.data_parallel_size = world // model                                      # line 448
    if a.expert_tensor_parallel_size is None:                                  # line 588
        a.expert_tensor_parallel_size = a.tensor_model_parallel_size
    pp = a.pipeline_model_parallel_size
    # uneven and virtual pipelines (lines 929-1019)
    need(int(a.num_layers_per_virtual_pipeline_stage is not None)              # line 929
         + int(a.num_virtual_stages_per_pipeline_rank is not None)
         + int(a.pipeline_model_parallel_layout is not None) <= 1,
         "No more than one of the following arguments can be set at the same time: "
         "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
         "--pipeline-model-parallel-layout.")
    a.virtual_pipeline_model_parallel_size = None
    if a.pipeline_model_parallel_layout is not None:
        stages = megatron_expect.parse_layout(a.pipeline_model_parallel_layout)
        need(len(stages) % pp == 0,                                            # line 945
             "The length of pipeline_model_parallel_layout must be divisible by "
             "pipeline_model_parallel_size")
        a.virtual_pipeline_model_parallel_size = len(stages) // pp or None     # line 950
        if a.virtual_pipeline_model_parallel_size == 1:
            a.virtual_pipeline_model_parallel_size = None
        # PipelineParallelLayerLayout.validate_layer_layout (Megatron-Core
        # transformer/pipeline_parallel_layer_layout.py), which TransformerConfig runs
        flat = [s for stage in stages for s in stage]
        need(set(flat) <= set("EtmL"), f"{a.pipeline_model_parallel_layout}: layer symbols are E, t, m, L")
        need(flat[:1] == ["E"] and flat[-1:] == ["L"] and flat.count("E") == 1 and flat.count("L") == 1,
             "The first layer must be embedding and the last loss, each exactly once")
        need(flat.count("t") == a.num_layers,
             f"Number of decoder layers {flat.count('t')} must match num_layers {a.num_layers}")
        need(flat.count("m") == (a.mtp_num_layers or 0),
             "Number of mtp layers in layout must match mtp_num_layers")
    elif a.num_virtual_stages_per_pipeline_rank is not None:                  # line 978
        a.virtual_pipeline_model_parallel_size = a.num_virtual_stages_per_pipeline_rank
        if a.virtual_pipeline_model_parallel_size == 1:
            a.virtual_pipeline_model_parallel_size = None
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        need(a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None,
             "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
             "parallel degree when enable uneven pipeline parallelism")          # line 956
        need(a.num_layers % pp == 0,                                           # line 969
             "number of layers of the model must be divisible pipeline model parallel size")
        per_stage = a.num_layers // pp
        need(per_stage % a.num_layers_per_virtual_pipeline_stage == 0,         # line 973
             "number of layers per pipeline stage must be divisible number of layers per "
             "virtual pipeline stage")
        vpp = per_stage // a.num_layers_per_virtual_pipeline_stage             # line 974
        a.virtual_pipeline_model_parallel_size = vpp if vpp > 1 else None
    if (a.pipeline_model_parallel_layout is None and a.num_virtual_stages_per_pipeline_rank is None
            and a.num_layers_per_virtual_pipeline_stage is None
            and a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None):
        counted = a.num_layers + bool(a.account_for_embedding_in_pipeline_split) \
            + bool(a.account_for_loss_in_pipeline_split)
        need(counted % pp == 0,                                                # line 998
             "Number of layers should be divisible by the pipeline-model-parallel size")
    elif (a.pipeline_model_parallel_layout is not None or a.num_virtual_stages_per_pipeline_rank is not None
          or a.num_layers_per_virtual_pipeline_stage is not None):
        pass
    else:
        # TransformerConfig.__post_init__, "Uneven PP" (Megatron-Core transformer_config.py)
        rest, middle = a.num_layers, pp
        for n in (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers):
            if n is not None:
                need(n > 0, "num_layers_in_first/last_pipeline_stage must be larger than 0")
                rest, middle = rest - n, middle - 1
        need(bool(rest) == bool(middle),
             f"Mismatch: {rest} middle layers remaining but {middle} middle PP stages available.")
        need(not middle or rest % middle == 0,
             f"number of layers at middle stage: {rest} must be divisible by the middle "
             f"pipeline model parallel size {middle}")
    if a.virtual_pipeline_model_parallel_size is not None:
        need(pp > 1 if a.overlap_p2p_comm else pp > 2,                         # line 1008
             "When interleaved schedule is used and p2p communication overlap is disabled, "
             "pipeline-model-parallel size should be greater than 2")
    if a.overlap_param_gather:                                                 # line 1027
        need(a.use_distributed_optimizer or a.use_megatron_fsdp,
             "--overlap-param-gather only supported with distributed optimizer, megatron fsdp, "
             "or dist_muon")
        need(a.overlap_grad_reduce, "Must use --overlap-param-gather with --overlap-grad-reduce")
    if a.fp8_param_gather:                                                     # line 1097
        need(a.use_distributed_optimizer or a.use_torch_fsdp2 or a.use_megatron_fsdp,
             "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
             "megatron fsdp, or inference mode")
    if a.use_megatron_fsdp:                                                    # line 1118
        if a.megatron_fsdp_version != 2:
            a.use_distributed_optimizer = True                                 # line 1135
        need(a.optimizer in ("sgd", "adam"),                                   # line 1151
             f"Megatron-FSDP does not support the {a.optimizer} optimizer yet.")
        need(env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1",                    # line 1167
             "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.")
        need(a.ckpt_format == "fsdp_dtensor",                                  # line 1170
             "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.")
    need(not (a.fp16 and a.bf16), "--fp16 and --bf16 together")               # lines 1196, 1205
    if a.kv_channels is None:                                                  # line 1333
        need(a.hidden_size % a.num_attention_heads == 0, "hidden size not divisible by heads")
        a.kv_channels = a.hidden_size // a.num_attention_heads
    if a.seq_length is not None and a.context_parallel_size > 1:               # line 1337
        need(a.seq_length % (a.context_parallel_size * 2) == 0,
             "seq-length should be a multiple of 2 * context-parallel-size if "
             "context-parallel-size > 1.")
    need(a.max_position_embeddings is not None, "max_position_embeddings is required")
    if a.seq_length is not None:                                               # line 1355
        need(a.max_position_embeddings >= a.seq_length,
             f"max_position_embeddings ({a.max_position_embeddings}) must be greater than "
             f"or equal to seq_length ({a.seq_length}).")
    if a.lr is not None:
        need(a.min_lr <= a.lr, "min_lr > lr")                                  # line 1360
    if a.moe_grouped_gemm:                                                     # line 1380
        need(arch >= 8, "Unsupported compute capability for GroupedGEMM kernels.")
    if a.recompute_granularity == "selective":                                 # line 1427
        need(a.recompute_method is None,
             "recompute method is not yet supported for selective recomputing granularity")
    if a.tensor_model_parallel_size == 1:                                      # line 1439
        a.sequence_parallel = False
    if a.tp_comm_overlap:                                                      # line 1442
        need(a.sequence_parallel, "Tensor parallel communication/GEMM overlap can happen only "
             "when sequence parallelism is enabled")
    if (a.tensor_model_parallel_size > 1 or a.context_parallel_size > 1) and arch < 10:
        # line 1454: Megatron FSDP and the MoE overlap only warn; everything else asserts
        if not (a.use_torch_fsdp2 or a.use_megatron_fsdp or a.overlap_moe_expert_parallel_comm):
            need(env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",                # line 1479
                 "Using tensor model parallelism or context parallelism require setting the "
                 "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    if a.add_bias_linear:                                                      # line 1610
        a.add_qkv_bias = True
    if a.num_experts == 0:
        a.num_experts = None
    if a.expert_model_parallel_size > 1:                                       # line 1658
        need(a.num_experts is not None, "num_experts must be non None to use expert model parallelism")
        need(a.num_experts % a.expert_model_parallel_size == 0,
             "Number of experts should be a multiple of expert model parallel_size.")
    if a.ckpt_format == "fsdp_dtensor":                                        # line 1676
        need(a.use_megatron_fsdp, "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.")
    if a.mtp_num_layers:                                                       # line 1944
        need(a.position_embedding_type in ("learned_absolute", "rope", "mrope", "none"),
             "Multi-Token Prediction (MTP) is not supported with this position embedding type")
    if a.multi_latent_attention:                                               # line 1974
        need(not a.group_query_attention,
             "Group query attention is mutually exclusive with multi latent attention.")
    # the micro-batch calculator (Megatron-Core num_microbatches_calculator.py,
    # ConstantNumMicroBatchesCalculator) at initialization
    need(a.global_batch_size % (a.micro_batch_size * a.data_parallel_size) == 0,
         f"global batch size ({a.global_batch_size}) is not divisible by micro batch size "
         f"({a.micro_batch_size}) times data parallel size ({a.data_parallel_size})")
    # build_tokenizer (Megatron-Core tokenizers/utils/build_tokenizer.py): NullTokenizer needs
    # --vocab-size, and vocab_size_with_padding pads it to make_vocab_size_divisible_by x tp
    if a.tokenizer_type == "NullTokenizer":
        need(a.vocab_size, "NullTokenizer needs --vocab-size")
        m = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
        a.padded_vocab_size = int(math.ceil(a.vocab_size / m) * m)


def check_one(parser, name, plan, text, extra):
    try:
        env, flags = megatron_expect.source(text)
    except ValueError as e:
        return [str(e)]
    arch = megatron_expect.device_arch(plan)
    problems = []
    try:
        for before in (None, "1"):  # as megatron_args.py: without it, then from a shell with it at 1
            shell = {} if before is None else {"CUDA_DEVICE_MAX_CONNECTIONS": before}
            shell.update(env)
            shell = {k: v for k, v in shell.items() if v is not None}
            args = parser.parse_args(flags + ["--mock-data"])
            try:
                validate(args, shell, plan["gpus"], arch)
            except Rejected as e:
                suffix = "" if before is None else " (in a shell with CUDA_DEVICE_MAX_CONNECTIONS=1)"
                raise Rejected(str(e) + suffix)
    except Rejected as e:
        return [str(e)]
    problems += megatron_expect.compare(args, plan, extra)
    if getattr(args, "padded_vocab_size", None) != plan["training"]["vocab_padded"]:
        problems.append(f"padded vocabulary {getattr(args, 'padded_vocab_size', None)}, the plan's is "
                        f"{plan['training']['vocab_padded']}")
    return problems


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    parallax = os.path.abspath(sys.argv[1])
    rest = sys.argv[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    if rest and rest[0].endswith(".json"):
        path, rest = rest[0], rest[1:]
    else:
        found = sorted(glob.glob(os.path.join(here, "megatron_args_*.json")))
        if len(found) != 1:
            print(f"megatron_fixture: expected one megatron_args_*.json in {here}, found {len(found)}")
            return 2
        path = found[0]
    with open(path) as f:
        fixture = json.load(f)
    src = fixture["source"]
    print(f"megatron_fixture: {src['repository']} {src['commit'][:8]} ({src['date']}), "
          f"{len(fixture['options'])} options")
    parser = build_parser(fixture)
    failed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        missed = megatron_expect.self_check(lambda n, p, t: check_one(parser, n, p, t, {}),
                                            parallax, tmp)
        for m in missed:
            print(f"FAILED self-check: {m}")
        print(f"megatron_fixture: {len(megatron_expect.BREAKAGES) - len(missed)}/"
              f"{len(megatron_expect.BREAKAGES)} broken exports rejected")
        for name, plan, text, extra in megatron_expect.cases(parallax, tmp, set(rest)):
            total += 1
            problems = check_one(parser, name, plan, text, extra)
            if problems:
                failed += 1
                print(f"FAILED {name}: " + "; ".join(problems))
            else:
                print(f"ok {name}")
    print(f"megatron_fixture: {total - failed}/{total} exports pass Megatron-LM's parser and rules")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
