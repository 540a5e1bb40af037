#!/usr/bin/env bash
# The one device command for the trainer captures: run REAL jobs of common trainers (HF
# Trainer, Lightning with its tqdm and rich bars, plain PyTorch loops, torch.compile) on the
# GPU, each writing `> train.log 2>&1`, and at chosen moments ask runbot about them
# (`status`, once per job `gpus`, on a `host = "local"` run), keeping runbot's answers
# verbatim, its raw probes (--save-probe) and our own snapshot of the same moment (a byte-exact
# copy of the log(s), stat, clock, the job's open files, ps, 3 nvidia-smi readings), so the
# probes can be re-made later off the GPU. Also captures nvidia-smi's utilisation window under
# three known loads (`util`).
#
#   LIMIT=520 bash bench/gpu/run_jobs.sh     # on the device: $OUT/jobs-capture.tar.gz + $OUT/summary.txt
#
# Progress lines go to stdout and never quote runbot's answers (only exit codes), so the
# expectations can be written from the logs before anyone reads an answer. Knobs: see below
# and bench/gpu/README.md.
set -u -o pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
JOBDIR=$REPO/bench/gpu/jobs

# ---------------------------------------------------------------- knobs
LIMIT=${LIMIT:-520}
PY=${PY:-python3}
OUT=${OUT:-$REPO/bench/out/jobs}
DEVICE=${DEVICE:-auto}                      # auto|cuda|cpu
JOBS=${JOBS:-"hf hf-nan lit-tqdm lit-rich dl-killed rotate util compile"}
WORK=${WORK:-/tmp/runbot-jobs}
BOT_TIMEOUT=${BOT_TIMEOUT:-45}
ROTATE_WAIT=${ROTATE_WAIT:-30}              # seconds between the rotation and the last rotate moment
UTIL_SECS=${UTIL_SECS:-15}                  # each known load, seconds
SILENCE_AFTER=${SILENCE_AFTER:-20s}
LOADING_GRACE=${LOADING_GRACE:-10m}
GPU_SAMPLES=${GPU_SAMPLES:-3}
FAKE_SMI=${FAKE_SMI:-1}                     # cpu only: put jobs/fake_nvidia_smi.sh on PATH as nvidia-smi
# job sizes (GPU defaults; a CPU dry run passes tiny ones)
HF_ARGS=${HF_ARGS:-"--layers 24 --hidden 1024 --heads 16 --vocab 32000 --seq 256 --batch 8 --steps 120 --logging-steps 10 --eval-steps 40 --save-steps 60 --eval-items 320 --item-sleep 0.012"}
HF_NAN_ARGS=${HF_NAN_ARGS:-"--layers 8 --hidden 1024 --heads 16 --vocab 32000 --seq 256 --batch 8 --steps 80 --item-sleep 0.012 --lr 1e20"}
LIT_ARGS=${LIT_ARGS:-"--epochs 3 --train-batches 50 --val-batches 30 --batch 16 --seq 128 --vocab 8192 --dim 512 --layers 6 --heads 8 --item-sleep 0.005"}
DL_ARGS=${DL_ARGS:-"--batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 --workers 2 --item-sleep 0.01"}
ROT_ARGS=${ROT_ARGS:-"--batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 --step-sleep 0.25"}
COMPILE_ARGS=${COMPILE_ARGS:-"--batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 --step-sleep 0.1"}
# moments: where in the job each one is taken (event counts; see the job functions)
HF_TRAIN_STEP=${HF_TRAIN_STEP:-15}
NAN_TRAIN_STEP=${NAN_TRAIN_STEP:-20}
LIT_MID_BATCH=${LIT_MID_BATCH:-25}
LIT_PAST_BATCH=${LIT_PAST_BATCH:-3}
DL_KILL_STEP=${DL_KILL_STEP:-30}
ROT_STEP=${ROT_STEP:-20}
COMPILE_TRAIN_STEP=${COMPILE_TRAIN_STEP:-20}
# issue 20's jobs (JOBS="lit-rich-busy renamed deleted tb-dead late-start")
LIT_BUSY_ARGS=${LIT_BUSY_ARGS:-"--epochs 1 --train-batches 5000 --val-batches 5 --batch 32 --seq 512 --vocab 16384 --dim 1024 --layers 12 --heads 16 --item-sleep 0"}
REPL_ARGS=${REPL_ARGS:-"--batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 --step-sleep 0.1"}
BUSY_LONG=${BUSY_LONG:-35}                  # seconds into training of the rich job's second moment (past silence_after)
STALL_SECS=${STALL_SECS:-18}                # the stall before its moment: the driver's ~14 s window all idle
REPLACED_WAIT=${REPLACED_WAIT:-28}          # seconds between the rename / delete and its later moment
TB_STEP=${TB_STEP:-15}
TB_SETTLE=${TB_SETTLE:-8}                   # TensorBoard's start and first reload before the moment
DEAD_WAIT=${DEAD_WAIT:-28}                  # seconds after the kill (or the second start) of the later moment
# round 8's jobs (JOBS="ddp-hang ddp-oom nccl-dup accel-bs sigstop segv")
DIST_ARGS=${DIST_ARGS:-"--batch 8 --seq 512 --vocab 16384 --dim 1024 --heads 16 --step-sleep 0.1"}
DDP_STEP=${DDP_STEP:-30}                    # the ddp jobs' training moment (the hang starts after it)
HANG_WAIT=${HANG_WAIT:-30}                  # seconds of the hang before its moment (silence_after is 20s)
DDP_OOM_STEP=${DDP_OOM_STEP:-20}            # rank 1's outlier batch
ACCEL_ARGS=${ACCEL_ARGS:-"--seq 131072 --start-batch 64 --vocab 16384 --dim 1024 --heads 16"}
STOP_STEP=${STOP_STEP:-20}                  # sigstop: SIGSTOP after this step, SIGCONT after HANG_WAIT
SEGV_STEP=${SEGV_STEP:-15}
# round 9's jobs (JOBS="hf-early elastic lit-val-crash jsonl nested")
HF_EARLY_ARGS=${HF_EARLY_ARGS:-"--layers 8 --hidden 512 --heads 8 --vocab 32000 --seq 256 --batch 8 --steps 400 --logging-steps 10 --eval-steps 40 --save-steps 40 --eval-items 160 --item-sleep 0.01"}
ELASTIC_FAIL=${ELASTIC_FAIL:-10}            # rank 1's failing step on the first attempt
# round 10's jobs (JOBS="dl-hang save spawn anomaly sigterm")
SAVE_GB=${SAVE_GB:-40}                      # save: the size of its one large save
SAVE_MOMENT=${SAVE_MOMENT:-21}              # save: seconds after the save's announcement (silence_after is 20s)
SPAWN_FAIL=${SPAWN_FAIL:-25}                # spawn: rank 1's failing step
ANOMALY_FAIL=${ANOMALY_FAIL:-25}            # anomaly: the step whose loss turns NaN
# round 11's jobs (JOBS="oom-retry scale resume eval-long")
REC_ARGS=${REC_ARGS:-"--batch 16 --seq 256 --vocab 16384 --dim 768 --layers 8 --heads 12 --step-sleep 0.1"}
RETRY_PAUSE=${RETRY_PAUSE:-8}               # oom-retry: the pause after each OOM (its moment is 3 s into it)
LOAD_SECS=${LOAD_SECS:-20}                  # resume: the relaunch's checkpoint load
EVAL_SECS=${EVAL_SECS:-45}                  # eval-long: each evaluation (its moments at 8 s and 30 s)

if [ "$DEVICE" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi

CAP=$WORK/capture
CKPT=$WORK/ckpt
rm -rf "$CAP" "$CKPT"
mkdir -p "$CAP/jobs" "$CKPT" "$OUT"

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ "$DEVICE" = cpu ] && [ "$FAKE_SMI" = 1 ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    mkdir -p "$WORK/fakebin"
    cp "$JOBDIR/fake_nvidia_smi.sh" "$WORK/fakebin/nvidia-smi"
    chmod +x "$WORK/fakebin/nvidia-smi"
    export PATH=$WORK/fakebin:$PATH
fi

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( T0 + LIMIT - $(date +%s) )); }
log() { printf '[%s +%3ss] %s\n' "$(date +%T)" "$(elapsed)" "$*" | tee -a "$CAP/progress.txt"; }
note() { echo "$*" >> "$CAP/notes.txt"; log "NOTE $*"; }
now() { date +%s.%N; }

# ---------------------------------------------------------------- job state, cleanup, packing
JOB=""          # current job name (= runbot run name)
JD=""           # $CAP/jobs/$JOB
LOG=""          # the job's log
LOGDIR=""       # folder holding it (rotate: train.log and train.log.1)
EV=""           # the job's events file
CTL=""          # control folder (stop / fault files)
TO_PID=""       # the `timeout` wrapping the job
JOB_RC=""
BG_PIDS=()
EXTRA_PIDS=()   # role:pid of processes beside the job that a moment's snapshot lists too (a TensorBoard...)
JOB_CWD=""      # the job's working folder (default: its own scratch folder, not the log's)

job_pid() {  # the job's python (the child of timeout), or empty
    [ -n "$TO_PID" ] || return 0
    ps -o pid= --ppid "$TO_PID" 2>/dev/null | head -1 | tr -d ' '
}

descendants() {  # pid: it and all its descendants, one per line
    local p=$1 kids k
    echo "$p"
    kids=$(ps -o pid= --ppid "$p" 2>/dev/null)
    for k in $kids; do descendants "$k"; done
}

job_alive() {
    [ -n "$TO_PID" ] || return 1
    kill -0 "$TO_PID" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$TO_PID/stat" 2>/dev/null)" != Z ]
}

reap_job() {  # sets JOB_RC once the job has ended
    [ -n "$TO_PID" ] || return 0
    if [ -z "$JOB_RC" ] && ! job_alive; then wait "$TO_PID" 2>/dev/null; JOB_RC=$?; fi
}

stop_job() {  # TERM (timeout forwards it), then KILL the whole tree
    [ -n "$TO_PID" ] || return 0
    if job_alive; then
        local tree; tree=$(descendants "$TO_PID")
        kill -TERM "$TO_PID" 2>/dev/null
        for _ in $(seq 1 20); do job_alive || break; sleep 0.25; done
        for p in $tree; do kill -KILL "$p" 2>/dev/null; done
    fi
    [ -n "$JOB_RC" ] || { wait "$TO_PID" 2>/dev/null; JOB_RC=$?; }
}

pack() {
    write_summary > "$CAP/summary.txt" 2>&1
    cp "$CAP/summary.txt" "$OUT/summary.txt" 2>/dev/null
    tar -czf "$OUT/jobs-capture.tar.gz.tmp" -C "$WORK" capture 2>/dev/null &&
        mv -f "$OUT/jobs-capture.tar.gz.tmp" "$OUT/jobs-capture.tar.gz"
}

PACKED=0
on_exit() {
    [ "$PACKED" = 1 ] && return
    PACKED=1
    log "exit: stopping leftovers and packing"
    stop_job
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    stop_extras
    rm -rf "$CKPT"
    pack
    log "packed $(du -h "$OUT/jobs-capture.tar.gz" 2>/dev/null | cut -f1) -> $OUT/jobs-capture.tar.gz"
}
trap on_exit EXIT
trap 'note "signal received, stopping"; exit 130' INT TERM

smi() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi "$@"; }

# ---------------------------------------------------------------- runbot and the moment snapshot
CFG=$CAP/runbot.toml
SITE=${SITE:-/tmp/site}
BOTPATH=""      # PYTHONPATH for runbot (wheels + the copied code); the jobs run with none

run_bot() {  # file probe-dir cmd...: one runbot command, verbatim, with its meta; sets BOT_RC
    local f=$1 pd=$2; shift 2
    mkdir -p "$pd"
    local t0 t1 to=$BOT_TIMEOUT l
    l=$(left); [ $(( l - 5 )) -lt "$to" ] && to=$(( l > 15 ? l - 5 : 10 ))
    t0=$(now)
    PYTHONPATH=$BOTPATH timeout -k 3 "$to" "$PY" -m bot --config "$CFG" --save-probe "$pd" "$@" \
        > "$f.out" 2> "$f.err" < /dev/null
    BOT_RC=$?
    t1=$(now)
    {
        echo "\$ runbot --config $CFG --save-probe $pd $*"
        echo "# job=$JOB started=$t0 ended=$t1"
        echo "--- stdout"; cat "$f.out"
        echo "--- stderr"; cat "$f.err"
        awk -v rc="$BOT_RC" -v a="$t0" -v b="$t1" 'BEGIN { printf "--- rc=%s wall_s=%.2f\n", rc, b - a }'
    } > "$f"
    rm -f "$f.out" "$f.err"
}

last_event() { [ -s "$EV" ] && tail -1 "$EV" || echo "(none)"; }

proc_block() {  # the job's processes (and the other processes of the moment): ps rows and their open files
    local pid tree p x
    pid=$(job_pid)
    if [ -z "$pid" ]; then echo "(no job process)"; else
        tree=$(descendants "$pid")
        echo "job pid=$pid tree=$(echo $tree)"
        for p in $tree; do pid_block "$p"; done
    fi
    for x in "${EXTRA_PIDS[@]}"; do  # role:pid, e.g. tensorboard:1234 (a process beside the job, and its tree)
        kill -0 "${x#*:}" 2>/dev/null || { echo "other ${x%%:*} pid=${x#*:} gone"; continue; }
        tree=$(descendants "${x#*:}")
        echo "other ${x%%:*} pid=${x#*:} tree=$(echo $tree)"
        for p in $tree; do pid_block "$p"; done
    done
}

pid_block() {  # one process: its command line, cwd, age, and ls -l of its fds (l-wx: open for writing)
    echo "### pid $1: $(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | cut -c1-400)"
    echo "# cwd -> $(readlink "/proc/$1/cwd" 2>&1) etimes=$(ps -o etimes= -p "$1" 2>/dev/null | tr -d ' ') ppid=$(ps -o ppid= -p "$1" 2>/dev/null | tr -d ' ')"
    echo "# ls -l /proc/$1/fd"
    ls -l "/proc/$1/fd" 2>&1
}

stat_logs() {  # stat of every file in the job's log folder
    local f
    for f in "$LOGDIR"/*; do
        [ -e "$f" ] || continue
        stat -c '%n size=%s mtime=%.9Y inode=%i links=%h' "$f" 2>&1
    done
}

MOMENTS=()
moment() {  # name [gpus]: snapshot + runbot status (and gpus) at this moment
    local name=$1 want_gpus=${2:-}
    local md=$JD/$name
    mkdir -p "$md/log" "$md/log-after"
    local snap=$md/snapshot.txt
    {
        echo "=== moment $JOB/$name"
        echo "clock=$(now) utc=$(date -u +%FT%T.%NZ)"
        echo "job_alive=$(job_alive && echo yes || echo no) job_rc=${JOB_RC:-} last_event=$(last_event)"
        echo "--- stat (before runbot)"
        stat_logs
    } > "$snap" 2>&1
    cp -p "$LOGDIR"/* "$md/log/" 2>/dev/null
    {
        echo "--- copied at $(now): $(cd "$md/log" && for f in *; do [ -e "$f" ] && printf '%s=%s ' "$f" "$(stat -c %s "$f")"; done)"
        echo "--- processes (before runbot)"
        proc_block
        echo "--- ps -eo pid,ppid,etimes,stat,args"
        ps -eo pid,ppid,etimes,stat,args 2>&1
    } >> "$snap" 2>&1
    # runbot now, and the GPU readings while it runs (the same moment)
    run_bot "$md/status.txt" "$md/probe-status" status "$JOB" &
    local bpid=$!
    local gpid=""
    if [ "$want_gpus" = gpus ]; then
        run_bot "$md/gpus.txt" "$md/probe-gpus" gpus "$JOB" &
        gpid=$!
    fi
    {
        echo "--- nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits (3 readings)"
        for i in 1 2 3; do
            echo "# t=$(now)"
            smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits 2>&1
            echo "rc=$?"
            [ "$i" -lt 3 ] && sleep 0.4
        done
        echo "--- nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
        smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
    } >> "$snap" 2>&1
    wait "$bpid"; local rc1; rc1=$(sed -n 's/^--- rc=\([0-9]*\).*/\1/p' "$md/status.txt" | tail -1)
    local rc2="-"
    if [ -n "$gpid" ]; then wait "$gpid"; rc2=$(sed -n 's/^--- rc=\([0-9]*\).*/\1/p' "$md/gpus.txt" | tail -1); fi
    {
        echo "--- after runbot: clock=$(now) job_alive=$(job_alive && echo yes || echo no) last_event=$(last_event)"
        stat_logs
        echo "--- processes (after runbot)"
        proc_block
    } >> "$snap" 2>&1
    cp -p "$LOGDIR"/* "$md/log-after/" 2>/dev/null
    MOMENTS+=("$JOB/$name")
    echo "$JOB $name status_rc=$rc1 gpus_rc=$rc2 at=$(sed -n 's/^clock=\([0-9.]*\).*/\1/p' "$snap") since_start=$(( $(date +%s) - JOB_T0 ))s last_event=[$(last_event)]" >> "$CAP/moments.txt"
    log "  $JOB/$name: status rc=$rc1 gpus rc=$rc2 (job $(job_alive && echo alive || echo "gone rc=${JOB_RC:-?}"), last event: $(last_event | cut -d' ' -f2-))"
}

wait_event() {  # ERE timeout: wait for a matching line in the events file; 1 if the job ended or time ran out
    local re=$1 to=$2 t_end
    t_end=$(( $(date +%s) + to ))
    while :; do
        grep -qE "$re" "$EV" 2>/dev/null && return 0
        if ! job_alive; then reap_job; note "$JOB: ended (rc=${JOB_RC:-?}) before event /$re/"; return 1; fi
        if [ "$(date +%s)" -ge "$t_end" ] || [ "$(left)" -lt 8 ]; then note "$JOB: no event /$re/ within ${to}s"; return 1; fi
        sleep 0.1
    done
}

wait_exit() {  # timeout: wait for the job to end
    local to=$1 t_end
    t_end=$(( $(date +%s) + to ))
    while job_alive; do
        if [ "$(date +%s)" -ge "$t_end" ] || [ "$(left)" -lt 8 ]; then note "$JOB: still running after ${to}s, stopping it"; stop_job; break; fi
        sleep 0.1
    done
    reap_job
}

LAUNCH=()       # a launcher module in front of the script (-m torch.distributed.run ...), set by a job
start_job() {  # name script args...: `python3 -u [LAUNCH] script args > train.log 2>&1`, the job's own cwd
    JOB=$1; local script=$2; shift 2
    JD=$CAP/jobs/$JOB
    LOGDIR=$CAP/logs/$JOB
    LOG=$LOGDIR/train.log
    EV=$JD/events.txt
    CTL=$WORK/ctl/$JOB
    rm -rf "$LOGDIR" "$CTL"
    mkdir -p "$JD" "$LOGDIR" "$CTL" "$CKPT/$JOB"
    : > "$EV"
    JOB_RC=""; MOMENTS=(); EXTRA_PIDS=()
    local cwd=${JOB_CWD:-$CKPT/$JOB}
    local lim; lim=$(( $(left) - 5 )); [ "$lim" -gt 10 ] || lim=10
    echo "$JOB: cd $cwd && $PY -u ${LAUNCH[*]} $JOBDIR/$script $* > $LOG 2>&1" >> "$CAP/commands.txt"
    # The python process gets the log as its stdout+stderr (exec), so it is the log's one writer, as in a
    # container; descriptors the driver's shell holds (pipes to the device tool) are closed first.
    (cd "$cwd" && exec env PYTHONPATH= JOB_EVENTS="$EV" timeout -k 5 "$lim" \
        bash -c 'log=$1; shift
            for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"; done
            exec "$@" > "$log" 2>&1' _ "$LOG" "$PY" -u "${LAUNCH[@]}" "$JOBDIR/$script" "$@" < /dev/null) &
    TO_PID=$!
    JOB_T0=$(date +%s)
    log "$JOB: started $script (pid $TO_PID, limit ${lim}s)"
}

end_job() {
    wait_exit 60
    echo "$JOB rc=${JOB_RC:-?} seconds=$(( $(date +%s) - JOB_T0 )) moments=${#MOMENTS[@]} [${MOMENTS[*]}]" >> "$CAP/jobs.txt"
    log "$JOB: done rc=${JOB_RC:-?} in $(( $(date +%s) - JOB_T0 ))s, ${#MOMENTS[@]} moments"
    TO_PID=""
    rm -rf "$CKPT/$JOB"
    wait_gpu_free
    pack
}

wait_gpu_free() {
    for _ in $(seq 1 40); do
        [ -z "$(smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return
        sleep 0.5
    done
    note "GPU still has compute apps after 20 s: $(smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | tr '\n' ';')"
}

need() { [ "$(left)" -ge "$1" ] || { note "skipping $2: $(left) s left, wants $1"; return 1; }; }

# ---------------------------------------------------------------- the jobs
# shellcheck disable=SC2086
job_hf() {
    start_job hf hf_job.py --mode ok --out "$CKPT/hf/out" --device "$DEVICE" $HF_ARGS
    sleep 0.5
    moment importing
    wait_event " step step=$HF_TRAIN_STEP " 90 && moment training gpus
    if wait_event " eval_begin " 90; then sleep 0.8; moment evaluating; fi
    if wait_event " save_begin " 90; then
        moment saving
        # still saving? the second part is torch.save of the optimizer state: no output at all
        if ! grep -q " save_end " "$EV"; then moment saving-late; fi
    fi
    wait_exit 150
    moment finished
    end_job
}

job_hf_nan() {
    start_job hf-nan hf_job.py --mode nan --out "$CKPT/hf-nan/out" --device "$DEVICE" $HF_NAN_ARGS
    wait_event " step step=$NAN_TRAIN_STEP " 90 && moment training-nan gpus
    wait_exit 120
    moment finished-nan
    end_job
}

job_lit() {  # name bar
    start_job "$1" lit_job.py --bar "$2" --device "$DEVICE" $LIT_ARGS
    wait_event " batch epoch=0 batch=$LIT_MID_BATCH " 90 && moment training-epoch0 gpus
    if [ "$2" = tqdm ]; then
        if wait_event " val_begin epoch=0" 60; then sleep 0.8; moment validating; fi
        wait_event " batch epoch=1 batch=$LIT_PAST_BATCH " 60 && moment training-epoch1
    else
        wait_event " epoch_begin epoch=1" 60 && moment epoch-boundary
    fi
    wait_exit 120
    moment finished
    end_job
}

job_dl() {
    start_job dl-killed plain_job.py --mode dl --device "$DEVICE" $DL_ARGS
    if wait_event " step step=$DL_KILL_STEP\$" 90; then
        moment training gpus
        local main w
        main=$(job_pid)
        w=$(ps -o pid= --ppid "$main" 2>/dev/null | tr -d ' ' | sort -n | head -1)
        if [ -n "$w" ]; then
            echo "kill -9 $w (DataLoader worker of $main: $(tr '\0' ' ' < "/proc/$w/cmdline" 2>/dev/null | cut -c1-200)) at $(now); workers: $(ps -o pid= --ppid "$main" | tr '\n' ' ')" >> "$JD/driver.txt"
            kill -9 "$w"
            log "dl-killed: kill -9 worker $w of $main"
        else
            note "dl-killed: no worker found under $main"
        fi
    fi
    wait_exit 60
    moment crashed
    end_job
}

job_rotate() {
    start_job rotate plain_job.py --mode rotate --control "$WORK/ctl/rotate" --device "$DEVICE" $ROT_ARGS
    if wait_event " step step=$ROT_STEP\$" 90; then
        moment training gpus
        local t_rot
        t_rot=$(date +%s)
        # logrotate's `create`: the writer keeps its fd, now on train.log.1
        (cd "$LOGDIR" && mv train.log train.log.1 && : > train.log)
        echo "rotated at $(now): mv train.log train.log.1 && : > train.log" >> "$JD/driver.txt"
        log "rotate: rotated (mv + create)"
        sleep 0.3
        moment rotated
        while [ $(( $(date +%s) - t_rot )) -lt "$ROTATE_WAIT" ] && job_alive && [ "$(left)" -gt 20 ]; do sleep 0.2; done
        moment rotated-30s
    fi
    touch "$CTL/stop"
    wait_exit 30
    end_job
}

job_compile() {
    start_job compile plain_job.py --mode compile --control "$WORK/ctl/compile" --device "$DEVICE" $COMPILE_ARGS
    if wait_event " compile_begin" 90; then
        sleep 1
        grep -q " compile_end" "$EV" && note "compile: the first step was done within 1 s"
        moment compiling
    fi
    if wait_event " step step=$COMPILE_TRAIN_STEP\$" 150; then
        moment training gpus
        touch "$CTL/fault"
        echo "fault file at $(now)" >> "$JD/driver.txt"
    fi
    wait_exit 60
    moment crashed
    end_job
}

# ---------------------------------------------------------------- issue 20: who writes, a silent bar, a replaced log
stop_extras() {  # the processes started beside a job (role:pid), and their trees
    local x p
    for x in "${EXTRA_PIDS[@]}"; do
        for p in $(descendants "${x#*:}"); do kill -KILL "$p" 2>/dev/null; done
    done
    EXTRA_PIDS=()
}

at_least() {  # seconds since-epoch: sleep until `date +%s` reaches it (or little time is left)
    while [ "$(date +%s)" -lt "$1" ] && [ "$(left)" -gt 15 ]; do sleep 0.2; done
}

# shellcheck disable=SC2086
job_lit_busy() {  # Lightning + RichProgressBar, GPU-bound: the log stands still while the GPU works; then a stall
    start_job lit-rich-busy lit_job.py --bar rich --control "$WORK/ctl/lit-rich-busy" --device "$DEVICE" $LIT_BUSY_ARGS
    if wait_event " batch epoch=0 batch=1 " 120; then
        local t1; t1=$(date +%s)
        at_least $(( t1 + 10 )); moment training-10s
        at_least $(( t1 + BUSY_LONG )); moment training-long gpus
        touch "$CTL/stall"; echo "stall file at $(now)" >> "$JD/driver.txt"
        wait_event " stall_begin " 20
        sleep "$STALL_SECS"
        moment stalled gpus
        rm -f "$CTL/stall"; touch "$CTL/stop"; echo "stall removed, stop file at $(now)" >> "$JD/driver.txt"
    fi
    wait_exit 60
    moment finished
    end_job
}

job_replaced() {  # name how: the log renamed (mv + create) or deleted (rm + create) under its writer
    local how=$2 t_rot
    start_job "$1" plain_job.py --mode rotate --control "$WORK/ctl/$1" --device "$DEVICE" $REPL_ARGS
    if wait_event " step step=$ROT_STEP\$" 90; then
        moment training gpus
        t_rot=$(date +%s)
        if [ "$how" = rename ]; then
            (cd "$LOGDIR" && mv train.log train.log.1 && touch train.log)
            echo "renamed at $(now): mv train.log train.log.1 && touch train.log" >> "$JD/driver.txt"
        else
            (cd "$LOGDIR" && rm train.log && touch train.log)
            echo "deleted at $(now): rm train.log && touch train.log" >> "$JD/driver.txt"
        fi
        sleep 1
        moment "$how"d
        at_least $(( t_rot + REPLACED_WAIT )); moment "$how"d-later gpus
    fi
    touch "$CTL/stop"
    wait_exit 30
    end_job
}

job_tb_dead() {  # a run killed beside a live TensorBoard started in the log's folder
    JOB_CWD=$CAP/logs/tb-dead
    start_job tb-dead plain_job.py --mode rotate --control "$WORK/ctl/tb-dead" --device "$DEVICE" --tb . $REPL_ARGS
    JOB_CWD=""
    if wait_event " step step=$TB_STEP\$" 90; then
        # The real TensorBoard of the image, working in the folder, its output outside it.
        local tb; tb=$(dirname "$(command -v "$PY")")/tensorboard
        [ -x "$tb" ] || tb="$PY -m tensorboard.main"
        # shellcheck disable=SC2086
        (cd "$LOGDIR" && exec env PYTHONPATH= $tb --logdir . --host 127.0.0.1 --port 6123 \
            --reload_interval 1 > "$JD/tensorboard.txt" 2>&1 < /dev/null) &
        EXTRA_PIDS+=("tensorboard:$!")
        sleep "$TB_SETTLE"
        moment training gpus
        local main; main=$(job_pid)
        kill -9 "$main"; echo "kill -9 $main (the job) at $(now)" >> "$JD/driver.txt"
        local t_kill; t_kill=$(date +%s)
        sleep 1; reap_job
        at_least $(( t_kill + 4 )); moment dead-4s
        at_least $(( t_kill + DEAD_WAIT )); moment dead-later gpus
    fi
    stop_extras
    wait_exit 20
    end_job
}

job_late() {  # a run killed; then another job started in its folder, after the log's last write
    JOB_CWD=$CAP/logs/late-start
    start_job late-start plain_job.py --mode rotate --control "$WORK/ctl/late-start" --device "$DEVICE" $REPL_ARGS
    JOB_CWD=""
    if wait_event " step step=$TB_STEP\$" 90; then
        moment training
        local main; main=$(job_pid)
        kill -9 "$main"; echo "kill -9 $main (the job) at $(now)" >> "$JD/driver.txt"
        sleep 1; reap_job
        sleep 2
        # A second job in the same folder, writing its own log there (eval.log), started after train.log's last write.
        mkdir -p "$WORK/ctl/late-second"
        (cd "$LOGDIR" && exec env PYTHONPATH= JOB_EVENTS="$JD/second-events.txt" "$PY" -u "$JOBDIR/plain_job.py" --mode rotate \
            --control "$WORK/ctl/late-second" --device "$DEVICE" $REPL_ARGS > "$LOGDIR/eval.log" 2>&1 < /dev/null) &
        local second=$!
        EXTRA_PIDS+=("second:$second")
        echo "second job pid $second started at $(now) in $LOGDIR (> eval.log)" >> "$JD/driver.txt"
        local t2; t2=$(date +%s)
        at_least $(( t2 + 6 )); moment second-6s
        at_least $(( t2 + DEAD_WAIT )); moment second-later gpus
        touch "$WORK/ctl/late-second/stop"; sleep 2
    fi
    stop_extras
    wait_exit 20
    end_job
}

# ---------------------------------------------------------------- round 8: launchers, ranks, signals
TORCHRUN=(-m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29533)

rank_pid() {  # rank: its pid, from the job's `ready` event
    sed -n "s/.* ready rank=$1 pid=\([0-9]*\).*/\1/p" "$EV" | tail -1
}

# shellcheck disable=SC2086
job_ddp_hang() {  # two DDP ranks; rank 1 stops answering; then it is SIGKILLed
    LAUNCH=("${TORCHRUN[@]}")
    start_job ddp-hang dist_job.py --mode hang --control "$WORK/ctl/ddp-hang" --device "$DEVICE" $DIST_ARGS
    LAUNCH=()
    if wait_event " step step=$DDP_STEP\$" 120; then
        moment training gpus
        touch "$CTL/stall"; echo "stall file at $(now)" >> "$JD/driver.txt"
        wait_event " stall_begin " 20
        local t; t=$(date +%s)
        at_least $(( t + HANG_WAIT )); moment hung gpus
        local r1; r1=$(rank_pid 1)
        if [ -n "$r1" ]; then
            kill -9 "$r1"; echo "kill -9 $r1 (rank 1) at $(now)" >> "$JD/driver.txt"; log "ddp-hang: kill -9 rank 1 ($r1)"
        else
            note "ddp-hang: no pid for rank 1"
        fi
    fi
    wait_exit 60
    moment rank-killed
    end_job
}

# shellcheck disable=SC2086
job_ddp_oom() {  # two DDP ranks; rank 1's outlier batch runs out of GPU memory
    LAUNCH=("${TORCHRUN[@]}")
    start_job ddp-oom dist_job.py --mode oom --oom-step "$DDP_OOM_STEP" --device "$DEVICE" $DIST_ARGS
    LAUNCH=()
    wait_event " step step=10\$" 120 && moment training
    wait_exit 90
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_nccl_dup() {  # two NCCL ranks on one GPU: NCCL refuses them
    LAUNCH=("${TORCHRUN[@]}")
    start_job nccl-dup dist_job.py --mode dup --device "$DEVICE" $DIST_ARGS
    LAUNCH=()
    sleep 2; moment starting
    wait_exit 90
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_accel_bs() {  # accelerate launch; find_executable_batch_size finds none
    LAUNCH=(-m accelerate.commands.launch --num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no)
    start_job accel-bs accel_job.py --device "$DEVICE" $ACCEL_ARGS
    LAUNCH=()
    wait_exit 120
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_sigstop() {  # the loop stopped (SIGSTOP) as a debugger or a job-control slip would, then continued
    start_job sigstop plain_job.py --mode rotate --control "$WORK/ctl/sigstop" --device "$DEVICE" $REPL_ARGS
    if wait_event " step step=$STOP_STEP\$" 90; then
        local main; main=$(job_pid)
        kill -STOP "$main"; echo "kill -STOP $main at $(now)" >> "$JD/driver.txt"
        local t; t=$(date +%s)
        at_least $(( t + HANG_WAIT )); moment stopped gpus
        kill -CONT "$main"; echo "kill -CONT $main at $(now)" >> "$JD/driver.txt"
        wait_event " step step=$(( STOP_STEP + 10 ))\$" 30 && moment resumed
    fi
    touch "$CTL/stop"
    wait_exit 30
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_segv() {  # a native crash inside the loop, with faulthandler on
    start_job segv plain_job.py --mode segv --faulthandler --control "$WORK/ctl/segv" --device "$DEVICE" $REPL_ARGS
    if wait_event " step step=$SEGV_STEP\$" 90; then
        moment training
        touch "$CTL/fault"; echo "fault file at $(now)" >> "$JD/driver.txt"
    fi
    wait_exit 30
    moment crashed
    end_job
}

# ---------------------------------------------------------------- round 9: early stops, restarts, formats
# shellcheck disable=SC2086
job_hf_early() {  # HF Trainer stopped by EarlyStoppingCallback far short of max_steps
    start_job hf-early hf_job.py --mode early --out "$CKPT/hf-early/out" --device "$DEVICE" $HF_EARLY_ARGS
    wait_event " step step=30 " 120 && moment training gpus
    if wait_event " eval_begin " 90; then sleep 0.8; moment evaluating; fi
    wait_exit 150
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_elastic() {  # name [rdzv args...]: torchrun --max-restarts 1: rank 1 fails on the first attempt, the agent restarts the group
    local name=$1; shift
    LAUNCH=("${TORCHRUN[@]}" --max-restarts 1 "$@")
    start_job "$name" dist_job.py --mode flaky --fail-step "$ELASTIC_FAIL" --steps 60 --device "$DEVICE" $DIST_ARGS
    LAUNCH=()
    if wait_event " fault " 120; then
        sleep 2; moment restarting
        wait_event " step step=15\$" 90 && moment training-again gpus
    fi
    wait_exit 90
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_lit_val_crash() {  # Lightning: the validation step of epoch 1 raises
    start_job lit-val-crash lit_job.py --bar tqdm --fail-val-epoch 1 --device "$DEVICE" $LIT_ARGS
    wait_event " batch epoch=1 batch=$LIT_MID_BATCH " 90 && moment training-epoch1 gpus
    wait_exit 90
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_jsonl() {  # a loop that logs JSON lines
    start_job jsonl plain_job.py --mode json --steps 150 --device "$DEVICE" $REPL_ARGS
    wait_event " step step=40\$" 90 && moment training gpus
    wait_exit 60
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_nested() {  # tqdm: an outer bar over epochs, an inner one over batches with the loss as postfix
    start_job nested plain_job.py --mode nested --epochs 3 --per-epoch 60 --device "$DEVICE" $REPL_ARGS
    wait_event " step step=90 " 90 && moment training gpus
    wait_exit 60
    moment finished
    end_job
}

# ---------------------------------------------------------------- round 10: hangs, saves, launchers, preemption
# shellcheck disable=SC2086
job_dl_hang() {  # every DataLoader worker blocks; the loop waits in next(), alive, the GPU idle; then it goes on
    start_job dl-hang plain_job.py --mode dl-hang --control "$WORK/ctl/dl-hang" --device "$DEVICE" $DL_ARGS
    if wait_event " step step=20\$" 120; then
        moment training gpus
        touch "$CTL/fault"; echo "fault file (workers block) at $(now)" >> "$JD/driver.txt"
        sleep $(( HANG_WAIT + 5 )); moment hung gpus
        rm -f "$CTL/fault"; echo "fault file removed at $(now)" >> "$JD/driver.txt"
        wait_event " step step=40\$" 60 && moment resumed
    fi
    touch "$CTL/stop"
    wait_exit 30
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_save() {  # a save of --save-gb GB, announced before and after, then more steps
    start_job save plain_job.py --mode save --save-at 30 --save-gb "$SAVE_GB" --control "$CKPT/save" --device "$DEVICE" $REPL_ARGS
    wait_event " step step=20\$" 120 && moment training
    if wait_event " save_begin " 60; then
        sleep "$SAVE_MOMENT"
        grep -q " save_end " "$EV" && note "save: the save ended before its moment"
        moment saving gpus
        wait_event " step step=40\$" 120 && moment training-after
    fi
    touch "$CKPT/save/stop"
    wait_exit 30
    moment finished
    end_job
}

# shellcheck disable=SC2086
job_spawn() {  # torch.multiprocessing.spawn of two processes; rank 1 raises, spawn raises in the parent
    start_job spawn plain_job.py --mode spawn --ranks 2 --fail-step "$SPAWN_FAIL" --steps 200 --device "$DEVICE" $REPL_ARGS
    wait_event " step step=10\$" 120 && moment training gpus
    wait_exit 60
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_anomaly() {  # autograd's anomaly mode finds the NaN a sqrt of a negative number gives, and raises in backward
    start_job anomaly plain_job.py --mode anomaly --fail-step "$ANOMALY_FAIL" --steps 200 --device "$DEVICE" $REPL_ARGS
    wait_event " step step=10\$" 120 && moment training
    wait_exit 60
    moment crashed
    end_job
}

# shellcheck disable=SC2086
job_sigterm() {  # a preemptible loop: SIGTERM, a checkpoint, exit 0
    start_job sigterm plain_job.py --mode sigterm --control "$CKPT/sigterm" --device "$DEVICE" $REPL_ARGS
    if wait_event " step step=25\$" 120; then
        moment training
        local main; main=$(job_pid)
        kill -TERM "$main"; echo "kill -TERM $main at $(now)" >> "$JD/driver.txt"
    fi
    wait_exit 30
    moment preempted
    end_job
}

# ---------------------------------------------------------------- round 11: recoveries, quiet failures, relaunches
relaunch_job() {  # script args...: the same job launched again, appended to its log (a scheduler's requeue)
    local script=$1; shift
    local cwd=${JOB_CWD:-$CKPT/$JOB}
    local lim; lim=$(( $(left) - 5 )); [ "$lim" -gt 10 ] || lim=10
    echo "$JOB (relaunch): cd $cwd && $PY -u $JOBDIR/$script $* >> $LOG 2>&1" >> "$CAP/commands.txt"
    JOB_RC=""
    (cd "$cwd" && exec env PYTHONPATH= JOB_EVENTS="$EV" timeout -k 5 "$lim" \
        bash -c 'log=$1; shift
            for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"; done
            exec "$@" >> "$log" 2>&1' _ "$LOG" "$PY" -u "$JOBDIR/$script" "$@" < /dev/null) &
    TO_PID=$!
    log "$JOB: relaunched $script (pid $TO_PID, limit ${lim}s)"
}

# shellcheck disable=SC2086
job_oom_retry() {  # a hand-made batch-size search: each OOM's traceback printed, a retry at half the batch
    start_job oom-retry recover_job.py --mode oom-retry --batch-start 8192 --retry-pause "$RETRY_PAUSE" --steps 300 --device "$DEVICE" $REC_ARGS
    if wait_event " oom " 120; then
        sleep 3; moment after-oom gpus
        wait_event " step step=15\$" 120 && moment training
    fi
    stop_job
    moment stopped
    end_job
}

# shellcheck disable=SC2086
job_scale() {  # fp16 with GradScaler, every step's gradients overflowing: each step skipped, the scale halving
    start_job scale recover_job.py --mode scale --steps 300 --device "$DEVICE" $REC_ARGS
    wait_event " step step=40\$" 120 && moment training gpus
    stop_job
    end_job
}

# shellcheck disable=SC2086
job_resume() {  # killed with SIGKILL at step 25, relaunched by the driver onto the same log, resumed from ckpt-20
    start_job resume recover_job.py --mode resume --control "$CKPT/resume" --ckpt-every 10 --steps 300 --device "$DEVICE" $REC_ARGS
    if wait_event " step step=25\$" 120; then
        moment training
        local main; main=$(job_pid)
        kill -KILL "$main"; echo "kill -KILL $main at $(now)" >> "$JD/driver.txt"
        wait_exit 20
        sleep 3; moment killed
        relaunch_job recover_job.py --mode resume --resume --load-secs "$LOAD_SECS" --control "$CKPT/resume" --ckpt-every 10 --steps 300 --device "$DEVICE" $REC_ARGS
        if wait_event " load_begin\$" 120; then
            sleep 8; moment loading
            wait_event " step step=35\$" 120 && moment resumed
        fi
    fi
    stop_job
    end_job
}

# shellcheck disable=SC2086
job_eval_long() {  # an evaluation that prints nothing for EVAL_SECS, on the GPU, then training goes on
    start_job eval-long recover_job.py --mode eval-long --eval-every 25 --eval-secs "$EVAL_SECS" --steps 300 --device "$DEVICE" $REC_ARGS
    if wait_event " eval_begin " 120; then
        sleep 8; moment evaluating gpus
        sleep 22; moment evaluating-long gpus
        wait_event " eval_end " 60 && wait_event " step step=40\$" 60 && moment training-after
    fi
    stop_job
    end_job
}

# ---------------------------------------------------------------- nvidia-smi's utilisation window
util_timed() {  # file label cmd...: 5 timed calls, every output kept
    local f=$1 label=$2; shift 2
    local i a b
    for i in 1 2 3 4 5; do
        a=$(now)
        "$@" > "$f.$i.tmp" 2>&1
        local rc=$?
        b=$(now)
        {
            echo "### $label call $i: \$ $* -> rc=$rc start=$a end=$b seconds=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.4f", b-a}')"
            cat "$f.$i.tmp"
        } >> "$f"
        awk -v a="$a" -v b="$b" 'BEGIN{printf "%.4f\n", b-a}' >> "$f.times"
        rm -f "$f.$i.tmp"
    done
    echo "$label median_s=$(sort -n "$f.times" | sed -n 3p) all_s=$(tr '\n' ' ' < "$f.times")" >> "$UD/call-times.txt"
    rm -f "$f.times"
}

util_load() {  # load: steady | duty | idle
    local load=$1 lp="" ev=$UD/$1-events.txt
    : > "$ev"
    if [ "$load" != idle ]; then
        JOB_EVENTS=$ev PYTHONPATH= "$PY" -u "$JOBDIR/util_load.py" --mode "$load" --secs $(( UTIL_SECS + 12 )) \
            --device "$DEVICE" > "$UD/$load-load.txt" 2>&1 &
        lp=$!
        for _ in $(seq 1 300); do grep -q ready "$ev" && break; kill -0 "$lp" 2>/dev/null || break; sleep 0.1; done
        sleep 1   # let the window fill with this load only
    fi
    echo "$load window start=$(now)" >> "$UD/windows.txt"
    # 10 Hz reference over the same window
    timeout "$UTIL_SECS" nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 \
        > "$UD/$load-ref10hz.txt" 2>&1 &
    local rp=$!
    sleep $(( UTIL_SECS / 2 ))
    { echo "# t=$(now) (mid-window)"; nvidia-smi -q -d UTILIZATION 2>&1; } > "$UD/$load-q-util-mid.txt"
    wait "$rp"
    echo "$load window end=$(now)" >> "$UD/windows.txt"
    util_timed "$UD/$load-q-util.txt" "$load -q -d UTILIZATION" nvidia-smi -q -d UTILIZATION
    util_timed "$UD/$load-query.txt" "$load --query-gpu" nvidia-smi --query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits
    if [ -n "$lp" ]; then kill "$lp" 2>/dev/null; wait "$lp" 2>/dev/null; fi
    log "util: $load done"
}

job_util() {
    UD=$CAP/util
    mkdir -p "$UD"
    JOB=util; JOB_T0=$(date +%s)
    { echo "# t=$(now)"; nvidia-smi -q 2>&1; echo "rc=$?"; } > "$UD/nvidia-smi-q-full.txt"
    { echo "# t=$(now)"; nvidia-smi 2>&1; echo "rc=$?"; } > "$UD/nvidia-smi-plain.txt"
    for l in steady duty idle; do
        need $(( UTIL_SECS + 15 )) "util $l" || break
        util_load "$l"
    done
    echo "util rc=0 seconds=$(( $(date +%s) - JOB_T0 )) loads=$(grep -c start "$UD/windows.txt" 2>/dev/null)" >> "$CAP/jobs.txt"
    pack
}

# ---------------------------------------------------------------- summary
write_summary() {
    echo "runbot trainer-jobs capture (bench/gpu/run_jobs.sh) $(date -u +%FT%TZ), $(elapsed) s of LIMIT=$LIMIT, device=$DEVICE"
    echo "== versions"; cat "$CAP/versions.txt" 2>/dev/null
    echo "== runbot"; cat "$CAP/runbot-preflight.txt" 2>/dev/null
    echo "== jobs"; cat "$CAP/jobs.txt" 2>/dev/null
    echo "== moments (runbot exit codes only)"; cat "$CAP/moments.txt" 2>/dev/null
    echo "== util call times"; cat "$CAP/util/call-times.txt" 2>/dev/null
    echo "== util samples blocks (end of each window, call 1)"
    for l in steady duty idle; do
        f=$CAP/util/$l-q-util.txt
        [ -e "$f" ] || continue
        echo "-- $l: $(awk '/call 1:/{on=1} /call 2:/{on=0} on && /Duration|Number of Samples|Max|Min|Avg/' "$f" | sed 's/  */ /g' | tr '\n' ';' | cut -c1-400)"
        echo "   10 Hz ref: $(awk -F', ' 'NF>=2 && $2 ~ /^[0-9]+$/ {n++; s+=$2; if($2>m)m=$2} END{if(n) printf "n=%d mean=%.1f max=%d", n, s/n, m}' "$CAP/util/$l-ref10hz.txt")"
    done
    echo "== notes"; cat "$CAP/notes.txt" 2>/dev/null
}

# ================================================================= main
log "run_jobs: repo=$REPO work=$WORK out=$OUT limit=${LIMIT}s device=$DEVICE jobs='$JOBS'"

# 1. runbot's own dependencies from wheels (.whl beside or above the repo copy)
WHL=""
for d in "${WHEELS:-}" "$REPO/.whl" "$REPO/../.whl"; do
    [ -n "$d" ] && ls "$d"/*.whl >/dev/null 2>&1 && { WHL=$d; break; }
done
if [ "${INSTALL_WHEELS:-1}" = 1 ] && [ -n "$WHL" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHL"/*.whl > "$CAP/pip.txt" 2>&1 || note "pip --target failed (see pip.txt)"
    BOTPATH=$SITE:$REPO
else
    note "no wheels installed (INSTALL_WHEELS=${INSTALL_WHEELS:-1}, WHL=${WHL:-none})"
    BOTPATH=$REPO
fi

# 2. the machine
{
    echo "python: $("$PY" -V 2>&1) at $(command -v "$PY")"
    PYTHONPATH= "$PY" - <<'EOF' 2>&1
import importlib
for m in ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "rich", "tqdm", "peft", "safetensors", "numpy"):
    try:
        mod = importlib.import_module(m)
        v = getattr(mod, "__version__", None)
        if v is None:  # rich has no __version__
            from importlib.metadata import version
            v = version(m.replace("_", "-"))
        print(f"{m}: {v}")
    except Exception as e:
        print(f"{m}: MISSING ({type(e).__name__}: {e})")
try:
    import torch
    print("torch.cuda:", torch.version.cuda, "available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count(),
          "name:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
except Exception as e:
    print("torch.cuda: ?", e)
EOF
    PYTHONPATH=$BOTPATH "$PY" -c 'import pydantic, pydantic_settings; print("pydantic:", pydantic.VERSION, "pydantic_settings:", pydantic_settings.__version__)' 2>&1
    echo "gpus: $(smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1 | tr '\n' ';')"
    echo "host: $(uname -srm), $(nproc) cpus, $(awk '/MemTotal/ {printf "%.0f GiB MemTotal", $2/1048576}' /proc/meminfo)"
    echo "work disk: $(df -h "$WORK" | awk 'NR==2 {print $1", "$2" size, "$4" free on "$6}')"
    echo "tty: stdin=$([ -t 0 ] && echo tty || echo no) stdout=$([ -t 1 ] && echo tty || echo no) TERM=${TERM:-unset} COLUMNS=${COLUMNS:-unset} FORCE_COLOR=${FORCE_COLOR:-unset} NO_COLOR=${NO_COLOR:-unset} TTY_COMPATIBLE=${TTY_COMPATIBLE:-unset}"
} > "$CAP/versions.txt" 2>&1
{
    smi; echo "rc=$?"
    smi -L; echo "rc=$?"
    echo "--- env"; env | grep -E '^(NCCL|CUDA|HF_|TRANSFORMERS|TORCH|PYTHON|PATH=|TERM|COLUMNS|LANG|LC_)' | sort
    echo "--- df"; df -h
    echo "--- mounts"; grep -E ' /tmp | / ' /proc/mounts
} > "$CAP/env.txt" 2>&1
log "$(tr '\n' ' ' < "$CAP/versions.txt" | cut -c1-600)"

# 3. runbot preflight
{
    PYTHONPATH=$BOTPATH "$PY" -c 'import bot.cli' > "$CAP/bot-import.txt" 2>&1
    echo "import bot.cli rc=$? $(tail -1 "$CAP/bot-import.txt")"
    PYTHONPATH=$BOTPATH "$PY" -m bot --help > "$CAP/bot-help.txt" 2>&1
    echo "python -m bot --help rc=$?; --save-probe: $(grep -c -- '--save-probe' "$CAP/bot-help.txt")"
    echo "code: $(cat "$REPO/CODE_VERSION" 2>/dev/null || echo unknown)"
} > "$CAP/runbot-preflight.txt" 2>&1
log "$(tr '\n' ' ' < "$CAP/runbot-preflight.txt")"

# 4. runbot configuration: one local run per job
{
    echo "# written by bench/gpu/run_jobs.sh"
    echo "[defaults]"
    echo "silence_after = \"$SILENCE_AFTER\""
    echo "loading_grace = \"$LOADING_GRACE\""
    echo "gpu_samples = $GPU_SAMPLES"
    for j in hf hf-nan lit-tqdm lit-rich dl-killed rotate compile lit-rich-busy renamed deleted tb-dead late-start \
        ddp-hang ddp-oom nccl-dup accel-bs sigstop segv hf-early elastic elastic-c10d lit-val-crash jsonl nested \
        dl-hang save spawn anomaly sigterm oom-retry scale resume eval-long; do
        echo
        echo "[runs.$j]"
        echo 'host = "local"'
        echo "log = \"$CAP/logs/$j/train.log\""
        echo
        echo "[runs.$j.gpus]"
        echo "trainer = [0]"
    done
} > "$CFG"
PYTHONPATH=$BOTPATH timeout 60 "$PY" -m bot --config "$CFG" check-config > "$CAP/check-config.txt" 2>&1
echo "rc=$?" >> "$CAP/check-config.txt"
pack

# 5. the jobs
for j in $JOBS; do
    case $j in
        hf) need 80 hf && job_hf ;;
        hf-nan) need 40 hf-nan && job_hf_nan ;;
        lit-tqdm) need 50 lit-tqdm && job_lit lit-tqdm tqdm ;;
        lit-rich) need 45 lit-rich && job_lit lit-rich rich ;;
        dl-killed) need 35 dl-killed && job_dl ;;
        rotate) need $(( ROTATE_WAIT + 30 )) rotate && job_rotate ;;
        util) need $(( 3 * (UTIL_SECS + 8) )) util && job_util ;;
        compile) need 60 compile && job_compile ;;
        lit-rich-busy) need $(( BUSY_LONG + STALL_SECS + 50 )) lit-rich-busy && job_lit_busy ;;
        renamed) need $(( REPLACED_WAIT + 30 )) renamed && job_replaced renamed rename ;;
        deleted) need $(( REPLACED_WAIT + 30 )) deleted && job_replaced deleted delete ;;
        tb-dead) need $(( DEAD_WAIT + TB_SETTLE + 30 )) tb-dead && job_tb_dead ;;
        late-start) need $(( DEAD_WAIT + 35 )) late-start && job_late ;;
        ddp-hang) need $(( HANG_WAIT + 70 )) ddp-hang && job_ddp_hang ;;
        ddp-oom) need 60 ddp-oom && job_ddp_oom ;;
        nccl-dup) need 40 nccl-dup && job_nccl_dup ;;
        accel-bs) need 50 accel-bs && job_accel_bs ;;
        sigstop) need $(( HANG_WAIT + 50 )) sigstop && job_sigstop ;;
        segv) need 40 segv && job_segv ;;
        hf-early) need 90 hf-early && job_hf_early ;;
        elastic) need 80 elastic && job_elastic elastic ;;  # static rendezvous: the restarted group hung in init (gpu-jobs4)
        elastic-c10d) need 80 elastic-c10d && job_elastic elastic-c10d --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29544 ;;
        lit-val-crash) need 60 lit-val-crash && job_lit_val_crash ;;
        jsonl) need 45 jsonl && job_jsonl ;;
        nested) need 50 nested && job_nested ;;
        dl-hang) need $(( HANG_WAIT + 70 )) dl-hang && job_dl_hang ;;
        save) need $(( SAVE_MOMENT + 80 )) save && job_save ;;
        spawn) need 60 spawn && job_spawn ;;
        anomaly) need 50 anomaly && job_anomaly ;;
        sigterm) need 50 sigterm && job_sigterm ;;
        oom-retry) need $(( RETRY_PAUSE * 3 + 60 )) oom-retry && job_oom_retry ;;
        scale) need 50 scale && job_scale ;;
        resume) need $(( LOAD_SECS + 90 )) resume && job_resume ;;
        eval-long) need $(( EVAL_SECS + 60 )) eval-long && job_eval_long ;;
        *) note "unknown job $j" ;;
    esac
done

log "all jobs done"
rm -rf "$CKPT"
pack
PACKED=1
cat "$CAP/summary.txt"
log "packed $(du -h "$OUT/jobs-capture.tar.gz" 2>/dev/null | cut -f1) -> $OUT/jobs-capture.tar.gz"
exit 0
