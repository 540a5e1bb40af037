#!/usr/bin/env bash
# A real throughput drop on the GPU, for the "slow" alert: a plain PyTorch loop trains at full speed,
# then a second process starts back-to-back bf16 matmuls on the same GPU (a noisy neighbour, the
# commonest real cause), then stops. The loop's own log (`step=N loss=X tok/s=Y elapsed=Zs`, measured
# by the loop) is kept byte for byte, with the times the load began and ended and nvidia-smi readings.
#
#   bash bench/gpu/run_contention.sh        # on the device: $OUT/contention/{train.log,events.txt,smi.txt}
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
JOBS=$REPO/bench/gpu/jobs
PY=${PY:-python3}
OUT=${OUT:-$REPO/bench/out}/contention
BEFORE=${BEFORE:-150}   # seconds at full speed
LOAD=${LOAD:-180}       # seconds with the neighbour
AFTER=${AFTER:-60}      # seconds after it left
mkdir -p "$OUT" /tmp/contention/ctl
rm -f /tmp/contention/ctl/stop
export JOB_EVENTS=$OUT/events.txt
cd /tmp/contention
$PY -u "$JOBS/plain_job.py" --mode rotate --control /tmp/contention/ctl --log-every 25 \
    --batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 > "$OUT/train.log" 2>&1 &
job=$!
( while kill -0 $job 2>/dev/null; do
    printf '%s ' "$(date +%s.%N)"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits
    sleep 5; done ) > "$OUT/smi.txt" 2>&1 &
sleep "$BEFORE"
echo "$(date +%s.%N) load_begin" >> "$OUT/events.txt"
$PY -u "$JOBS/util_load.py" --mode steady --secs "$LOAD" > "$OUT/load.txt" 2>&1
echo "$(date +%s.%N) load_end" >> "$OUT/events.txt"
sleep "$AFTER"
touch /tmp/contention/ctl/stop
wait $job
echo "rc=$?" >> "$OUT/events.txt"
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" > "$OUT/versions.txt" 2>&1
nvidia-smi -L >> "$OUT/versions.txt" 2>&1
wc -l "$OUT/train.log"; head -3 "$OUT/train.log"; tail -3 "$OUT/train.log"
