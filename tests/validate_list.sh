#!/usr/bin/env bash
# parallax validate --list: the rows a validation would run, without running any. The mixture-
# of-experts zoo models run their whole spread: tiny-moe (MoE layers with context parallelism
# too) and tiny-dsv3 (MLA, MoE, its prediction module) skip no row up to 8 ranks, the expert
# layouts included (ep over dp, tp and cp; etp 2; pipelines; ZeRO-3), their tensor
# parallelism taken with SP, as the executor runs them, and tiny-dsv3's ZeRO-3 as the spread has
# it (its prediction module gathers the embedding and the output layer again); a layout the executor refuses is listed as skipped with its sentence, and one beyond
# --max-ranks as not run.
# Usage: validate_list.sh PARALLAX
set -u
px=${1:?usage: validate_list.sh path/to/parallax}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PARALLAX_UNCALIBRATED=1 PARALLAX_PROFILE_DIR=$tmp/none
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }
for m in tiny-moe tiny-dsv3; do
  "$px" validate --model "$m" --list >"$tmp/$m" 2>&1 || fail "validate --model $m --list: status $?"
  n=$(grep -cE '^ +[0-9]+ +[0-9]+  ' "$tmp/$m")
  [ "$n" -eq 32 ] || fail "$m: $n rows listed, expected 32 (the spread's 23 and 9 expert rows)"
  grep -q 'skipped:\|not run:' "$tmp/$m" && fail "$m: rows not run: $(grep 'skipped:\|not run:' "$tmp/$m")"
  for row in 'dp1 tp1 pp1 cp2 p2p zero0 mbs4 none 1f1b' 'dp1 tp2 pp1 sp zero0 mbs4 none 1f1b' \
             'dp1 tp1 pp2 vpp2 zero0 mbs2 none interleaved'; do
    grep -Eq "^ +[0-9]+ +2  $row +timed$" "$tmp/$m" || fail "$m: no timed row '$row'"
  done
  # the expert layouts: ep over dp, over tp (etp 1), over cp; etp 2; a pipeline interleaved
  for row in '2  dp2 tp1 pp1 ep2 zero0 mbs4 none 1f1b +timed' \
             '2  dp1 tp2 pp1 ep2 sp zero0 mbs4 none 1f1b +timed' \
             '2  dp1 tp1 pp1 cp2 p2p ep2 zero0 mbs4 none 1f1b +timed' \
             '4  dp2 tp2 pp1 ep2 etp2 sp zero0 mbs2 none 1f1b +memory and communication' \
             '4  dp2 tp1 pp2 vpp2 ep2 zero0 mbs2 none interleaved +memory and communication' \
             '4  dp4 tp1 pp1 ep2 zero3 mbs2 none 1f1b +memory and communication'; do
    grep -Eq "^ +[0-9]+ +$row\$" "$tmp/$m" || fail "$m: no expert row '$row'"
  done
done
grep -Eq '^ +[0-9]+ +2  dp2 tp1 pp1 zero3 mbs4 none 1f1b +timed$' "$tmp/tiny-dsv3" ||
  fail "tiny-dsv3: no timed ZeRO-3 row"
grep -Eq '^ +[0-9]+ +8  dp2 tp2 pp2 sp zero1 mbs2 none 1f1b +memory and communication$' "$tmp/tiny-moe" ||
  fail "tiny-moe: no 8-rank row for memory and communication"
# a dense model: no expert rows; its tp rows without SP as they are; cp at a sequence that does not split into
# 2 x cp chunks skipped by the layout's rule (no layout: the simulator prices none of them
# either); 4 ranks beyond --max-ranks 2
"$px" validate --model tiny --seq 34 --max-ranks 2 --list >"$tmp/s" 2>&1 || fail "validate --seq 34 --list: status $?"
grep -Eq '^ +[0-9]+ +2  dp1 tp2 pp1 zero0 mbs4 none 1f1b +timed$' "$tmp/s" || fail "tiny: no tp 2 row without SP"
grep -q ' ep[0-9]' "$tmp/s" && fail "tiny: expert rows for a dense model: $(grep ' ep[0-9]' "$tmp/s")"
for row in 'cp2 p2p zero0 mbs4 none 1f1b' 'cp2 allgather zero0 mbs4 none 1f1b' \
           'cp2 a2a zero0 mbs4 none 1f1b unfused'; do
  set -- $row
  grep -Eq "^ +[0-9]+ +2  dp1 tp1 pp1 $row +skipped: the model does not take it: cp 2 needs the sequence length 34 to split into 2 x cp = 4 chunks \(each cp rank holds two: Megatron-LM's load balancing of the causal mask\)$" "$tmp/s" ||
    fail "tiny --seq 34: no skipped row 'dp1 tp1 pp1 $row'"
done
grep -Eq '^ +[0-9]+ +4  dp2 tp2 pp1 zero0 mbs2 none 1f1b +not run: beyond --max-ranks 2$' "$tmp/s" ||
  fail "tiny: no 4-rank row beyond --max-ranks 2"
if [ "$fails" -ne 0 ]; then
  cat "$tmp/tiny-moe" "$tmp/tiny-dsv3" "$tmp/s"
  exit 1
fi
echo "validate --list: tiny-moe and tiny-dsv3 run all 32 rows, their 9 expert rows included; tiny's refusals named"
