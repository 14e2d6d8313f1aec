#!/usr/bin/env bash
# slurm.sh PARALLAX — parallax under a real Slurm: a one-node cluster on this machine (munged,
# slurmctld and slurmd as root, with a key, a state directory and ports of their own) runs a
# 2-rank plan with `parallax run --launcher srun`, with `parallax run` inside `salloc` (srun
# chosen by itself) and as the sbatch script `parallax export --format slurm` writes; each run's
# losses must equal the mpirun run's exactly. A rank lost under srun ends the job, status 1.
# Installs slurmctld, slurmd, slurm-client and munge from Debian when they are missing. Skips
# (77) where Slurm cannot be installed or started (not root, no apt, the daemons do not come
# up); stops every daemon it started, whatever happens.
# Usage: slurm.sh PARALLAX
set -u
px=$(realpath "${1:?usage: slurm.sh path/to/parallax}") # the runs below start in directories of their own
skip() { echo "slurm: $*: skipped"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "slurmd runs jobs as root here, and this is not root"
command -v mpirun >/dev/null || skip "mpirun is not installed (openmpi-bin), so there is nothing to compare with"
have_slurm() {
  local c
  for c in slurmctld slurmd srun salloc sbatch sinfo scontrol scancel munged; do
    command -v "$c" >/dev/null || return 1
  done
}
if ! have_slurm; then
  echo "slurm: installing slurmctld slurmd slurm-client munge"
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                slurmctld slurmd slurm-client munge >/dev/null; }
  install || { apt-get update -qq && install; } || skip "apt-get could not install Slurm"
  have_slurm || skip "Slurm's programs are missing after installing it"
fi

tmp=$(mktemp -d /tmp/px-slurm.XXXXXX)
node=$(hostname -s)
export SLURM_CONF=$tmp/slurm.conf PARALLAX_UNCALIBRATED=1
# Cancel what is still running, stop the daemons this script started (by the pids they wrote),
# then remove the state.
# stop DAEMON...: SIGTERM to each at once (each takes about 2 s to go), up to 10 s for all of
# them to end, then SIGKILL to any left
stop() {
  local f p i pids=()
  for f in "$@"; do
    [ -s "$tmp/$f.pid" ] || continue
    p=$(cat "$tmp/$f.pid")
    kill "$p" 2>/dev/null && pids+=("$p")
  done
  for i in $(seq 50); do
    [ ${#pids[@]} -gt 0 ] && kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.2
  done
  [ ${#pids[@]} -gt 0 ] && kill -9 "${pids[@]}" 2>/dev/null
}
cleanup() {
  [ -s "$tmp/slurmctld.pid" ] && scancel --quiet --user=root 2>/dev/null
  stop slurmd slurmctld
  stop munged # last: the other two authenticate through it until they are gone
  rm -rf "$tmp"
}
trap cleanup EXIT

# two free ports for slurmctld and slurmd: a system Slurm or another run keeps its own
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))') || skip "python3 is needed to find free ports"
# two CPUs at least, for the two ranks, whatever the machine has (config_overrides below)
cpus=$(nproc)
[ "$cpus" -ge 2 ] || cpus=2
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log"
chmod 711 "$tmp" # munged wants its socket's directories searchable by everyone
cat >"$SLURM_CONF" <<EOF
# a one-node cluster for parallax's tests: no cgroups, no accounting, nothing outside $tmp
ClusterName=pxtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
NodeName=$node NodeHostname=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=px Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none && chmod 400 "$tmp/munge.key"
munged --key-file="$tmp/munge.key" --socket="$tmp/munge.socket" --pid-file="$tmp/munged.pid" \
  --seed-file="$tmp/munged.seed" --log-file="$tmp/log/munged.log" ||
  skip "munged did not start: $(tail -3 "$tmp/log/munged.log" 2>/dev/null)"
slurmctld -f "$SLURM_CONF" || skip "slurmctld did not start: $(tail -5 "$tmp/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" -N "$node" || skip "slurmd did not start: $(tail -5 "$tmp/log/slurmd.log" 2>/dev/null)"
state=""
for i in $(seq 60); do
  state=$(sinfo -h -N -n "$node" -o %t 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || skip "the node is '$state', not idle, after 60 s: $(tail -5 "$tmp/log/slurmd.log" "$tmp/log/slurmctld.log" 2>/dev/null)"
echo "slurm: $(srun --version), node $node idle with $cpus CPUs; srun --mpi=list: $(srun --mpi=list 2>&1 | tail -n +2 | tr -s ' \t\n' ' ' | sed "s/^ //")"

fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }
# run NAME CMD...: in $tmp/NAME, bounded, its output kept
run() {
  local name=$1
  shift
  mkdir -p "$tmp/$name"
  (cd "$tmp/$name" && timeout 300 "$@") >"$tmp/$name.out" 2>&1 ||
    fail "$name: status $?: $*: $(tail -5 "$tmp/$name.out")"
}

"$px" plan --model tiny --cluster local --gpus 2 --gbs 8 --mbs 1 --vpp 1 --schedule 1f1b --no-sp \
  --zero 0 --steps 4 --dp 2 --tp 1 --pp 1 -o "$tmp/plan.json" >"$tmp/plan.out" 2>&1 ||
  { fail "parallax plan: $(cat "$tmp/plan.out")"; exit 1; }
run mpirun "$px" run "$tmp/plan.json" --launcher mpirun --quiet
run srun "$px" run "$tmp/plan.json" --launcher srun --quiet
# inside an allocation parallax run chooses srun itself
run salloc salloc --ntasks=2 --quiet "$px" run "$tmp/plan.json" --quiet
"$px" export "$tmp/plan.json" --format slurm -o "$tmp/job.sh" || fail "parallax export --format slurm"
echo "slurm: the sbatch script:"
sed 's/^/  | /' "$tmp/job.sh"
# sbatch --wait's status (the job's exit code), without its wait: it looks at the job after
# 2 s, then 8 s later, and so on (Slurm's sbatch.c, _job_wait), 10 s and more for a job of 2 s.
# Here the job is submitted and its state read every 0.2 s until it has ended; a job that
# ends otherwise than COMPLETED with exit code 0:0 is status 1, or its own exit code
sbatch_wait() {
  local id st code
  id=$(sbatch --parsable "$@") || return $?
  id=${id%%;*}
  [ -n "$id" ] || return 1
  while :; do
    st=$(scontrol -o show job "$id" 2>/dev/null)
    case "$st" in
    "" | *" JobState=PENDING "* | *" JobState=CONFIGURING "* | *" JobState=RUNNING "* | \
      *" JobState=COMPLETING "* | *" JobState=SUSPENDED "*) sleep 0.2 ;;
    *) break ;;
    esac
  done
  code=$(sed -n 's/.* ExitCode=\([0-9]*\):\([0-9]*\).*/\1 \2/p' <<<"$st")
  case "$st" in *" JobState=COMPLETED "*) [ "$code" = "0 0" ] && return 0 ;; esac
  echo "sbatch job $id: $(grep -o 'JobState=[A-Z_]*' <<<"$st") ExitCode=${code/ /:}" >&2
  [ "${code%% *}" != 0 ] && return "${code%% *}"
  return 1
}
export -f sbatch_wait
run sbatch bash -c 'sbatch_wait "$@"' sbatch_wait --chdir="$tmp/sbatch" \
  --output="$tmp/sbatch/slurm.out" "$tmp/job.sh"
[ -s "$tmp/sbatch/slurm.out" ] && grep -q "wrote run.json" "$tmp/sbatch/slurm.out" ||
  fail "the sbatch job did not write run.json: $(tail -5 "$tmp/sbatch/slurm.out" 2>/dev/null)"

# the losses of every run, step by step, as run.json holds them
losses() {
  python3 -c 'import json, sys; print(" ".join(repr(s["loss"]) for s in json.load(open(sys.argv[1]))["steps"]))' \
    "$1" 2>/dev/null
}
want=$(losses "$tmp/mpirun/run.json")
[ "$(wc -w <<<"$want")" -eq 4 ] || fail "the mpirun run has no 4 losses: '$want'"
echo "slurm: losses   mpirun  $want"
for name in srun salloc sbatch; do
  got=$(losses "$tmp/$name/run.json")
  echo "slurm: losses   $(printf '%-7s' "$name") $got"
  [ "$got" = "$want" ] || fail "$name's losses differ from mpirun's: '$got' against '$want'"
done

# a rank lost under srun (SIGKILL at step 2): the job ends, status 1, the rank named
mkdir -p "$tmp/lost"
(cd "$tmp/lost" && timeout 120 "$px" run "$tmp/plan.json" --launcher srun --quiet --fail-rank 1 --fail-step 2) \
  >"$tmp/lost.out" 2>&1
st=$?
[ $st -eq 1 ] && grep -q "rank 1: step 2: killed on purpose" "$tmp/lost.out" ||
  fail "a rank lost under srun: status $st (expected 1): $(tail -5 "$tmp/lost.out")"

[ $fails -eq 0 ] && echo "slurm: srun, salloc and sbatch trained the plan with mpirun's losses; a lost rank ended the srun job"
exit $((fails > 0))
