#!/usr/bin/env bash
# Bad input to the parallax CLI: every case must exit with the expected status (2 for input the
# user can fix) and print a message naming what is wrong. Usage: cli_bad_input.sh PARALLAX
set -u
px=${1:?usage: cli_bad_input.sh path/to/parallax}
tmp=$(mktemp -d)
# `local` is the generic profile here even where `parallax calibrate` has written this machine's
# (scripts/quickstart.sh does): a calibration changes the plans whose layouts the cases expect.
export PARALLAX_UNCALIBRATED=1
trap 'rm -rf "$tmp"' EXIT
fails=0 cases=0

# expect STATUS NEEDLE ARGS... : run parallax ARGS, check the exit status and that stderr or
# stdout contains NEEDLE.
expect() {
  local want=$1 needle=$2
  shift 2
  cases=$((cases + 1))
  local out
  out=$("$px" "$@" 2>&1)
  local got=$?
  if [ "$got" -ne "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAILED: parallax $*"
    echo "  expected status $want and '$needle'"
    echo "  got status $got: $(head -c 400 <<<"$out")"
    fails=$((fails + 1))
  fi
}

ok='--cluster dgx-a100 --gpus 8'
printf '{"name": "m", "family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/good.json"
printf '{"name": "m", "family": "gpt", "layers": 4,\n "hidden": 64,,}\n' >"$tmp/malformed.json"
printf '{"name": "m", "family": "gpt", "layers": 4, "hidden": 64, "vocab": 256, "seq_len": 64}\n' >"$tmp/missing.json"
printf '{"name": "m", "family": "gpt", "layers": "4", "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/type.json"
printf '{"name": "m", "family": "gpt", "layers": -4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/negative.json"
printf '{"name": "", "family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/noname.json"
printf '[1, 2, 3]\n' >"$tmp/array.json"
: >"$tmp/empty.json"
printf '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}\n' >"$tmp/config.json"
sed 's/"bandwidth_per_device": [0-9e.]*/"bandwidth_per_device": "fast"/' "$(dirname "$0")/../profiles/clusters/dgx-a100.json" >"$tmp/cl_type.json"
printf '{"name": "c", "device": "a100-80gb", "network": {"bandwidth_per_device": 1e10, "latency": 1e-6}}\n' >"$tmp/cl_missing.json"
printf '{"name": "c", "device": "no-such-gpu", "node": {"devices": 8, "link": {"bandwidth": 1e11, "latency": 1e-6}}, "network": {"bandwidth_per_device": 1e10, "latency": 1e-6}}\n' >"$tmp/cl_device.json"

# commands and options
expect 2 "unknown command 'simulat'" simulat
expect 2 "usage: parallax" 
expect 2 "--model, --cluster and --gpus are required" simulate --model tiny
expect 2 "unknown option '--tpp'" simulate --model tiny $ok --tpp 2
expect 2 "option '--tp' needs a value" simulate --model tiny $ok --tp
expect 2 "--tp: expected an integer, got 'two'" simulate --model tiny $ok --tp two
expect 2 "--gpus: must be between 1" simulate --model tiny --cluster dgx-a100 --gpus 0
expect 2 "--recompute: expected none, selective or full, got 'some'" simulate --model tiny $ok --recompute some
expect 2 "--precision: expected fp32, bf16, fp16 or fp8, got 'fp64'" simulate --model tiny $ok --precision fp64
expect 2 "--dropout: must be in [0, 1)" simulate --model tiny $ok --dropout 1.5
expect 2 "--fp8-recipe: expected delayed, tensorwise, blockwise, mxfp8 or none, got 'fp4'" simulate --model tiny $ok --fp8-recipe fp4
expect 2 "--fp8-format: expected hybrid or e4m3, got 'e5m2'" simulate --model tiny $ok --precision fp8 --fp8-format e5m2
expect 2 "FP8 parameter gathering needs an FP8 recipe" simulate --model tiny $ok --fp8-param-gather
# FP8 parameter gathering under ZeRO-3 is priced (torchao float8 with FSDP2)
expect 0 "param gather on" simulate --model tiny --cluster dgx-h100 --gpus 8 --precision fp8 --fp8-param-gather --zero 3
expect 2 "--fp8-amax-history: must be between 1" simulate --model tiny $ok --precision fp8 --fp8-amax-history 0
expect 2 "device a100-80gb has no FP8 tensor cores: FP8 training (--precision fp8, --fp8-recipe delayed) needs Hopper" simulate --model tiny $ok --precision fp8
expect 2 "device h100-sxm has no MXFP8 tensor cores: the mxfp8 recipe needs Blackwell" simulate --model tiny --cluster dgx-h100 --gpus 8 --fp8-recipe mxfp8
expect 2 "FP8 dispatch: model tiny has no experts" simulate --model tiny --cluster dgx-h100 --gpus 8 --precision fp8 --fp8-dispatch
expect 2 "FP8 dispatch needs an FP8 recipe" simulate --model tiny-moe --cluster dgx-h100 --gpus 8 --fp8-dispatch
# FP8 attention with the blockwise recipe is no job: Transformer Engine has no backend for it
expect 2 "FP8 attention has no blockwise recipe: Transformer Engine runs no attention backend with Float8BlockScaling (choose --fp8-recipe tensorwise, delayed or mxfp8 for FP8 attention, or drop --fp8-attention)" \
  simulate --model tiny --cluster dgx-h100 --gpus 8 --fp8-recipe blockwise --fp8-attention
expect 2 "FP8 attention has no blockwise recipe" plan --model tiny --cluster dgx-h100 --gpus 8 --gbs 8 \
  --fp8-recipe blockwise --fp8-attention -o "$tmp/bwatt.json"
# and with MXFP8 on shapes Transformer Engine's MXFP8 attention asserts against
expect 2 "FP8 attention under mxfp8 needs a sequence of a multiple of 128 and head widths of multiples of 32 (Transformer Engine's MXFP8 attention blocks Q, K and V by 32 along both), got sequence 64, query/key head width 16, value head width 16" \
  simulate --model tiny --cluster dgx-b200 --gpus 8 --fp8-recipe mxfp8 --fp8-attention
# FP8 attention with context parallelism needs the fused core: TE's CP never runs the unfused one
expect 2 "cp 2 with --fp8-attention runs the fused attention core (Transformer Engine's context parallelism takes FP8 attention with FusedAttention only): keep --flash-attn, or drop --fp8-attention" \
  simulate --model tiny-llama --cluster dgx-h100 --gpus 2 --cp 2 --cp-comm-type allgather --no-flash-attn --fp8-recipe tensorwise --fp8-attention
expect 2 "device a100-80gb has no FP8 tensor cores" plan --model tiny $ok --gbs 8 --precision fp8 -o "$tmp/fp8.json"
expect 2 "unexpected argument 'extra'" simulate --model tiny $ok extra
expect 2 "unexpected argument 'x'" models x

# model files
expect 2 "unknown model 'gpt5'" simulate --model gpt5 $ok
expect 2 "malformed JSON near line 2" simulate --model "$tmp/malformed.json" $ok
expect 2 "heads: missing required key" simulate --model "$tmp/missing.json" $ok
expect 2 "layers: expected an integer, got a string" simulate --model "$tmp/type.json" $ok
expect 2 "layers: must be between 1" simulate --model "$tmp/negative.json" $ok
expect 2 "expected a JSON object" simulate --model "$tmp/array.json" $ok
expect 2 "name: expected a non-empty name" simulate --model "$tmp/noname.json" $ok
expect 2 "empty file" simulate --model "$tmp/empty.json" $ok
expect 2 "not a regular file" simulate --model "$tmp/" $ok
# multi-head latent attention has no key/value groups: kv_heads other than heads is refused by
# the loader, so nothing prices it
sed 's/"kv_heads": 4/"kv_heads": 2/' "$(dirname "$0")/../model/zoo/tiny-dsv3.json" >"$tmp/mla_kv.json"
expect 2 "kv_heads 2 must equal heads 4 with multi-head latent attention (mla.kv_lora_rank 16)" \
  simulate --model "$tmp/mla_kv.json" $ok

# cluster files and overrides
expect 2 "unknown cluster 'dgx-z100'" simulate --model tiny --cluster dgx-z100 --gpus 8
expect 2 "network.bandwidth_per_device: expected a number, got a string" simulate --model tiny --cluster "$tmp/cl_type.json" --gpus 8
expect 2 "node: missing required key" simulate --model tiny --cluster "$tmp/cl_missing.json" --gpus 8
expect 2 "unknown device 'no-such-gpu'" simulate --model tiny --cluster "$tmp/cl_device.json" --gpus 8
expect 2 "--set network.speed: no key 'speed' in the profile's network; its keys: network.bandwidth_per_device, network.latency, network.efficiency" simulate --model tiny $ok --set network.speed=1
expect 2 "--set cluster.bw: no key 'cluster' in the profile; its keys: device.*, node.*, network.*, nodes, overlap.*, host.*" plan --model tiny --cluster dgx-h100 --gpus 8 --gbs 64 --set cluster.bw=1
expect 2 "--set cluster.nodes: no key 'cluster' in the profile; its keys: device.*, node.*, network.*, nodes, overlap.*, host.*; did you mean nodes?" simulate --model tiny $ok --set cluster.nodes=2048
expect 2 "--set 'network.latency': expected key=value" simulate --model tiny $ok --set network.latency
expect 2 "8192 GPUs exceed cluster dgx-a100: 560 nodes of 8 (4480 GPUs); for a larger cluster of these nodes add --set nodes=1024" simulate --model gpt3-175b --cluster dgx-a100 --gpus 8192 --tp 8
expect 2 "16384 GPUs exceed cluster dgx-h100: 576 nodes of 8 (4608 GPUs); for a larger cluster of these nodes add --set nodes=2048" plan --model llama3-405b --cluster dgx-h100 --gpus 16384 --gbs 2048
expect 0 "llama3-405b on dgx-h100: 16384 x h100-sxm" plan --model llama3-405b --cluster dgx-h100 --gpus 16384 --gbs 2048 --tp 8 --pp 16 --top 1 --set nodes=2048

# impossible layouts: one line naming the rule
expect 2 "tp 3 must divide the 4 attention heads" simulate --model tiny --cluster dgx-a100 --gpus 3 --tp 3
expect 2 "--cp-comm-type: expected p2p, allgather or a2a, got 'ring'" simulate --model tiny $ok --cp 2 --cp-comm-type ring
expect 2 "cp comm type a2a needs cp 8 to divide the 4 attention heads per tp rank (4 heads / tp 1)" \
  simulate --model tiny $ok --cp 8 --cp-comm-type a2a
expect 2 "cp comm type a2a needs cp 4 to divide the 2 key/value heads per tp rank (4 key/value heads / tp 2)" \
  simulate --model tiny-llama $ok --tp 2 --cp 4 --cp-comm-type a2a
expect 2 "pp 3 x vpp 1 = 3 must divide the 4 layers" simulate --model tiny --cluster dgx-a100 --gpus 3 --pp 3
expect 2 "= 8 does not equal the 6 GPUs" simulate --model tiny --cluster dgx-a100 --gpus 6 --tp 2 --dp 4
expect 2 "does not divide the 6 GPUs" simulate --model tiny --cluster dgx-a100 --gpus 6 --tp 4
expect 2 "global batch 10 must be divisible by micro-batch 4 x dp 8 = 32" simulate --model tiny $ok --mbs 4 --gbs 10
expect 2 "interleaved schedule needs vpp >= 2" simulate --model tiny $ok --pp 2 --schedule interleaved
expect 2 "sequence parallelism needs tp > 1" simulate --model tiny $ok --sp
expect 2 "sequence length 128 exceeds the 64 learned positions" simulate --model tiny $ok --seq 128

# plan and export
expect 2 "--model, --cluster, --gpus and --gbs are required" plan --model tiny --cluster local --gpus 2
expect 2 "--gpus: expected an integer, got 'two'" plan --model tiny --cluster local --gpus two --gbs 8
expect 2 "--gpus: empty or overlong item" plan --model tiny --cluster local --gpus 2,,4 --gbs 8
expect 2 "--objective: expected time, cost or tokens-per-gpu, got 'speed'" plan --model tiny --cluster local --gpus 2 --gbs 8 --objective speed
expect 2 "--headroom: must be in [0, 1)" plan --model tiny --cluster local --gpus 2 --gbs 8 --headroom 1.5
expect 2 "does not fit in device memory" plan --model gpt3-175b --cluster dgx-a100 --gpus 8 --gbs 8
expect 2 "pinned degrees do not divide" plan --model tiny --cluster local --gpus 4 --gbs 8 --tp 3
# the degrees divide the GPUs: the layers do not split over pp x vpp
expect 2 "no layout of deepseek-v3 on 2048 GPUs: pp 8 x vpp 4 = 32 virtual stages cannot split its 61 layers evenly (nor 62 or 63 with the embedding and/or the loss counted as layers); a vpp that can with pp 8: 1 (an uneven split, balanced); or give each virtual stage its layers, e.g. --pipeline-model-parallel-layout 'Et|(tt|)*30,mL'" plan --model deepseek-v3 --cluster dgx-h100 --gpus 2048 --gbs 4096 --pp 8 --vpp 4
expect 2 "a vpp that can with pp 16: 1 (an uneven split, balanced), 2, 4, 8; or give each virtual stage its layers, e.g. --pipeline-model-parallel-layout 'Et|(tt|)*14,(t*3|)*32,tL'" plan --model llama3-405b --cluster dgx-h100 --gpus 2048 --gbs 4096 --pp 16 --vpp 3
# --tokens: counts as people write them; anything else named
expect 2 "--tokens: expected a count such as 15T, 300B, 2.5M or 1.5e12 (K, M, B, T: thousand to trillion), got '15X'" simulate --model tiny $ok --tokens 15X
expect 2 "--tokens: expected a count such as 15T, 300B, 2.5M or 1.5e12 (K, M, B, T: thousand to trillion), got '15TB'" plan --model tiny --cluster local --gpus 2 --gbs 8 --tokens 15TB
expect 2 "--tokens: must be positive, got '-5T'" simulate --model tiny $ok --tokens -5T
expect 0 "training on 15.0 T tokens" simulate --model tiny $ok --tokens 15T
expect 0 "training on 300.0 B tokens" simulate --model tiny $ok --tokens 300b
expect 0 "training on 1.50 T tokens" simulate --model tiny $ok --tokens 1.5e12
expect 0 "training on 2.50 M tokens" simulate --model tiny $ok --tokens 2.5M
expect 0 "training on 7.00 K tokens" simulate --model tiny $ok --tokens 7k
expect 2 "-o writes one plan" plan --model tiny --cluster local --gpus 2,4 --gbs 8 -o "$tmp/p.json"
expect 2 "--min-gpus needs --max-step-s and/or --max-days" plan --model tiny --cluster local --gpus 2 --gbs 8 --min-gpus
expect 2 "--max-days needs --tokens" plan --model tiny --cluster local --gpus 2 --gbs 8 --min-gpus --max-days 3
expect 2 "--min-gpus takes one --gpus, the least to try; got 2" plan --model tiny --cluster local --gpus 1,2 --gbs 8 --min-gpus --max-step-s 1
expect 2 "the closest, 4096 GPUs, takes" plan --model llama3-8b --cluster dgx-h100 --gpus 4096 --gbs 4096 --min-gpus --max-step-s 1e-3
expect 2 "--gpu-hour-price applies to --objective cost" plan --model tiny --cluster local --gpus 2 --gbs 8 --gpu-hour-price 2
expect 2 "--gpu-hour-price: give one price, or one per cluster (2), got 3" plan --model tiny --cluster local,dgx-a100 --gpus 2 --gbs 8 --objective cost --gpu-hour-price 1,2,3
expect 2 "--gpu-hour-price: must be positive, got -1" plan --model tiny --cluster local --gpus 2 --gbs 8 --objective cost --gpu-hour-price -1
expect 2 "(pinned: tp 3; tp x pp x cp x dp must equal the GPUs)" plan --model tiny --cluster local --gpus 4 --gbs 8 --tp 3
expect 0 "wrote $tmp/p.json" plan --model tiny --cluster local --gpus 2 --gbs 8 -o "$tmp/p.json"
expect 0 "--tensor-model-parallel-size" export "$tmp/p.json" --format megatron
expect 0 '"zero_optimization"' export "$tmp/p.json" --format deepspeed
expect 0 "model.tensor_model_parallel_size" export "$tmp/p.json" --format nemo
expect 2 "a plan file and --format are required" export "$tmp/p.json"
expect 2 "--format: expected megatron, deepspeed, nemo, bridge, torchtitan, torchtitan-toml or slurm, got 'jax'" export "$tmp/p.json" --format jax
expect 2 "cannot open" export "$tmp/none.json" --format megatron
expect 2 "malformed JSON" export "$tmp/malformed.json" --format megatron
grep -v '"layout"' "$tmp/p.json" | sed -E 's/^[[:space:]]*"(dp|tp|pp|cp|vpp|zero|sp|recompute|schedule|overlap_dp|overlap_tp)":.*$//' >"$tmp/nolayout.json"
expect 2 "" export "$tmp/nolayout.json" --format megatron
printf '{"schema_version": 1, "cluster": "local", "gpus": 1, "model": {"name": "m", "family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}, "training": {"global_batch": 8, "micro_batch": 4, "seq_len": 64, "precision": "fp32"}}\n' >"$tmp/nolayout.json"
expect 2 "layout: missing required key" export "$tmp/nolayout.json" --format megatron
sed -E 's/"tp":[[:space:]]*[0-9]+/"tp": 3/' "$tmp/p.json" >"$tmp/badlayout.json"
expect 2 "the layout breaks a rule: tp 3 x pp 1 x cp 1 x dp 2 = 6 does not equal the 2 GPUs" export "$tmp/badlayout.json" --format megatron

# uneven pipeline splits: every bad value named, exit 2
expect 2 "--pp-layers '1,0,3': entry 2 is 0: every stage needs at least one layer" simulate --model tiny --cluster local --gpus 3 --pp-layers 1,0,3
expect 2 "--pp-layers: expected layers per stage such as 1,3, got '1,x'" simulate --model tiny --cluster local --gpus 2 --pp-layers 1,x
expect 2 "entry 2 is -2" plan --model tiny --cluster local --gpus 2 --gbs 8 --pp-layers 6,-2
expect 2 "stage_layers 2,3 sums to 5 layers: the model has 4" simulate --model tiny --cluster local --gpus 2 --pp-layers 2,3
expect 2 "--pp-layers: stage_layers 2,3 sums to 5 layers: the model has 4" plan --model tiny --cluster local --gpus 2 --gbs 8 --pp-layers 2,3
expect 2 "stage_layers 1,3 has 2 entries: pp is 4" simulate --model tiny --cluster local --gpus 4 --pp 4 --pp-layers 1,3
expect 2 "stage_layers 1,3 has 2 entries: pp 2 x vpp 2 = 4" simulate --model tiny --cluster local --gpus 2 --gbs 8 --pp-layers 1,3 --vpp 2
expect 2 "pipeline layout 'Et|tq|t*2L': character 5 ('q')" simulate --model tiny --cluster local --gpus 2 --gbs 8 --pp 2 --pipeline-model-parallel-layout 'Et|tq|t*2L'
expect 2 "give one way to split the pipeline" simulate --model tiny --cluster local --gpus 2 --gbs 8 --pp 2 --pipeline-model-parallel-layout 'Et|t*3L' --account-for-loss-in-pipeline-split
expect 2 "--decoder-first-pipeline-num-layers: expected" simulate --model tiny --cluster local --gpus 2 --pp 2 --decoder-first-pipeline-num-layers x
expect 2 "--cp-comm-type: expected p2p, allgather or a2a, got 'ring'" simulate --model tiny --cluster local --gpus 2 --cp 2 --cp-comm-type ring
expect 2 "pp 3 x vpp 1 = 3 must divide the 4 layers, or give each stage its layers" simulate --model tiny --cluster local --gpus 3 --pp 3
"$px" plan --model tiny --cluster local --gpus 2 --gbs 8 --pp-layers 1,3 -o "$tmp/u.json" >/dev/null 2>&1
sed -E 's/"stage_layers":[[:space:]]*\[[^]]*\]/"stage_layers": [1, -1]/' "$tmp/u.json" >"$tmp/u0.json"
expect 2 "u0.json: layout.stage_layers[1]: expected 0 to 100000 layers, got -1" export "$tmp/u0.json" --format megatron
sed -E 's/"stage_layers":[[:space:]]*\[[^]]*\]/"stage_layers": [1, 1, 2]/' "$tmp/u.json" >"$tmp/u3.json"
expect 2 "stage_layers 1,1,2 has 3 entries: pp is 2" export "$tmp/u3.json" --format megatron
sed -E 's/"stage_layers":[[:space:]]*\[[^]]*\]/"stage_layers": [1, 2.5]/' "$tmp/u.json" >"$tmp/uf.json"
expect 2 "layout.stage_layers[1]: expected an integer, got a fraction" export "$tmp/uf.json" --format megatron
expect 0 "--decoder-last-pipeline-num-layers 3" export "$tmp/u.json" --format megatron
# the sbatch script: its own options, checked, and refused with other formats
expect 0 "#SBATCH --time=4:00:00" export "$tmp/p.json" --format slurm --time 4:00:00
expect 2 "--time: expected minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED, got '4h'" export "$tmp/p.json" --format slurm --time 4h
expect 2 "--time applies to --format slurm only" export "$tmp/p.json" --format megatron --time 10
expect 2 "--plan-path applies to --format slurm only" export "$tmp/p.json" --format deepspeed --plan-path /x.json

# Hugging Face config.json: the key at fault named, for simulate and plan alike
hf() { # hf NAME JSON: a config.json in its own directory
  mkdir -p "$tmp/$1" && printf '%s\n' "$2" >"$tmp/$1/config.json"
}
hf hf_type '{"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256}'
hf hf_notype '{"model_type": 7, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256}'
hf hf_hidden '{"model_type": "llama", "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": 4, "vocab_size": 256, "max_position_embeddings": 64}'
hf hf_kv '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 3, "vocab_size": 256, "max_position_embeddings": 64}'
hf hf_vocab '{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": 4, "vocab_size": 256.5, "max_position_embeddings": 64}'
hf hf_layers '{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": -1, "vocab_size": 256, "max_position_embeddings": 64}'
hf hf_gpt2 '{"model_type": "gpt2", "n_embd": 65, "n_head": 4, "n_layer": 2, "vocab_size": 256}'
hf hf_inner '{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 256, "n_inner": "big"}'
hf hf_trunc '{"model_type": "llama", "hidden_size": 64, "intermediate_'
expect 2 "model_type 'bert' is not supported (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss)" simulate --model "$tmp/hf_type/config.json" $ok
expect 2 "model_type: expected a string" simulate --model "$tmp/hf_notype/config.json" $ok
hf hf_ctrl '{"model_type": "be\u001b[2Jrt\nx", "hidden_size": 64}'
expect 2 "model_type 'be?[2Jrt?x' is not supported" simulate --model "$tmp/hf_ctrl/config.json" $ok
expect 2 "hidden_size: missing required key" simulate --model "$tmp/hf_hidden/config.json" $ok
expect 2 "kv_heads 3 must divide heads 8" simulate --model "$tmp/hf_kv/config.json" $ok
expect 2 "vocab_size: expected an integer, got 256.5" simulate --model "$tmp/hf_vocab/config.json" $ok
expect 2 "num_hidden_layers: must be between 1" plan --model "$tmp/hf_layers/config.json" --cluster local --gpus 1 --gbs 8
expect 2 "n_embd 65 is not divisible by n_head 4" simulate --model "$tmp/hf_gpt2/config.json" $ok
expect 2 "n_inner: expected an integer, got a string" simulate --model "$tmp/hf_inner/config.json" $ok
expect 2 "malformed JSON near line 1" plan --model "$tmp/hf_trunc/config.json" --cluster local --gpus 1 --gbs 8
hf hf_nodiv '{"model_type": "llama", "hidden_size": 66, "intermediate_size": 176, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 64}'
expect 2 "hidden_size 66 is not divisible by num_attention_heads 8 and there is no head_dim" simulate --model "$tmp/hf_nodiv/config.json" $ok
printf '{"name": "x", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/nofamily.json"
expect 2 "family: missing required key (a parallax model needs" simulate --model "$tmp/nofamily.json" $ok
printf '{"name": "x", "family": "gpt", "layers": 2, "hidden": 66, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/nodiv.json"
expect 2 "hidden 66 is not divisible by heads 4: give head_dim explicitly" simulate --model "$tmp/nodiv.json" $ok

# token files given to run (--data): empty, an odd byte count, tokens beyond the vocabulary,
# missing, a directory; each named with what is wrong
"$px" plan --model tiny --cluster local --gpus 1 --gbs 4 --mbs 2 --seq 16 --steps 1 -o "$tmp/run1.json" >/dev/null
printf '{"name": "v200", "family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 200, "seq_len": 64}\n' >"$tmp/v200.json"
"$px" plan --model "$tmp/v200.json" --cluster local --gpus 1 --gbs 4 --mbs 2 --seq 16 --steps 1 -o "$tmp/run200.json" >/dev/null
: >"$tmp/empty.bin"
: >"$tmp/empty.txt"
mkdir -p "$tmp/dir.bin"
head -c 300 /dev/zero | tr '\0' 'a' >"$tmp/bytes.txt"
printf '\377' >>"$tmp/bytes.txt"
if python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
hdr = lambda n, magic=20240520, version=1: struct.pack('<256i', magic, version, n, *([0] * 253))
toks = lambda v: struct.pack('<%dH' % len(v), *v)
open(d + '/odd.bin', 'wb').write(hdr(100) + toks([7] * 100) + b'\x01')
open(d + '/extra.bin', 'wb').write(hdr(100) + toks([7] * 102))
open(d + '/big.bin', 'wb').write(hdr(100) + toks([7] * 99 + [256]))
open(d + '/neg.bin', 'wb').write(hdr(-5))
open(d + '/hdronly.bin', 'wb').write(hdr(0))
open(d + '/short.bin', 'wb').write(hdr(100)[:1000])
PY
then
  expect 2 "odd.bin: 1 bytes beyond the 100 tokens the header promises (1224 bytes): an odd byte count" run "$tmp/run1.json" --data "$tmp/odd.bin"
  expect 2 "extra.bin: 4 bytes beyond the 100 tokens the header promises" run "$tmp/run1.json" --data "$tmp/extra.bin"
  expect 2 "big.bin: token 256 at position 99 is beyond the model's vocabulary of 256" run "$tmp/run1.json" --data "$tmp/big.bin"
  expect 2 "neg.bin: negative token count -5 in the header" run "$tmp/run1.json" --data "$tmp/neg.bin"
  expect 2 "hdronly.bin: 0 tokens are too few" run "$tmp/run1.json" --data "$tmp/hdronly.bin"
  expect 2 "short.bin: 1000 bytes are too short for an llm.c token file" run "$tmp/run1.json" --data "$tmp/short.bin"
else
  echo "SKIPPED the .bin token files: python3 is needed to write them"
fi
# multi-token prediction modules whose eh input gradient (b x s x 2h) fits neither the MLP's
# nor the attention's scratch per tp rank (ffn_hidden 64 = hidden on tp 2): the MLP's scratch is
# made wide enough, so the planner ranks that layout on this machine (test_exec_mtp_mpi trains
# one); a tp that does not divide the hidden size is no layout (the eh projection's columns)
printf '{"name": "m", "family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64, "ffn_hidden": 64, "mtp_layers": 1}\n' >"$tmp/mtp.json"
expect 0 "" plan --model "$tmp/mtp.json" --cluster local --gpus 2 --tp 2 --gbs 4 --mbs 1 --seq 16 --steps 1 \
  -o "$tmp/mtp2.json"
printf '{"name": "m3", "family": "gpt", "layers": 4, "hidden": 64, "heads": 3, "head_dim": 22, "vocab": 256, "seq_len": 64, "ffn_hidden": 66, "mtp_layers": 1}\n' >"$tmp/mtp3.json"
expect 2 "tp 3 must divide the hidden size 64" \
  simulate --model "$tmp/mtp3.json" --cluster local --gpus 3 --tp 3
# --fp8-param-gather with MXFP8 runs under ZeRO-3 and below it, but not with ZeRO-2 (no job:
# model/spec.c); ZeRO-3 under a pipeline and the all-gather dispatcher with a capacity factor
# are run, so a plan for this machine takes them
printf '{"name": "z", "family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64}\n' >"$tmp/z.json"
"$px" plan --model "$tmp/z.json" --cluster local --gpus 2 --pp 2 --zero 3 --gbs 4 --mbs 2 --seq 16 --steps 1 \
  -o "$tmp/zpp.json" >/dev/null
expect 2 "fp8_param_gather with MXFP8 gathers the updated weights in their own dtype into the whole gradient buffer" \
  simulate --model "$tmp/z.json" --cluster dgx-b200 --gpus 2 --zero 2 --fp8-recipe mxfp8 --fp8-param-gather
expect 0 "" plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --ep 2 --moe-dispatcher allgather \
  --moe-capacity-factor 1 -o "$tmp/ag.json"
# DeepEP does not pad to a capacity (Megatron-Core refuses the pair)
expect 2 "moe_dispatcher flex (DeepEP) does not pad the experts' inputs to a capacity: capacity factor 1 needs the alltoall or allgather dispatcher" \
  simulate --model tiny-moe --cluster dgx-h100 --gpus 2 --ep 2 --moe-dispatcher flex --moe-capacity-factor 1
expect 2 "--moe-dispatcher: expected alltoall, allgather or flex, got 'deepep'" \
  simulate --model tiny-moe --cluster dgx-h100 --gpus 2 --ep 2 --moe-dispatcher deepep

# mpirun's hostfile: one that cannot be read, or given to another launcher
expect 2 "--hostfile $tmp/nohosts: cannot read it (No such file or directory)" run "$tmp/run1.json" --hostfile "$tmp/nohosts"
expect 2 "--hostfile is for --launcher mpirun, not srun" run "$tmp/run1.json" --hostfile "$tmp/run1.json" --launcher srun
expect 2 "empty.bin: the training data is an empty file" run "$tmp/run1.json" --data "$tmp/empty.bin"
expect 2 "empty.txt: the training data is an empty file" run "$tmp/run1.json" --data "$tmp/empty.txt"
expect 2 "bytes.txt: token 255 at position 300 is beyond the model's vocabulary of 200" run "$tmp/run200.json" --data "$tmp/bytes.txt"
expect 2 "nothere.bin: cannot open the training data: No such file or directory" run "$tmp/run1.json" --data "$tmp/nothere.bin"
expect 2 "dir.bin: the training data is not a regular file" run "$tmp/run1.json" --data "$tmp/dir.bin"

# compare: a run whose per-rank entries are malformed is refused, naming the entry
printf '{"time": {"step_s_median": 0.1}, "memory": {"per_rank": [{"rank": "x"}]}}\n' >"$tmp/badrank.json"
expect 2 "run: memory.per_rank[0].rank: expected an integer from 0 to 0" compare "$tmp/run1.json" "$tmp/badrank.json"
printf '{"time": {"step_s_median": 0.1}, "comm": {"per_rank": [{"rank": 0}, {"rank": 7}]}}\n' >"$tmp/badrank2.json"
expect 2 "run: comm.per_rank[1].rank: expected an integer from 0 to 0" compare "$tmp/run1.json" "$tmp/badrank2.json"

# run's own flags
expect 2 "--fail-rank 1: the plan has 1 rank (0 to 0)" run "$tmp/run1.json" --fail-rank 1 --fail-step 1
expect 2 "--comm-timeout: expected a number, got '5s'" run "$tmp/run1.json" --comm-timeout 5s
expect 2 "--loss-scale: expected a number from 1 to 2^100, got '0.5'" run "$tmp/run1.json" --loss-scale 0.5
expect 2 "--backend: expected cpu, cuda or auto, got 'tpu'" run "$tmp/run1.json" --backend tpu

# what must work
expect 0 "usage: parallax simulate" simulate --help
expect 0 "usage: parallax models" models --help
expect 0 "usage: parallax profiles" profiles --help
expect 0 "usage: parallax plan" plan --help
expect 0 "usage: parallax export" export --help
expect 0 "best layout per size" plan --model tiny --cluster local,dgx-a100 --gpus 1,2 --gbs 8
expect 0 "fewest GPUs meeting the budget" plan --model gpt3-1.3b --cluster dgx-a100 --gpus 8 --gbs 64 --min-gpus --max-step-s 5
expect 0 "dgx-a100: fewest GPUs meeting the budget: 8" plan --model gpt3-1.3b --cluster dgx-a100 --gbs 64 --min-gpus --max-step-s 5
expect 0 "dgx-a100: fewest GPUs meeting the budget: 24" plan --model gpt3-1.3b --cluster dgx-a100 --gpus 20 --gbs 64 --min-gpus --max-step-s 5
expect 0 "best by time: 64 GPUs of dgx-h100" plan --model llama3-8b --cluster dgx-h100 --gpus 8,16,64 --gbs 512
expect 0 "best by cost: 8 GPUs of dgx-h100" plan --model llama3-8b --cluster dgx-h100 --gpus 8,16,64 --gbs 512 --objective cost
expect 0 "best by tokens-per-gpu: 8 GPUs of dgx-h100" plan --model llama3-8b --cluster dgx-h100 --gpus 8,16,64 --gbs 512 --objective tokens-per-gpu
expect 0 "best by cost: 64 GPUs of dgx-a100" plan --model llama3-8b --cluster dgx-a100,dgx-h100 --gpus 64 --gbs 512 --objective cost --gpu-hour-price 1,4
expect 0 '"evaluated"' plan --model tiny --cluster local --gpus 2 --gbs 8 --json
expect 0 "1.00 B tokens with layout 1: 0.1 days, 14 GPU-hours" plan --model gpt3-1.3b --cluster dgx-a100 --gpus 8 --gbs 64 --tokens 1e9
# a sweep, a comparison of clusters and --min-gpus keep the token budget
expect 0 "days and GPU-hours to train on 15.0 T tokens" plan --model llama3-8b --cluster dgx-h100,dgx-a100 --gpus 64,128 --gbs 512 --tokens 15T
expect 0 "65.16 GiB  277.8 days, 426.7 K GPU-hours" plan --model llama3-8b --cluster dgx-h100 --gpus 64,128 --gbs 512 --tokens 15T
expect 0 "31.97 GiB  25.2 days, 619.2 K GPU-hours" plan --model llama3-8b --cluster dgx-h100 --gpus 64 --gbs 512 --tokens 15T --min-gpus --max-days 30
expect 2 "no cluster size up to 16 GPUs meets the budget (tried 8,16; the closest, 8 GPUs, takes 0.000327 s a step); cluster dgx-a100 ends there (2 nodes of 8): --set nodes=N for more" plan --model tiny --cluster dgx-a100 --gbs 8 --min-gpus --max-step-s 1e-9 --set nodes=2
expect 0 '"gpu_hours":' plan --model llama3-8b --cluster dgx-h100,dgx-a100 --gpus 64 --gbs 512 --tokens 15T --json
expect 0 "commands:" help
expect 0 "tiny-llama" models
expect 0 "dgx-h100" profiles
expect 0 "peak" simulate --model "$tmp/good.json" $ok
expect 0 "on dgx-a100: 8 x a100-80gb" simulate --model "$tmp/config.json" $ok --tp 4
expect 0 '"per_stage"' simulate --model tiny $ok --pp 2 --json
expect 0 '"tp_allreduce"' simulate --model tiny $ok --tp 2 --json
expect 0 "2 x cpu" simulate --model tiny --cluster local --gpus 2

# expert parallelism: the degree, the experts it must divide, a model without experts, lists
# and auto only where the planner searches them, the imbalance and forced balance
moe="$(dirname "$0")/data/moe-small.json"
expect 2 "--ep: must be between 1 and 65536, got 0" simulate --model "$moe" $ok --ep 0
expect 2 "ep 3 must divide the 8 experts" simulate --model "$moe" $ok --ep 3
expect 2 "model tiny has no experts" simulate --model tiny $ok --ep 2
expect 2 "--ep 2,4: only parallax plan searches a list of degrees" simulate --model "$moe" $ok --ep 2,4
expect 2 "--ep auto: only parallax plan searches the degree" simulate --model "$moe" $ok --ep auto
expect 2 "--ep: expected a degree, a list like 1,2,4,8 or auto, got '2,'" plan --model "$moe" $ok --gbs 16 --ep 2,
expect 2 "--etp: expected an integer, got 'x'" simulate --model "$moe" $ok --etp x
expect 2 "--moe-imbalance: must be at least 1 (1: balanced), got 0.5" simulate --model "$moe" $ok --moe-imbalance 0.5
expect 2 "moe imbalance 3 must be between 1 (balanced) and ep 2" simulate --model "$moe" $ok --ep 2 --moe-imbalance 3
expect 2 "--moe-force-balance routes tokens round-robin: --moe-imbalance 2 cannot go with it" simulate --model "$moe" $ok --ep 4 --moe-imbalance 2 --moe-force-balance
expect 2 "--moe-capacity-factor: must be between 0 and 1000, got -1" simulate --model "$moe" $ok --moe-capacity-factor -1
expect 2 "--moe-capacity-factor: expected a number, got 'x'" plan --model "$moe" $ok --gbs 16 --moe-capacity-factor x
expect 2 "ep x etp does not divide the experts or the stage's ranks (e.g. ep 3 must divide the 8 experts)" plan --model "$moe" $ok --gbs 16 --ep 3
expect 2 "parallax plan: --ep 2: model tiny has no experts" plan --model tiny $ok --gbs 16 --ep 2
expect 2 "parallax plan: --ep 4: model tiny has no experts" plan --model tiny $ok --gbs 16 --ep 1,4
# offload: the optimizer's needs ZeRO; a cluster without a host description cannot offload
expect 2 "optimizer offload moves each rank's optimizer shard to the host: it needs zero 1-3" simulate --model tiny $ok --offload-optimizer
expect 2 "optimizer offload moves each rank's optimizer shard to the host: it needs zero 1-3" plan --model tiny $ok --gbs 16 --zero 0 --offload-optimizer
expect 2 "cluster local describes no host" simulate --model tiny --cluster local --gpus 2 --zero 1 --offload-optimizer
expect 0 "host (" simulate --model tiny $ok --zero 1 --offload-optimizer
expect 0 "ep 4 etp 1 edp 2" simulate --model "$moe" $ok --ep 4
expect 0 "ep etp" plan --model "$moe" $ok --gbs 16 --ep 2,4
expect 2 "--flop-count 'hardware' is none of parallax, megatron" published --flop-count hardware

echo "cli_bad_input: $((cases - fails)) of $cases cases passed"
[ "$fails" -eq 0 ]
