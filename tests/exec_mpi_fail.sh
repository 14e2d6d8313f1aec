#!/usr/bin/env bash
# parallax run over MPI when something is wrong: every case ends the whole job with a message
# and the expected status, and none hangs (each runs under `timeout`: status 124 is a hang).
# - a world that does not match the plan (mpirun -n 3 for a 2-rank plan; a Slurm allocation
#   too small; the worker alone without a launcher): status 2, named;
# - a missing worker, a missing mpirun, an unknown launcher;
# - one rank failing at start (agreed on, printed once) or in the middle of training (MPI_Abort,
#   the rank named), in a 2-rank and an 8-rank pipeline job;
# - a rank lost abruptly (--fail-rank/--fail-step: SIGKILL, no goodbye) in a 2-rank and an
#   8-rank pipeline job: the job ends within 30 s, status 1, the rank and step named;
# - a rank that stalls for good (PARALLAX_TEST_HANG) with --comm-timeout 5: the others' wait
#   times out, names the operation and its group, and the job ends soon after 5 s;
# - a bad data file, seen by every rank: printed once, status 2;
# - the ring without the fused attention core: no layout, planned or made by hand (status 2);
#   Ulysses with the fused core asked for by name: planned for this machine and trained;
# - and a job that is already one rank of a launch (--launcher none under mpirun) runs.
# Most of a case's time is waiting (mpirun's start and teardown, a killed rank noticed, the
# comm timeout), not computing: after the plans, the cases run in four lanes at once, each lane's
# cases one after another, each lane with its own output file; the lanes' reports are printed
# in order at the end.
# Usage: exec_mpi_fail.sh PARALLAX
set -u
px=${1:?usage: exec_mpi_fail.sh path/to/parallax}
worker="$(dirname "$px")/parallax-worker"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 cases=0
command -v mpirun >/dev/null || { echo "exec_mpi_fail: mpirun is not installed: skipped"; exit 77; }
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)

# expect STATUS NEEDLE CMD ARGS...: the status, and the output names NEEDLE (once, when ONCE=1)
expect() {
  local want=$1 needle=$2
  shift 2
  cases=$((cases + 1))
  local out got
  out=$(timeout 120 "$@" 2>&1) # a hang guard (status 124), not a bound: lanes share the cores
  got=$?
  local count
  count=$(grep -cF -- "$needle" <<<"$out")
  if [ "$got" -ne "$want" ] || [ "$count" -lt 1 ] || { [ "${ONCE:-0}" = 1 ] && [ "$count" -ne 1 ]; }; then
    echo "FAILED: $*"
    echo "  expected status $want and '$needle'${ONCE:+ once}"
    echo "  got status $got ($count times): $(head -c 800 <<<"$out")"
    fails=$((fails + 1))
  fi
}

# a rank lost abruptly, and one that stalls: the job ends, in time, naming them.
# timed LIMIT MIN STATUS NEEDLE CMD ARGS...: as expect, and the command took MIN to LIMIT seconds
timed() {
  local limit=$1 min=$2 want=$3 needle=$4
  shift 4
  cases=$((cases + 1))
  local t0 t1 out got secs
  t0=$(date +%s.%N)
  out=$(timeout 120 "$@" 2>&1)
  got=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "  $secs s, status $got: ${needle}"
  if [ "$got" -ne "$want" ] || ! grep -qF -- "$needle" <<<"$out" ||
    awk -v s="$secs" -v lo="$min" -v hi="$limit" 'BEGIN { exit !(s < lo || s > hi) }'; then
    echo "FAILED: $*"
    echo "  expected status $want, '$needle', $min to $limit s"
    echo "  got status $got after $secs s: $(head -c 800 <<<"$out")"
    fails=$((fails + 1))
  fi
}

plan() { # plan NAME GPUS KNOBS...
  local name=$1 gpus=$2
  shift 2
  "$px" plan --model tiny --cluster local --gpus "$gpus" --gbs 8 --mbs 1 --vpp 1 --schedule 1f1b \
    --no-sp --zero 0 --steps 4 -o "$tmp/$name.json" "$@" >/dev/null ||
    { echo "FAILED: parallax plan $name $*"; fails=$((fails + 1)); }
}
plan dp2 2 --dp 2 --tp 1 --pp 1
plan pp8 8 --dp 2 --tp 2 --pp 2
# the ring without the fused attention core is no layout (model/spec.c's check_cp_core): the
# planner says so for any cluster, and a plan made by hand is refused by the same rule at start
ONCE=1 expect 2 "p2p context parallelism without the fused attention core (e.g. cp 2 with cp comm type p2p runs the fused attention core" \
  "$px" plan --model tiny-llama --cluster local --gpus 2 --gbs 8 --dp 1 --tp 1 --pp 1 --cp 2 \
  --cp-comm-type p2p --seq 256 --no-flash-attn
sed 's/"name": "local"/"name": "cpu-box"/' "$(dirname "$0")/../profiles/clusters/local.json" >"$tmp/box.json"
plan cp2_p2p 2 --dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --model tiny-llama --seq 256 --cluster "$tmp/box.json"
sed -E 's/"flash_attn":([[:space:]]*)true/"flash_attn":\1false/' "$tmp/cp2_p2p.json" >"$tmp/cp2_p2p_unfused.json"
ONCE=1 expect 2 "cp 2 with cp comm type p2p runs the fused attention core (Transformer Engine's ring attention, as Megatron-LM runs it)" \
  "$px" run "$tmp/cp2_p2p_unfused.json" -o "$tmp/x.json"

# the layouts refused or run, the world against the plan, bad data
lane_layouts() {
  local x="$tmp/x-lane_layouts.json"
  # Ulysses with the fused core (flash attention, the default), asked for by name: planned for
  # this machine and trained
  expect 0 "wrote $tmp/a2a.json" \
    "$px" plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --cp 2 --cp-comm-type a2a \
    --steps 2 -o "$tmp/a2a.json"
  expect 0 "wrote $tmp/a2a-run.json" "$px" run "$tmp/a2a.json" -o "$tmp/a2a-run.json"
  grep -Eq '"cp_comm_type":[[:space:]]*"a2a"' "$tmp/a2a.json" && grep -Eq '"flash_attn":[[:space:]]*true' "$tmp/a2a.json" ||
    { echo "FAILED: the a2a plan is not Ulysses with flash attention"; fails=$((fails + 1)); }
  # Ulysses with more cp ranks than heads: the layout rule refuses it before any run
  ONCE=1 expect 2 "cp comm type a2a needs cp 4 to divide the 2 key/value heads per tp rank (4 key/value heads / tp 2)" \
    "$px" plan --model tiny-llama --cluster local --gpus 8 --gbs 8 --dp 1 --tp 2 --pp 1 --cp 4 \
    --cp-comm-type a2a --seq 256 --no-flash-attn -o "$x"

  # the world against the plan
  ONCE=1 expect 2 "the layout needs 2 ranks (dp 2 x tp 1 x pp 1 x cp 1) but the job has 3" \
    mpirun "${root[@]}" --oversubscribe -n 3 "$worker" run "$tmp/dp2.json" -o "$x"
  expect 2 "needs 2 ranks but the Slurm allocation has 1 tasks" \
    env SLURM_JOB_ID=1 SLURM_NTASKS=1 "$px" run "$tmp/dp2.json"
  expect 2 "the layout needs 2 ranks (dp 2 x tp 1 x pp 1 x cp 1) but this process runs alone" \
    "$px" run "$tmp/dp2.json" --launcher none
  expect 2 "--launcher: expected mpirun, srun or none, got 'ssh'" "$px" run "$tmp/dp2.json" --launcher ssh

  # a missing worker, a missing launcher
  cp "$px" "$tmp/parallax"
  expect 1 "parallax-worker is missing or not executable" "$tmp/parallax" run "$tmp/dp2.json"
  expect 1 "needs 2 ranks but mpirun is not on PATH" env PATH=/nonexistent "$px" run "$tmp/dp2.json"
  expect 1 "needs 2 ranks but srun is not on PATH" env PATH=/nonexistent "$px" run "$tmp/dp2.json" --launcher srun

  # bad data: every rank refuses it, one says so
  printf 'short text' >"$tmp/short.txt"
  ONCE=1 expect 2 "short.txt: 10 tokens are too few" "$px" run "$tmp/pp8.json" --data "$tmp/short.txt"

  # already one rank of a launch: the front end runs the worker in place
  expect 0 "wrote $tmp/none.json" \
    mpirun "${root[@]}" --oversubscribe -n 2 "$px" run "$tmp/dp2.json" --launcher none -o "$tmp/none.json"
}

# one rank failing, at start and in training
lane_failures() {
  local x="$tmp/x-lane_failures.json"
  # one rank fails: at start every rank learns it and the first one tells; in training the job
  # is aborted with the rank named
  ONCE=1 expect 1 "rank 1 of 2: failing at start as PARALLAX_TEST_FAIL=1:init asks" \
    env PARALLAX_TEST_FAIL=1:init "$px" run "$tmp/dp2.json" -o "$x"
  expect 1 "rank 1 of 2: failing at step 2 as PARALLAX_TEST_FAIL asks (ending the job)" \
    env PARALLAX_TEST_FAIL=1:step:2 "$px" run "$tmp/dp2.json" -o "$x"
  expect 1 "rank 5 of 8: failing at step 3 as PARALLAX_TEST_FAIL asks (ending the job)" \
    env PARALLAX_TEST_FAIL=5:step:3 "$px" run "$tmp/pp8.json" -o "$x" --quiet
  expect 1 "rank 0 of 8: failing at step 1" \
    env PARALLAX_TEST_FAIL=0:step:1 "$px" run "$tmp/pp8.json" -o "$x" --quiet
  expect 2 "PARALLAX_TEST_FAIL=sometimes: expected RANK:init or RANK:step:K" \
    env PARALLAX_TEST_FAIL=sometimes "$px" run "$tmp/dp2.json" -o "$x"
}

# a rank lost abruptly, and bad --fail-* and --comm-timeout values
lane_lost() {
  local x="$tmp/x-lane_lost.json"
  timed 30 0 1 "rank 1: step 3: killed on purpose (--fail-rank 1 --fail-step 3)" \
    "$px" run "$tmp/dp2.json" -o "$x" --fail-rank 1 --fail-step 3
  timed 30 0 1 "rank 6: step 2: killed on purpose (--fail-rank 6 --fail-step 2)" \
    "$px" run "$tmp/pp8.json" -o "$x" --quiet --fail-rank 6 --fail-step 2
  timed 30 0 1 "the job ended abnormally" \
    "$px" run "$tmp/pp8.json" -o "$x" --quiet --fail-rank 0 --fail-step 1
  # the worker under a plain mpirun: mpirun's own status for a rank killed by a signal
  timed 30 0 137 "rank 1: step 2: killed on purpose" \
    mpirun "${root[@]}" --oversubscribe -n 2 "$worker" run "$tmp/dp2.json" -o "$x" \
    --fail-rank 1 --fail-step 2
  expect 2 "--fail-rank 2: the plan has 2 ranks (0 to 1)" \
    "$px" run "$tmp/dp2.json" --fail-rank 2 --fail-step 1
  ONCE=1 expect 2 "--fail-rank 9: the job has 8 ranks (0 to 7)" \
    mpirun "${root[@]}" --oversubscribe -n 8 "$worker" run "$tmp/pp8.json" --fail-rank 9 --fail-step 1
  expect 2 "--fail-step: must be between 1" "$px" run "$tmp/dp2.json" --fail-rank 1 --fail-step 0
  expect 2 "--fail-rank: expected an integer, got 'one'" "$px" run "$tmp/dp2.json" --fail-rank one --fail-step 1
  expect 2 "--fail-step needs --fail-rank too" "$px" run "$tmp/dp2.json" --fail-step 2
  expect 2 "--comm-timeout: expected seconds from 0 (no limit) to 1e7, got '-5'" \
    "$px" run "$tmp/dp2.json" --comm-timeout -5
  expect 2 "--comm-timeout: expected a number, got 'soon'" "$worker" run "$tmp/dp2.json" --comm-timeout soon
}

# a rank that stalls for good
lane_stalled() {
  local x="$tmp/x-lane_stalled.json"
  expect 2 "PARALLAX_TEST_HANG=1:step:: expected RANK:step:K" \
    env PARALLAX_TEST_HANG=1:step: "$px" run "$tmp/dp2.json" -o "$x"
  # a stalled rank: the others give up after --comm-timeout (not before), naming what they waited for
  timed 25 5 1 "rank 0: step 3: dp_allreduce on the dp group did not complete within 5 s" \
    env PARALLAX_TEST_HANG=1:step:3 "$px" run "$tmp/dp2.json" -o "$x" --comm-timeout 5
  timed 25 5 1 "step 2: the barrier on the world group did not complete within 5 s" \
    env PARALLAX_TEST_HANG=3:step:2 "$px" run "$tmp/pp8.json" -o "$x" --quiet --comm-timeout 5
}

# run_lanes LANE...: each lane in the background, its output and its counts in files of its
# own; then every lane's output in order, and the counts summed
run_lanes() {
  local l c f
  for l in "$@"; do
    (
      cases=0 fails=0
      "$l"
      echo "$cases $fails" >"$tmp/$l.count"
    ) >"$tmp/$l.out" 2>&1 &
  done
  wait
  for l in "$@"; do
    cat "$tmp/$l.out"
    if read -r c f <"$tmp/$l.count"; then
      cases=$((cases + c)) fails=$((fails + f))
    else
      echo "FAILED: $l ended without its counts"
      fails=$((fails + 1))
    fi
  done
}
# the longest lanes first
run_lanes lane_stalled lane_lost lane_failures lane_layouts

echo "exec_mpi_fail: $((cases - fails)) of $cases cases passed"
[ "$fails" -eq 0 ]
