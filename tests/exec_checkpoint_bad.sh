#!/usr/bin/env bash
# Checkpoints when something is wrong (one rank): every case ends with its message, naming the
# file, the key or the flag at fault, and the expected status — 2 for bad input, 1 for a
# checkpoint that cannot be written during the run, which keeps the previous one intact.
# - the flags: --checkpoint-every 0, negative, not a number; --checkpoint-every or --resume
#   without --checkpoint-dir; --checkpoint-dir alone;
# - the directory: not creatable, no checkpoint to resume from, a checkpoint already there
#   without --resume, the run already at the checkpoint's step;
# - a shard truncated, with a flipped byte (CRC-32), missing; a manifest missing, malformed,
#   without a key, with a key of the wrong type; a checkpoint of another model or layout, or
#   without FP8 offered to an FP8 run (training.fp8_recipe named), or of tiny-moe offered to
#   tiny-moe with 4 experts (model.moe.experts named);
# - a checkpoint that cannot be written (its step directory taken by a file): status 1, the
#   previous checkpoint resumes afterwards.
# Usage: exec_checkpoint_bad.sh PARALLAX
set -u
px=${1:?usage: exec_checkpoint_bad.sh path/to/parallax}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 cases=0

# expect STATUS NEEDLE CMD ARGS...: the status, and the output names NEEDLE
expect() {
  local want=$1 needle=$2
  shift 2
  cases=$((cases + 1))
  local out got
  if [ "$(type -t "$1")" = function ]; then
    out=$("$@" 2>&1)
  else
    out=$(timeout 120 "$@" 2>&1)
  fi
  got=$?
  if [ "$got" -ne "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAILED: $*"
    echo "  expected status $want and '$needle'"
    echo "  got status $got: $(tail -c 800 <<<"$out")"
    fails=$((fails + 1))
  else
    echo "ok ($got): $(grep -F -- "$needle" <<<"$out" | head -1)"
  fi
}

plan() { # plan NAME KNOBS...
  local name=$1
  shift
  "$px" plan --cluster local --gpus 1 --gbs 8 --mbs 4 --steps 6 -o "$tmp/$name.json" "$@" \
    >/dev/null || { echo "FAILED: parallax plan $name $*"; exit 1; }
}
plan tiny --model tiny
plan llama --model tiny-llama
plan zero1 --model tiny --zero 1
plan fp8 --model tiny --fp8-recipe tensorwise
plan moe --model tiny-moe
# tiny-moe with 4 experts instead of 8, its model taken from the plan
python3 - "$tmp/moe.json" "$tmp/moe4-model.json" <<'PY' || { echo "FAILED: tiny-moe with 4 experts"; exit 1; }
import json, sys
m = json.load(open(sys.argv[1]))["model"]
assert m["moe"]["experts"] == 8
m["moe"]["experts"] = 4
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
plan moe4 --model "$tmp/moe4-model.json"
run() { timeout 120 "$px" run "$tmp/tiny.json" --quiet -o "$tmp/run.json" "$@"; }

# the flags
expect 2 "--checkpoint-every: must be between 1 and" run --checkpoint-dir "$tmp/c" --checkpoint-every 0
expect 2 "--checkpoint-every: must be between 1 and" run --checkpoint-dir "$tmp/c" --checkpoint-every -3
expect 2 "--checkpoint-every: expected an integer, got 'abc'" run --checkpoint-dir "$tmp/c" --checkpoint-every abc
expect 2 "--checkpoint-every needs --checkpoint-dir DIR" run --checkpoint-every 2
expect 2 "--resume needs --checkpoint-dir DIR" run --resume
expect 2 "give --checkpoint-every N to write checkpoints, or --resume" run --checkpoint-dir "$tmp/c"
worker="$(dirname "$px")/parallax-worker"
expect 2 "--checkpoint-every: expected an integer, got '2x'" \
  "$worker" run "$tmp/tiny.json" --checkpoint-dir "$tmp/c" --checkpoint-every 2x

# the directory
touch "$tmp/file"
expect 2 "$tmp/file/ck: cannot create the checkpoint directory: Not a directory" \
  run --checkpoint-dir "$tmp/file/ck" --checkpoint-every 2
expect 2 "$tmp/none: no such checkpoint directory: nothing to resume from" \
  run --checkpoint-dir "$tmp/none" --resume
mkdir "$tmp/empty"
expect 2 "$tmp/empty: --resume, but the directory holds no complete checkpoint" \
  run --checkpoint-dir "$tmp/empty" --resume

# a good checkpoint of step 2 (of a 6-step run), then one broken copy of it per case
"$px" run "$tmp/tiny.json" -o "$tmp/good.json" --checkpoint-dir "$tmp/good" --checkpoint-every 2 \
  --steps 2 >"$tmp/good.log" 2>&1 || { echo "FAILED: the good checkpoint"; cat "$tmp/good.log"; exit 1; }
grep -F "checkpoint step 2" "$tmp/good.log"
expect 2 "$tmp/good already holds a checkpoint (step 2): give --resume" \
  run --checkpoint-dir "$tmp/good" --checkpoint-every 2
expect 2 "the latest checkpoint is at step 2 and the run has 2 steps: nothing left to run" \
  run --checkpoint-dir "$tmp/good" --resume --steps 2
s=step-00000002
copy() { rm -rf "$tmp/$1"; cp -r "$tmp/good" "$tmp/$1"; }
resume() { local d=$1; shift; run --checkpoint-dir "$tmp/$d" --resume "$@"; }

copy trunc
truncate -s -100 "$tmp/trunc/$s/rank-00000.bin"
expect 2 "$tmp/trunc/$s/rank-00000.bin: 2646560 bytes, but the manifest says 2646660: the shard is truncated" resume trunc

copy flip
printf '\x5a' | dd of="$tmp/flip/$s/rank-00000.bin" bs=1 seek=5000 conv=notrunc status=none
expect 2 "$tmp/flip/$s/rank-00000.bin: CRC-32 mismatch" resume flip

copy missing
rm "$tmp/missing/$s/rank-00000.bin"
expect 2 "$tmp/missing/$s/rank-00000.bin: cannot open the shard of rank 0: No such file" resume missing

copy nomanifest
rm "$tmp/nomanifest/$s/manifest.json"
expect 2 "holds no complete checkpoint" resume nomanifest

copy malformed
printf '{"schema_version": 1, "format": ' >"$tmp/malformed/$s/manifest.json"
expect 2 "$tmp/malformed/$s/manifest.json" resume malformed

copy nokey
grep -v '"optimizer_steps"' "$tmp/good/$s/manifest.json" >"$tmp/nokey/$s/manifest.json"
expect 2 "$tmp/nokey/$s/manifest.json: state.optimizer_steps: missing required key" resume nokey

copy noshards
sed 's/"shards":/"shardz":/' "$tmp/good/$s/manifest.json" >"$tmp/noshards/$s/manifest.json"
expect 2 "$tmp/noshards/$s/manifest.json: shards: missing required key" resume noshards

copy type
sed 's/"step":\t2/"step":\t"2"/' "$tmp/good/$s/manifest.json" >"$tmp/type/$s/manifest.json"
expect 2 "$tmp/type/$s/manifest.json: step: expected an integer, got a string" resume type

copy crc
sed 's/"crc32":\t[0-9]*/"crc32":\t12345/' "$tmp/good/$s/manifest.json" >"$tmp/crc/$s/manifest.json"
expect 2 "the manifest 0x00003039: the shard is not the one this manifest lists" resume crc

copy model
expect 2 "$tmp/model/$s/manifest.json: model.name: the checkpoint has \"tiny\", this run \"tiny-llama\"" \
  "$px" run "$tmp/llama.json" --quiet -o "$tmp/run.json" --checkpoint-dir "$tmp/model" --resume
copy hidden
sed 's/"hidden":\t64/"hidden":\t128/' "$tmp/good/$s/manifest.json" >"$tmp/hidden/$s/manifest.json"
expect 2 "model.hidden: the checkpoint has 128, this run 64" resume hidden
copy layout
expect 2 "layout.zero: the checkpoint was written with 0, this run has 1" \
  "$px" run "$tmp/zero1.json" --quiet -o "$tmp/run.json" --checkpoint-dir "$tmp/layout" --resume
copy recipe
expect 2 "$tmp/recipe/$s/manifest.json: training.fp8_recipe: the checkpoint has \"none\", this run \"tensorwise\"" \
  "$px" run "$tmp/fp8.json" --quiet -o "$tmp/run.json" --checkpoint-dir "$tmp/recipe" --resume

# another expert count
"$px" run "$tmp/moe.json" -o "$tmp/moe-run.json" --checkpoint-dir "$tmp/moe-ck" --checkpoint-every 2 \
  --steps 2 >"$tmp/moe.log" 2>&1 || { echo "FAILED: the MoE checkpoint"; cat "$tmp/moe.log"; exit 1; }
expect 2 "$tmp/moe-ck/$s/manifest.json: model.moe.experts: the checkpoint has 8, this run 4" \
  "$px" run "$tmp/moe4.json" --quiet -o "$tmp/run.json" --checkpoint-dir "$tmp/moe-ck" --resume

# a checkpoint that cannot be written: status 1, the one of step 2 kept and still good
copy io
touch "$tmp/io/step-00000004"
expect 1 "checkpoint of step 4 not written: $tmp/io/step-00000004: cannot create the checkpoint's directory: Not a directory; the checkpoint of step 2 is kept" \
  resume io
[ -f "$tmp/io/$s/manifest.json" ] || { echo "FAILED: the checkpoint of step 2 is gone"; fails=$((fails + 1)); }
rm "$tmp/io/step-00000004"
expect 0 "resume    from $tmp/io/$s: step 2 done" "$px" run "$tmp/tiny.json" -o "$tmp/run.json" \
  --checkpoint-dir "$tmp/io" --resume

echo "exec_checkpoint_bad: $((cases - fails)) of $cases cases passed"
[ "$fails" -eq 0 ]
