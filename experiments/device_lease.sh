#!/usr/bin/env bash
# Everything hetsync checks on a lent GPU machine (one NVIDIA GPU, 16 cores), in one command
# of under 10 minutes: a lease is 15 minutes of device time, its start included.
#
#   bash experiments/device_lease.sh [OUT]       (OUT: where the logs and results go)
#
# 1. set-up: hetsync installed without dependencies into the machine's own Python, which has
#    CUDA torch and the rest (the machine has no network); Fashion-MNIST from .data/ if it
#    travelled (`carry`);
# then the steps STEPS names, in the order it names them (the real suite also takes
# REAL_CPUS, cores a worker, and REAL_REPEATS, runs a cell):
#    correctness: in parallel, the `gpu` tests and the state-dict runs; `hetsync train
#        --workers 4` with the defaults under every protocol; a user's script with its model
#        on the GPU (examples/batchnorm_mlp.py) under every protocol, its held-out accuracy
#        beside DDP's;
#    gpu-tests: the `gpu` tests and the state-dict runs alone;
#    gpu: the `gpu` suite, trimmed to one variant per family that matters here, short runs;
#    real: the `real` suite (8 pinned workers, real compute), trimmed likewise, one workload,
#        with its references: one worker alone, and the 8 alone at once (the machine's limit);
#    transport: experiments/transport_bandwidth.py with 8 processes (TRANSPORT_WORKERS), the
#        45 MB model: every protocol's path beside raw gloo's send, exchange and all-reduce;
#    tests: the whole test suite, 12 at a time (pytest-xdist is there).
# Each step has its own time limit, so a slow one cannot eat the next; what each wrote is
# packed into OUT/results.tgz (snapshots and checkpoints left out).
set -u
OUT=${1:-${OUT:-runs/lease}}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
PROTOCOLS="allreduce ddp dpsgd hop adpsgd ps prague localsgd"
GPU_VARIANTS=${GPU_VARIANTS:-allreduce,prague-pairs,adpsgd,hop-skip}
REAL_VARIANTS=${REAL_VARIANTS:-adpsgd,hop-stale-skip,prague,prague-lag}
REAL_WORKLOAD=${REAL_WORKLOAD:-resnet}
MAX_TIME=${MAX_TIME:-10}
STEPS=${STEPS:-correctness gpu real}  # which of the steps below to run, in this order

say "set-up"
if [ -d .data/fashion-mnist ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p /usr/share/datasets && cp -r .data/fashion-mnist /usr/share/datasets/
fi
# The machine's python3 is itself a venv (with CUDA torch): install into it, not a new one.
PY=$(command -v python3)
$PY -m pip install -q --no-deps --no-build-isolation -e . || exit 1
HS="$(dirname "$PY")/hetsync"
nvidia-smi -L; nproc; uptime; lscpu | head -25; lscpu -e  # SMT siblings: which cores share
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.device_count())"
mkdir -p runs/lease

XDIST=""; $PY -c "import xdist" 2>/dev/null && XDIST="-n ${XDIST_WORKERS:-4}"
gpu_tests() {  # in the background; $! is its pid
    timeout "${GPU_TESTS_LIMIT:-160}" $PY -m pytest -q -m "not slow" $XDIST --durations=15 \
        tests/gpu tests/api/test_state_dict.py > "$OUT/gpu-tests.txt" 2>&1 &
}

step_gpu_tests() {
say "the gpu tests and the state-dict runs"
gpu_tests; wait $!; echo "pytest rc=$?"; tail -25 "$OUT/gpu-tests.txt"
}

step_correctness() {
say "correctness: the gpu tests, the defaults and a user's GPU script under every protocol"
gpu_tests
TESTS=$!
DEADLINE=$(( $(date +%s) + 150 ))
defaults() {  # $1: train (a built-in workload, the defaults) or script (a user's, on the GPU)
    for p in $PROTOCOLS; do
        [ "$(date +%s)" -lt "$DEADLINE" ] || { echo "$1 $p: no time left"; continue; }
        if [ "$1" = train ]; then
            timeout 40 $HS train --protocol "$p" --workload digits --workers 4 \
                --max-iterations 30 --out "runs/lease/train/$p" > "runs/lease/train-$p.txt" 2>&1
            echo "train $p: rc=$? $(grep -ho 'note: .*' "runs/lease/train-$p.txt" | head -1)"
        else
            timeout 45 $HS launch --protocol "$p" --workers 4 --out "runs/lease/script/$p" \
                --quiet examples/batchnorm_mlp.py --epochs 30 > "runs/lease/script-$p.txt" 2>&1
            echo "script $p: rc=$? $(cat "runs/lease/script/$p/user_result.json" 2>/dev/null)"
        fi
    done
}
defaults train > "$OUT/train.txt" 2>&1 &
TRAIN=$!
defaults script > "$OUT/script.txt" 2>&1
wait $TESTS; echo "pytest rc=$?"; wait $TRAIN
tail -25 "$OUT/gpu-tests.txt"; cat "$OUT/train.txt" "$OUT/script.txt"
}

step_gpu() {
say "the gpu suite: $GPU_VARIANTS, $MAX_TIME s a run"
timeout -s INT -k 20 150 $HS bench --suite gpu --variants "$GPU_VARIANTS" --max-time "$MAX_TIME" \
    --out runs/lease/bench-gpu
tail -40 runs/lease/bench-gpu/results.md 2>/dev/null
}

step_real() {
say "the real suite on $REAL_WORKLOAD: $REAL_VARIANTS, $MAX_TIME s a run"
uptime; uname -r; ls /sys/fs/cgroup | head -5; cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
grep '^cpu' /proc/stat  # steal time, the 8th column: what the host took from each vCPU
rm -rf runs/lease/bench-real
timeout -s INT -k 20 ${REAL_LIMIT:-360} $HS bench --suite real --workload "$REAL_WORKLOAD" \
    --variants "$REAL_VARIANTS" --max-time "$MAX_TIME" --out runs/lease/bench-real \
    ${REAL_CPUS:+--cpus-per-worker "$REAL_CPUS"} ${REAL_REPEATS:+--repeats "$REAL_REPEATS"}
grep '^cpu' /proc/stat
tail -40 runs/lease/bench-real/results.md 2>/dev/null
$PY experiments/per_rank.py runs/lease/bench-real > "$OUT/per-rank.txt" 2>&1  # wait causes
grep -A9 "share.*hop" "$OUT/per-rank.txt" | head -30
}

step_transport() {  # not by default: every protocol's path against raw gloo, 8 processes
say "transport: every protocol's path beside raw gloo, ${TRANSPORT_WORKERS:-8} processes, 45 MB"
timeout -k 10 "${TRANSPORT_LIMIT:-150}" $PY experiments/transport_bandwidth.py \
    --workers "${TRANSPORT_WORKERS:-8}" --out "$OUT/transport" \
    > "$OUT/transport.txt" 2>&1
echo "transport: rc=$?"; sed -n '/^| path/,/^$/p' "$OUT/transport.txt"
}

step_tests() {  # not by default: the whole `make test`, 12 at a time
say "make test on the GPU machine (pytest -n 12)"
timeout -k 10 ${TESTS_LIMIT:-400} $PY -m pytest -q -n 12 > "$OUT/make-test.txt" 2>&1
echo "make test: rc=$?"; tail -30 "$OUT/make-test.txt"
}

for step in $STEPS; do
    "step_${step//-/_}"
done

say "packing"
tar czf "$OUT/results.tgz" --exclude='*.pt' --exclude='snapshots' --exclude='checkpoints' \
    runs/lease
say "done"
