#!/usr/bin/env bash
# The one command for the GPU machine (issue 3): drive a real PyTorch training job through
# every phase of docs/diagnosis.md and, while each phase is live, ask runbot about it
# (`status`, `gpus`, `tail` on a `host = "local"` run), keeping runbot's answers, the raw
# probe output (`--save-probe`) and our own raw snapshot of the same signals.
#
#   bash bench/gpu/run_phases.sh            # on the device: results in $OUT/gpu-capture.tar.gz
#
# Everything lands in $CAP (under $WORK) and is packed into $OUT/gpu-capture.tar.gz plus
# $OUT/summary.txt after every scenario and on exit, so a cut-short run still returns what it
# caught. Knobs (environment): see the "knobs" block below and bench/gpu/README.md.
set -u -o pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TRAIN=$REPO/bench/gpu/train_llama.py

# ---------------------------------------------------------------- knobs
LIMIT=${LIMIT:-540}                  # whole script, seconds (device allows 600 a command)
PY=${PY:-python3}
OUT=${OUT:-$REPO/bench/out/gpu}
DEVICE=${DEVICE:-auto}               # auto|cuda|cpu (cpu: local dry run with tiny sizes)
SCENARIOS=${SCENARIOS:-"ok oom thread hang spin"}
SILENCE_WAIT=${SILENCE_WAIT:-25}     # log quiet this long (s) = silent phase; runbot's silence_after is 20s
BOT_TIMEOUT=${BOT_TIMEOUT:-60}       # one runbot command at most
BIG_ARGS=${BIG_ARGS:---layers auto --hidden 4096 --intermediate 11008 --heads 32 --vocab 32000 --save-dtype fp32 --target-load-s 25 --max-gb 32}
SMALL_ARGS=${SMALL_ARGS:---layers 8 --hidden 2048 --heads 16 --vocab 32000 --save-dtype bf16}
BIG_TRAIN_ARGS=${BIG_TRAIN_ARGS:---batch 4 --seq 512}
SMALL_TRAIN_ARGS=${SMALL_TRAIN_ARGS:---batch 8 --seq 1024}
BIG_SERIAL=${BIG_SERIAL:-1}          # 1: HF_DEACTIVATE_ASYNC_LOAD=1 for the big load (one loader thread)
EVICT=${EVICT:-1}                    # 1: drop the big checkpoint from the page cache before loading
DROP_CACHES=${DROP_CACHES:-1}        # 1: also try `echo 3 > /proc/sys/vm/drop_caches`
# probe rounds wanted per phase (a round = status + gpus + tail + raw snapshot)
R_NOLOG=${R_NOLOG:-1} R_IMPORTING=${R_IMPORTING:-1} R_STARTING=${R_STARTING:-1} R_LOADING=${R_LOADING:-4}
R_TRAINING_BIG=${R_TRAINING_BIG:-3} R_TRAINING=${R_TRAINING:-1} R_SILENT=${R_SILENT:-2}
R_THREADDIED=${R_THREADDIED:-2} R_CRASHED=${R_CRASHED:-2} R_FINISHED=${R_FINISHED:-2} R_KILLED=${R_KILLED:-1}

if [ -z "${WORK:-}" ]; then             # checkpoints need room: take the roomiest of these
    best=0
    for d in /tmp /var/tmp /root "$REPO/bench/out"; do
        mkdir -p "$d" 2>/dev/null || continue
        [ -w "$d" ] || continue
        a=$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')
        if [ -n "$a" ] && [ "$a" -gt "$best" ]; then best=$a; WORK=$d/runbot-gpu; fi
    done
fi
WORK=${WORK:-/tmp/runbot-gpu}
CAP=$WORK/capture
CKPT=$WORK/ckpt
CTL=$WORK/ctl
CFG=$CAP/runbot.toml
rm -rf "$CAP" "$CTL"
mkdir -p "$CAP/logs" "$CAP/probes" "$CTL" "$CKPT" "$OUT"

export NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( T0 + LIMIT - $(date +%s) )); }
log() { printf '[%s +%3ss] %s\n' "$(date +%T)" "$(elapsed)" "$*" | tee -a "$CAP/progress.txt"; }
note() { echo "$*" >> "$CAP/notes.txt"; log "$*"; }

# ---------------------------------------------------------------- cleanup, packing
JOB_TO_PID=""        # the `timeout` wrapping the current training job
JOB_RC=""
KILLED=0
SAMPLER_PID=""
BG_PIDS=()

stop_job() {  # TERM the current job (timeout forwards it), then KILL
    [ -n "$JOB_TO_PID" ] || return 0
    if kill -0 "$JOB_TO_PID" 2>/dev/null; then
        kill -TERM "$JOB_TO_PID" 2>/dev/null
        for _ in $(seq 1 20); do kill -0 "$JOB_TO_PID" 2>/dev/null || break; sleep 0.25; done
        local py; py=$(child_of "$JOB_TO_PID")
        [ -n "$py" ] && kill -KILL "$py" 2>/dev/null
        kill -KILL "$JOB_TO_PID" 2>/dev/null
    fi
    if [ -z "$JOB_RC" ]; then wait "$JOB_TO_PID" 2>/dev/null; JOB_RC=$?; fi
}

stop_sampler() {
    [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null && wait "$SAMPLER_PID" 2>/dev/null
    SAMPLER_PID=""
}

pack() {  # summary + tarball, callable any time
    write_summary > "$CAP/summary.txt" 2>&1
    cp "$CAP/summary.txt" "$OUT/summary.txt" 2>/dev/null
    tar -czf "$OUT/gpu-capture.tar.gz.tmp" -C "$WORK" capture 2>/dev/null &&
        mv -f "$OUT/gpu-capture.tar.gz.tmp" "$OUT/gpu-capture.tar.gz"
}

PACKED=0
on_exit() {
    [ "$PACKED" = 1 ] && return
    PACKED=1
    log "exit: stopping leftovers and packing"
    stop_sampler
    stop_job
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    pack
    log "packed $(du -h "$OUT/gpu-capture.tar.gz" 2>/dev/null | cut -f1) -> $OUT/gpu-capture.tar.gz"
}
trap on_exit EXIT
trap 'note "signal received, stopping"; exit 130' INT TERM

# ---------------------------------------------------------------- small helpers
child_of() {  # first child pid of $1 (no pgrep needed)
    local p
    for p in /proc/[0-9]*; do
        [ -r "$p/stat" ] || continue
        if [ "$(awk '{print $4}' "$p/stat" 2>/dev/null)" = "$1" ]; then echo "${p#/proc/}"; return; fi
    done
}

smi() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi "$@"; }

gpu_count() {
    local n
    n=$(smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
    echo "${n:-0}"
}

# ---------------------------------------------------------------- runbot
BOT_OK=0
SAVE_PROBE=0
RUN=""          # current run name
SCEN=""
LOG=""

BOT_RC=""
BOT_HEAD=""
run_bot() {  # file cmd... : one runbot command, its answer and meta into file; sets BOT_RC, BOT_HEAD
    local f=$1; shift
    local probedir
    probedir=$CAP/probes/$(basename "$f" .txt)
    local args=(--config "$CFG")
    [ "$SAVE_PROBE" = 1 ] && { mkdir -p "$probedir"; args+=(--save-probe "$probedir"); }
    local ph0=$PH t0 t1
    local to=$BOT_TIMEOUT l
    l=$(left)
    if [ $(( l - 10 )) -lt "$to" ]; then to=$(( l > 20 ? l - 10 : 10 )); fi
    t0=$(date +%s.%N)
    timeout -k 3 "$to" "$PY" -m bot "${args[@]}" "$@" > "$f.out" 2> "$f.err" < /dev/null
    BOT_RC=$?
    t1=$(date +%s.%N)
    BOT_HEAD=$(head -1 "$f.out" | cut -c1-160)
    [ -n "$BOT_HEAD" ] || BOT_HEAD="(no stdout) $(tail -1 "$f.err" | cut -c1-140)"
    phase_of
    {
        echo "\$ runbot ${args[*]} $*"
        echo "# scenario=$SCEN run=$RUN at=$(date -u -d "@${t0%.*}" +%FT%TZ) epoch=$t0 harness_phase_start=$ph0 harness_phase_end=$PH"
        echo "--- stdout"
        cat "$f.out"
        echo "--- stderr"
        cat "$f.err"
        awk -v rc="$BOT_RC" -v a="$t0" -v b="$t1" 'BEGIN { printf "--- rc=%s wall_s=%.2f\n", rc, b - a }'
    } > "$f"
    rm -f "$f.out" "$f.err"
}

raw_snapshot() {  # file: our own probe of the same signals, for fixtures and cross-checks
    local f=$1 py
    py=$(child_of "$JOB_TO_PID" 2>/dev/null)
    {
        echo "=== t=$(date +%s.%N) size=$(stat -c %s "$LOG" 2>/dev/null) mtime=$(stat -c %Y "$LOG" 2>/dev/null) phase=$PH pid=${py:-none}"
        echo "--- grep"
        tail -c 200000 "$LOG" 2>/dev/null | tr '\r' '\n' | grep -E 'step=' | tail -3
        echo "--- bar"
        tail -c 200000 "$LOG" 2>/dev/null | tr '\r' '\n' | grep -E '[0-9]+%\|' | tail -1
        echo "--- exc"
        grep -c -E 'Traceback|Exception in thread' "$LOG" 2>/dev/null
        echo "--- tail (last 3000 bytes, raw)"
        tail -c 3000 "$LOG" 2>/dev/null
        echo
        echo "--- smi"
        for i in 1 2 3 4 5; do
            echo "# t=$(date +%s.%N)"
            smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader 2>&1
            echo "rc=$?"
            [ "$i" -lt 5 ] && sleep 0.25
        done
        echo "--- apps"
        smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
        echo "rc=$?"
        echo "--- holders (processes with the log open)"
        find /proc/[0-9]*/fd -maxdepth 1 -lname "$LOG" 2>/dev/null | while read -r l; do
            p=${l#/proc/}; p=${p%%/*}
            echo "$p fd=${l##*/} etimes=$(ps -o etimes= -p "$p" 2>/dev/null | tr -d ' ') cmd=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-300)"
        done
        echo "--- ps"
        [ -n "$py" ] && ps -o pid,ppid,etimes,stat,pcpu,rss,nlwp,args -p "$py" 2>&1
    } > "$f" 2>&1
}

declare -A ROUNDS
probe_round() {  # phase: one round of every command, numbered per scenario+phase
    local ph=$1 n
    n=$(( ${ROUNDS[$ph]:-0} + 1 ))
    ROUNDS[$ph]=$n
    local base=$CAP/$SCEN-$ph-$n
    local ts; ts=$(date +%s.%N)
    local r1 r2 r3 head
    run_bot "$base-status.txt" status "$RUN"; r1=$BOT_RC; head=$BOT_HEAD
    run_bot "$base-gpus.txt" gpus "$RUN"; r2=$BOT_RC
    run_bot "$base-tail.txt" tail "$RUN" -n 30; r3=$BOT_RC
    raw_snapshot "$base-raw.txt"
    echo "$SCEN $ph $n start=$ts end=$(date +%s.%N) rc=$r1,$r2,$r3 harness_phase_after=$PH" >> "$CAP/rounds.txt"
    log "  $SCEN $ph #$n rc=$r1/$r2/$r3 (now $PH): $head"
}

# ---------------------------------------------------------------- job and phase
job_done() {
    [ -n "$JOB_TO_PID" ] || return 0
    if kill -0 "$JOB_TO_PID" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$JOB_TO_PID/stat" 2>/dev/null)" != Z ]; then
        return 1
    fi
    if [ -z "$JOB_RC" ]; then wait "$JOB_TO_PID" 2>/dev/null; JOB_RC=$?; fi
    return 0
}

PH=none
PH_DETAIL=""
phase_of() {  # sets PH from the log and the job, the way an operator would read them
    PH_DETAIL=""
    if [ -z "$JOB_TO_PID" ]; then
        if [ -e "$LOG" ]; then PH=stale; else PH=nolog; fi
        return
    fi
    if job_done; then
        if [ "$KILLED" = 1 ]; then PH=killed
        elif [ "$JOB_RC" = 0 ]; then PH=finished
        else PH=crashed; fi
        return
    fi
    if [ ! -e "$LOG" ]; then PH=nolog; return; fi
    local size mtime now
    size=$(stat -c %s "$LOG"); mtime=$(stat -c %Y "$LOG"); now=$(date +%s)
    if [ "$size" -eq 0 ]; then PH=importing; return; fi
    if ! grep -q 'step=' "$LOG"; then
        local bar
        bar=$(tail -c 20000 "$LOG" | tr '\r' '\n' | grep 'Loading weights' | tail -1)
        if [ -n "$bar" ] && ! grep -q '100%|' <<<"$bar"; then PH=loading; PH_DETAIL=$bar
        else PH=starting; fi
        return
    fi
    if (( now - mtime > SILENCE_WAIT )); then PH=silent; return; fi
    if grep -q 'Exception in thread' "$LOG"; then PH=threaddied; return; fi
    PH=training
}

start_sampler() {  # 1 s timeline: size, mtime, GPUs (like fixtures/real/timeline_ok.txt, lighter)
    local tl=$CAP/$SCEN-timeline.txt
    (
        while :; do
            echo "=== t=$(date +%s.%N) size=$(stat -c %s "$LOG" 2>/dev/null) mtime=$(stat -c %Y "$LOG" 2>/dev/null)"
            smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader 2>&1
            sleep 1
        done
    ) >> "$tl" 2>&1 &
    SAMPLER_PID=$!
}

start_job() {  # scen mode model extra-args...
    SCEN=$1; local mode=$2 model=$3; shift 3
    RUN=$SCEN
    LOG=$CAP/logs/train_$SCEN.log
    rm -f "$LOG" "$CTL/$SCEN"/*
    mkdir -p "$CTL/$SCEN"
    ROUNDS=()
    JOB_RC=""; KILLED=0
    local lim; lim=$(( $(left) - 5 )); [ "$lim" -gt 10 ] || lim=10
    local envs=(PYTHONPATH=)
    [ "$SCEN" = ok ] && [ "$BIG_SERIAL" = 1 ] && envs+=(HF_DEACTIVATE_ASYNC_LOAD=1)
    echo "$SCEN: env ${envs[*]} $PY -u $TRAIN train --model $model --mode $mode --steps 100000 --fail-at 0 --control $CTL/$SCEN --device $DEVICE $* > $LOG 2>&1" >> "$CAP/commands.txt"
    # The log is opened by the python process itself (exec), so it is the only writer runbot sees.
    timeout -k 5 "$lim" env "${envs[@]}" bash -c 'log=$1; shift; exec "$@" > "$log" 2>&1' _ "$LOG" \
        "$PY" -u "$TRAIN" train --model "$model" --mode "$mode" --steps 100000 --fail-at 0 \
        --control "$CTL/$SCEN" --device "$DEVICE" "$@" < /dev/null &
    JOB_TO_PID=$!
    SCEN_T0=$(date +%s)
    start_sampler
    log "$SCEN: started mode=$mode model=$(basename "$model") (timeout pid $JOB_TO_PID, limit ${lim}s)"
}

# drive SCEN through its phases. $1 = what to do once training rounds are in:
#   stop  (ok: finish cleanly)   fault (oom / thread / hang / spin)
# $2 = training rounds wanted
drive() {
    local action=$1 want_training=$2 triggered=0 stopped=0 last_ph=""
    declare -A WANT=(
        [importing]=$R_IMPORTING [starting]=$R_STARTING [loading]=$R_LOADING [training]=$want_training
        [silent]=$R_SILENT [threaddied]=$R_THREADDIED [crashed]=$R_CRASHED [finished]=$R_FINISHED
        [killed]=$R_KILLED
    )
    [ "$SCEN" = ok ] || WANT[starting]=0
    while :; do
        if [ "$(left)" -lt 20 ]; then note "$SCEN: out of time in phase $PH"; break; fi
        phase_of
        if [ "$PH" != "$last_ph" ]; then
            log "$SCEN: phase $PH ${PH_DETAIL:+($PH_DETAIL)}"
            echo "$SCEN $PH t=$(date +%s.%N) since_start=$(( $(date +%s) - SCEN_T0 ))s ${PH_DETAIL}" >> "$CAP/phases.txt"
            last_ph=$PH
        fi
        if [ "${ROUNDS[$PH]:-0}" -lt "${WANT[$PH]:-0}" ]; then
            probe_round "$PH"
            continue
        fi
        case $PH in
            training)
                if [ "$triggered" = 0 ] && [ "${ROUNDS[training]:-0}" -ge "$want_training" ]; then
                    touch "$CTL/$SCEN/$action"; triggered=1
                    log "$SCEN: $action (control file)"
                fi ;;
            threaddied)
                if [ "$stopped" = 0 ]; then touch "$CTL/$SCEN/stop"; stopped=1; log "$SCEN: stop (control file)"; fi ;;
            silent)
                log "$SCEN: killing the silent job"
                KILLED=1; stop_job ;;
            finished|crashed|killed)
                break ;;
        esac
        sleep 0.5
    done
    stop_sampler
    stop_job
    phase_of
    echo "$SCEN rc=${JOB_RC:-?} killed=$KILLED seconds=$(( $(date +%s) - SCEN_T0 )) rounds: $(for k in "${!ROUNDS[@]}"; do printf '%s=%s ' "$k" "${ROUNDS[$k]}"; done)" >> "$CAP/scenarios.txt"
    log "$SCEN: done rc=${JOB_RC:-?} in $(( $(date +%s) - SCEN_T0 ))s"
    JOB_TO_PID=""
    wait_gpus_free
    pack
}

wait_gpus_free() {  # the next scenario starts on clean GPUs
    local i
    for i in $(seq 1 40); do
        [ -z "$(smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return
        sleep 0.5
    done
    note "GPUs still have compute apps after 20 s: $(smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | tr '\n' ';')"
}

# ---------------------------------------------------------------- summary
write_summary() {
    echo "runbot GPU capture (bench/gpu/run_phases.sh) $(date -u +%FT%TZ), $(elapsed) s of LIMIT=$LIMIT"
    echo "== versions"; cat "$CAP/versions.txt" 2>/dev/null
    echo "== runbot"; cat "$CAP/runbot-preflight.txt" 2>/dev/null
    echo "== checkpoints"
    for f in "$CAP"/make-small.txt "$CAP"/make-big.txt "$CAP"/make-evict.txt; do
        [ -e "$f" ] && grep -E '^(make|evict):' "$f" | grep -v '^make: {' | sed "s/^/$(basename "$f" .txt): /" | cut -c1-400
    done
    grep -h drop_caches "$CAP/notes.txt" 2>/dev/null
    echo "== load (from the logs)"
    for l in "$CAP"/logs/*.log; do
        [ -e "$l" ] || continue
        printf '%s: %s | bar: %s\n' "$(basename "$l")" \
            "$(grep -a -m1 'Target 0 loaded' "$l" | sed 's/^ *//')" \
            "$(tr '\r' '\n' < "$l" | grep -a 'Loading weights' | tail -1 | sed 's/.*| *//')"
    done
    echo "== scenarios (rounds caught per phase)"; cat "$CAP/scenarios.txt" 2>/dev/null
    echo "== phase changes"; cat "$CAP/phases.txt" 2>/dev/null
    echo "== runbot exit codes (answers by rc)"
    grep -h -o -- '--- rc=[0-9]*' "$CAP"/*-status.txt "$CAP"/*-gpus.txt "$CAP"/*-tail.txt 2>/dev/null | sort | uniq -c
    echo "== notes"; cat "$CAP/notes.txt" 2>/dev/null
}

# ================================================================= main
log "run_phases: repo=$REPO work=$WORK out=$OUT limit=${LIMIT}s scenarios='$SCENARIOS'"

# 1. runbot's own dependencies, from wheels carried in .whl/
SITE=${SITE:-/tmp/site}
if [ "${INSTALL_WHEELS:-1}" != 1 ]; then
    note "wheels not installed (INSTALL_WHEELS=${INSTALL_WHEELS:-})"
elif ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$REPO"/.whl/*.whl > "$CAP/pip.txt" 2>&1; then
        note "pip --target failed (see pip.txt); unzipping the wheels instead"
        "$PY" - "$SITE" "$REPO"/.whl/*.whl <<'EOF' >> "$CAP/pip.txt" 2>&1
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
EOF
    fi
else
    note "no wheels in $REPO/.whl (run bench/gpu/make_wheels.sh and carry .whl)"
fi
export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}

# 2. what machine this is
{
    echo "python: $("$PY" -V 2>&1)"
    "$PY" - <<'EOF' 2>&1
import importlib
for m in ("torch", "transformers", "tqdm", "safetensors", "accelerate", "pydantic", "pydantic_settings"):
    try:
        mod = importlib.import_module(m)
        print(f"{m}: {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m}: MISSING ({type(e).__name__}: {e})")
try:
    import torch
    print("torch.cuda:", torch.version.cuda, "available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
except Exception as e:
    print("torch.cuda: ?", e)
EOF
    echo "gpus: $(smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tr '\n' ';')"
    echo "host: $(uname -srm), $(nproc) cpus, $(awk '/MemTotal/ {printf "%.0f GiB MemTotal", $2/1048576}' /proc/meminfo)"
    echo "work disk: $(df -h "$WORK" | awk 'NR==2 {print $2" size, "$4" free on "$6}')"
} > "$CAP/versions.txt" 2>&1
{
    smi; echo "rc=$?"
    smi -L; echo "rc=$?"
    smi topo -m; echo "rc=$?"
    echo "--- env"; env | grep -E '^(NCCL|CUDA|HF_|PYTHON|PATH=)' | sort
    echo "--- meminfo"; head -5 /proc/meminfo
    echo "--- df"; df -h
} > "$CAP/env.txt" 2>&1
log "$(tr '\n' ' ' < "$CAP/versions.txt" | cut -c1-400)"
NGPU=$(gpu_count)

# 3. runbot preflight: does the CLI import, does it know --save-probe?
{
    if "$PY" -c 'import bot.cli' > "$CAP/bot-import.txt" 2>&1; then BOT_OK=1; fi
    "$PY" -m bot --help > "$CAP/bot-help.txt" 2>&1
    echo "python -m bot --help rc=$?"
    if grep -q -- '--save-probe' "$CAP/bot-help.txt"; then SAVE_PROBE=1; fi
    echo "import bot.cli: $([ $BOT_OK = 1 ] && echo ok || echo "FAILED: $(tail -1 "$CAP/bot-import.txt")")"
    echo "--save-probe supported: $([ $SAVE_PROBE = 1 ] && echo yes || echo 'NO (answers only; raw-probe dirs stay empty)')"
    echo "git: $(git -C "$REPO" log --oneline -1 2>/dev/null) $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) changed files"
} > "$CAP/runbot-preflight.txt" 2>&1
log "$(tr '\n' ' ' < "$CAP/runbot-preflight.txt")"

# 4. runbot configuration: one local run per scenario, GPU roles
{
    echo "# written by bench/gpu/run_phases.sh"
    echo "[defaults]"
    echo 'silence_after = "20s"'
    echo 'loading_grace = "10m"'
    echo "gpu_samples = 5"
    for s in $SCENARIOS; do
        echo
        echo "[runs.$s]"
        echo 'host = "local"'
        echo "log = \"$CAP/logs/train_$s.log\""
        echo
        echo "[runs.$s.gpus]"
        echo "target = [0]"
        [ "$NGPU" -ge 2 ] && echo "drafter = [1]"
    done
} > "$CFG"
timeout 60 "$PY" -m bot --config "$CFG" check-config > "$CAP/check-config.txt" 2>&1
echo "rc=$?" >> "$CAP/check-config.txt"
timeout 120 "$PY" -m bot --config "$CFG" runs > "$CAP/runs-start.txt" 2>&1
echo "rc=$?" >> "$CAP/runs-start.txt"

# 5. checkpoints: the small one (fast loads) next to the big one (a loading bar you can catch)
# A checkpoint made by an earlier call on this machine with the same arguments is reused.
same_ckpt() {  # dir args
    [ "${REUSE:-1}" = 1 ] && [ -e "$1/make_info.json" ] && [ "$(cat "$1/.args" 2>/dev/null)" = "$2 $DEVICE" ]
}
small_rc=0
SMALL_PID=""
if same_ckpt "$CKPT/small" "$SMALL_ARGS"; then
    note "make small: reusing $CKPT/small from an earlier call"
    echo "reused: $(cat "$CKPT/small/make_info.json" | tr -d '\n')" > "$CAP/make-small.txt"
else
    rm -rf "$CKPT/small"
    log "make: small ($SMALL_ARGS) in the background"
    # shellcheck disable=SC2086
    PYTHONPATH='' timeout 200 "$PY" "$TRAIN" make --out "$CKPT/small" --device "$DEVICE" $SMALL_ARGS > "$CAP/make-small.txt" 2>&1 &
    SMALL_PID=$!; BG_PIDS+=("$SMALL_PID")
fi
BIG_OK=0
if [[ " $SCENARIOS " == *" ok "* ]] && [ "${SKIP_BIG:-0}" != 1 ]; then
    if same_ckpt "$CKPT/big" "$BIG_ARGS"; then
        BIG_OK=1
        note "make big: reusing $CKPT/big from an earlier call ($(du -sh "$CKPT/big" | cut -f1))"
        cp "$CKPT/big/make.txt" "$CAP/make-big.txt" 2>/dev/null
    else
        rm -rf "$CKPT/big"
        log "make: big ($BIG_ARGS)"
        big_env=(PYTHONPATH=)
        [ "$BIG_SERIAL" = 1 ] && big_env+=(HF_DEACTIVATE_ASYNC_LOAD=1)
        # shellcheck disable=SC2086
        if env "${big_env[@]}" timeout $(( $(left) - 200 > 60 ? $(left) - 200 : 60 )) \
                "$PY" "$TRAIN" make --out "$CKPT/big" --device "$DEVICE" $BIG_ARGS > "$CAP/make-big.txt" 2>&1; then
            BIG_OK=1
            echo "$BIG_ARGS $DEVICE" > "$CKPT/big/.args"
            cp "$CAP/make-big.txt" "$CKPT/big/make.txt"
        else
            note "make big FAILED (rc=$?): $(grep -v Writing "$CAP/make-big.txt" | tail -2 | tr '\n' ' ')"
        fi
    fi
    grep -E '^make: (calibrate|auto|created|saved)' "$CAP/make-big.txt" | while read -r l; do log "$l"; done
fi
if [ -n "$SMALL_PID" ]; then
    wait "$SMALL_PID"; small_rc=$?
    [ "$small_rc" = 0 ] && echo "$SMALL_ARGS $DEVICE" > "$CKPT/small/.args"
    grep -E '^make: (created|saved)' "$CAP/make-small.txt" | while read -r l; do log "$l"; done
fi
[ "$small_rc" = 0 ] || note "make small FAILED rc=$small_rc: $(tail -2 "$CAP/make-small.txt" | tr '\n' ' ')"
pack

# 6. before the first run: nothing there yet
SCEN=ok; RUN=ok; LOG=$CAP/logs/train_ok.log; JOB_TO_PID=""; ROUNDS=()
[[ " $SCENARIOS " == *" ok "* ]] && [ "$R_NOLOG" -gt 0 ] && { phase_of; probe_round nolog; }

# 7. the scenarios
need() { [ "$(left)" -ge "$1" ] || { note "skipping $2: $(left) s left, wants $1"; return 1; }; }
for s in $SCENARIOS; do
    case $s in
        ok)
            need 100 ok || continue
            if [ "$BIG_OK" = 1 ]; then
                model=$CKPT/big
                if [ "$EVICT" = 1 ]; then
                    PYTHONPATH='' timeout 120 "$PY" "$TRAIN" evict --model "$model" > "$CAP/make-evict.txt" 2>&1
                    log "$(tail -1 "$CAP/make-evict.txt")"
                fi
                if [ "$DROP_CACHES" = 1 ]; then
                    if (sync && echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then note "drop_caches: ok"
                    else note "drop_caches: not allowed here (fadvise eviction only)"; fi
                fi
                # shellcheck disable=SC2086
                start_job ok ok "$model" $BIG_TRAIN_ARGS
            else
                note "ok: big checkpoint missing, using the small one (no long loading phase)"
                # shellcheck disable=SC2086
                start_job ok ok "$CKPT/small" $SMALL_TRAIN_ARGS
            fi
            drive stop "$R_TRAINING_BIG" ;;
        oom|thread|hang|spin)
            case $s in oom) n=45 ;; thread) n=60 ;; *) n=$(( 40 + SILENCE_WAIT )) ;; esac
            need "$n" "$s" || continue
            # shellcheck disable=SC2086
            start_job "$s" "$s" "$CKPT/small" $SMALL_TRAIN_ARGS
            drive fault "$R_TRAINING" ;;
        *) note "unknown scenario $s" ;;
    esac
done

# 8. every run once more, side by side
SCEN=all; JOB_TO_PID=""
[ "$(left)" -ge 25 ] && { timeout 60 "$PY" -m bot --config "$CFG" runs > "$CAP/runs-end.txt" 2>&1; echo "rc=$?" >> "$CAP/runs-end.txt"; }
log "all scenarios done"
pack
PACKED=1
cat "$CAP/summary.txt"
log "packed $(du -h "$OUT/gpu-capture.tar.gz" 2>/dev/null | cut -f1) -> $OUT/gpu-capture.tar.gz"
exit 0
