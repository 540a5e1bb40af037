"""The probe: one bash script that gathers every signal in one round trip, and its output split back into sections.

Pure: building the script and splitting its output are string work. Only values from the
validated configuration reach the script, each quoted with `shlex.quote`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Protocol

from bot.core.formats import step_grep_ere
from bot.core.gpu_window import MAX_WINDOW_S
from bot.core.gpus import PROBE_QUERY
from bot.core.sections import LINE_CAP
from bot.core.window_cache import OVERLAP_BYTES, STEP_LINES, WINDOW_BYTES, Seen


# Step lines may lie further back than the window (a long traceback, a flood of warnings):
# look in growing slices from the end, never the whole file, so the cost stays flat in the log's size.
STEP_SEARCH_BYTES = (1 << 20, 16 << 20, 64 << 20)
MOVED_WINDOW_BYTES = 16 * 1024  # the end of the file a writer moved to (a rotated log): enough for its last steps
# The most an honest probe prints: each run's window, step lines, moved window and process lists, and the
# GPU sections once (nvidia-smi -q for many GPUs, gpu_samples readings). The bot reads no more than this
# and stops the probe past it: in a CT, `bash` and `ps` are the tenant's, and may print anything.
RUN_OUTPUT_BYTES = WINDOW_BYTES + STEP_LINES * (LINE_CAP + 1) + MOVED_WINDOW_BYTES + (64 << 10)
GPU_OUTPUT_BYTES = 1 << 20
GPU_QUERY = ",".join(PROBE_QUERY)
PROCESS_HINT = r"python|torchrun|deepspeed|accelerate"


class ProbeTarget(Protocol):
    """What the probe needs to know about a run (config.registry.Run satisfies it)."""

    log: str
    step_pattern: str | None
    gpu_samples: int


def build_script(run: ProbeTarget, nonce: str, *, window_bytes: int = WINDOW_BYTES, seen: Seen | None = None) -> str:
    """The whole probe for one run as one bash script: a group of one (see build_group_script)."""
    return build_group_script([run], nonce, window_bytes=window_bytes, seen=[seen])


def build_group_script(runs: Sequence[ProbeTarget], nonce: str, *, window_bytes: int = WINDOW_BYTES,
                       seen: Sequence[Seen | None] = ()) -> str:
    """The probe for runs that share a container (or a host) as one bash script: one pass over /proc, one set
    of GPU readings, then each run's own sections after a `run N` marker (bot.core.sections.split_runs).

    Every section starts on a marker line `@@RB:<nonce>@@ <name>` that a log cannot forge
    (the nonce is fresh per probe). Each part's exit status and stderr come back as sections
    `<name>.rc` and `<name>.err`, so a failing tool is reported as such, never as "empty".
    `seen`: per run, what the last look saw of its log (bot.core.window_cache): an unchanged log is only stat'ed,
    a grown one sends its new bytes; a run without one (or beyond the list) is read in full.
    """
    if not re.fullmatch(r"[A-Za-z0-9]{8,64}", nonce):
        raise ValueError("nonce must be 8-64 letters or digits")
    if not runs:
        raise ValueError("a probe needs at least one run")
    samples = max(1, max(int(run.gpu_samples) for run in runs))  # the GPUs are shared: read them once, for all
    # Without the driver's window: readings spread over about a second; nvidia-smi itself takes ~30-100 ms a call.
    interval = 0.0 if samples == 1 else max(0.02, round(1.0 / (samples - 1) - 0.06, 3))
    caps = " ".join(str(c) for c in STEP_SEARCH_BYTES)
    values = {
        "NONCE": nonce,
        "WINDOW": str(int(window_bytes)),
        "CAPS": caps,
        "GPU_N": str(samples),
        "GPU_GAP": f"{interval:g}",
        "GPU_QUERY": GPU_QUERY,
        "GPU_WINDOW_MAX": f"{MAX_WINDOW_S:g}",
        "PROC_HINT": PROCESS_HINT,
        "STEP_LINES": str(STEP_LINES),
        "LINE_CAP": str(LINE_CAP),
        "MOVED_WINDOW": str(MOVED_WINDOW_BYTES),
        "OVERLAP": str(OVERLAP_BYTES),
    }
    assigns = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    # Each run's own values as array elements, each quoted: the body indexes them, never splices them.
    assigns.append("LOGS=(" + " ".join(shlex.quote(run.log) for run in runs) + ")")
    assigns.append("STEP_ERES=(" + " ".join(shlex.quote(step_grep_ere(run.step_pattern)) for run in runs) + ")")
    looks = [*seen, *[None] * len(runs)][:len(runs)]
    for name, field in (("SEEN_INODES", "inode"), ("SEEN_SIZES", "size"), ("SEEN_MTIMES", "mtime")):
        assigns.append(f"{name}=(" + " ".join(shlex.quote(_whole(getattr(s.stat, field)) if s else "") for s in looks) + ")")
    return "\n".join(assigns) + "\n" + _BODY


def _whole(value: int) -> str:
    """A seen number as the script compares it: a non-negative integer, or nothing is sent."""
    if type(value) is not int or value < 0:
        raise ValueError(f"a seen inode, size or mtime must be a whole number, not {value!r}")
    return str(value)


# The script body is constant: only the assignments above vary, so nothing from a run's
# configuration is ever spliced into code. It needs bash, coreutils, grep, ps and /proc.
# The section grammar (bot.core.sections) in bash: shared with the host probe (bot.probe.host_script).
SECTION_FUNCTIONS = r"""mark() { printf '\n@@RB:%s@@ %s\n' "$NONCE" "$1"; }
part() {  # part NAME FUNCTION: stdout as section NAME, then NAME.rc and NAME.err
  local name=$1 err rc
  mark "$name"
  { err=$("$2" 2>&1 1>&3 3>&-); rc=$?; } 3>&1
  mark "$name.rc"; printf '%s' "$rc"
  if [ -n "$err" ]; then mark "$name.err"; printf '%s' "${err:0:2000}"; fi
}
"""

_BODY = r"""
export LC_ALL=C
now() { printf '%s' "${EPOCHREALTIME:-$(date +%s)}"; }
""" + SECTION_FUNCTIONS + r"""
gpu_window() { $GPU_T nvidia-smi -q -d UTILIZATION; }

gpu_read() {  # reading N: `# sample N t=… rc=N`, then the rows (stderr merged: the parser reads failures from it)
  local out rc
  out=$($GPU_T nvidia-smi --query-gpu="$GPU_QUERY" --format=csv,noheader,nounits 2>&1); rc=$?
  printf '# sample %d t=%s rc=%d\n%s\n' "$1" "$(now)" "$rc" "${out:0:8000}"
  return "$rc"
}

window_ok() {  # window_ok PART READING: does the driver's window cover every GPU of the reading?
  # The same rules as bot/core/gpu_window.py (tests/test_gpu_window.py holds the two to each other):
  # rc 0; per GPU of the reading, a block of its bus id, no MIG or vGPU in it, and a GPU Utilization
  # Samples sub-block with 0 < Duration <= GPU_WINDOW_MAX, Number of Samples > 0, Min <= Avg <= Max <= 100.
  R=$2 awk -v mk="@@RB:$NONCE@@ " -v cap="$GPU_WINDOW_MAX" '
    function key(b,   p, i) {  # 00000000:00:06.0 -> 0:0:6.0, as bus_key()
      if (b !~ /^[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$/) return ""
      split(tolower(b), p, /[:.]/)
      for (i = 1; i <= 4; i++) { sub(/^0+/, "", p[i]); if (p[i] == "") p[i] = "0" }
      return p[1] ":" p[2] ":" p[3] "." p[4]
    }
    index($0, mk) == 1 { sec = substr($0, length(mk) + 1); bus = ""; next }
    sec == "gpu.window.rc" { rc = $0; next }
    sec != "gpu.window" { next }
    /^GPU [^ ]+ *$/ { b = $2; bus = key(b); if (bus != "") seen[bus] = 1; title = ""; next }
    bus == "" { next }
    /(^|[^A-Za-z0-9_])MIG([^A-Za-z0-9_]|$)/ || /(^|[^A-Za-z0-9_])[vV]GPU/ { shared[bus] = 1 }
    /^    [^ ]/ { title = $0; sub(/^ +/, "", title); sub(/ +$/, "", title); next }
    title == "GPU Utilization Samples" && /^        [^ ]/ && index($0, ":") {
      k = $0; sub(/^ +/, "", k); sub(/ *:.*$/, "", k)
      v = $0; sub(/^[^:]*: */, "", v); sub(/ +$/, "", v)
      if (!((bus, k) in val)) val[bus, k] = v
    }
    function pct(v) { return v ~ /^[0-9]+ %$/ && v + 0 <= 100 }
    function good(b,   d, n, hi, lo, avg) {
      if (!(b in seen) || (b in shared)) return 0
      d = val[b, "Duration"]; n = val[b, "Number of Samples"]
      hi = val[b, "Max"]; lo = val[b, "Min"]; avg = val[b, "Avg"]
      if (d !~ /^[0-9]+(\.[0-9]+)? sec$/ || n !~ /^[0-9]+$/ || !pct(hi) || !pct(lo) || !pct(avg)) return 0
      return d + 0 > 0 && d + 0 <= cap + 0 && n + 0 > 0 && lo + 0 <= avg + 0 && avg + 0 <= hi + 0
    }
    END {
      if (rc != "0") exit 1
      rows = split(ENVIRON["R"], line, "\n"); gpus = 0
      for (i = 1; i <= rows; i++) {
        if (line[i] !~ /^ *[0-9]+ *,/) continue
        split(line[i], f, ","); b = f[2]; gsub(/^ +| +$/, "", b)
        if (!good(key(b))) exit 1
        gpus++
      }
      exit (gpus == 0)
    }' <<< "$1"
}

gpu_rounds() {  # the driver's window and one reading; gpu_samples readings over ~1 s only where the window cannot serve
  if ! command -v nvidia-smi >/dev/null 2>&1; then mark gpus; echo '@missing'; return 0; fi
  local w r rc i n=$GPU_N
  GPU_T=''
  command -v timeout >/dev/null 2>&1 && GPU_T='timeout 10'
  w=$(part gpu.window gpu_window)
  printf '%s' "$w"
  mark gpus
  case $w in  # -q hung for 10 s: a query would hang as long, and the probe's own timeout is near
    *"@@ gpu.window.rc"$'\n'124 | *"@@ gpu.window.rc"$'\n'124$'\n'*) printf '# sample 1 t=%s rc=124\n' "$(now)"; return 0 ;;
  esac
  r=$(gpu_read 1); rc=$?
  printf '%s\n' "$r"
  [ "$rc" -ne 0 ] && return 0   # a broken driver will not mend within a second
  window_ok "$w" "$r" && return 0
  for ((i = 2; i <= n; i++)); do
    sleep "$GPU_GAP"
    gpu_read "$i" || break
  done
  return 0
}

look() {  # in this shell: what of $LOG this look reads. VIEW=same: nothing (inode, size, mtime as seen); else the
  # bytes [FROM, SIZE): the last WINDOW (read), or for a grown log what came after the seen size and OVERLAP bytes
  # before it (grown; never more than WINDOW)
  local seen=${SEEN_SIZES[R]} size mtime inode
  VIEW=read; FROM=0; SIZE=0
  STAT=$(stat -L -c 'size=%s mtime=%Y inode=%i' -- "$LOG" 2>/dev/null) || { STAT=''; return 0; }
  size=${STAT#size=}; size=${size%% *}; mtime=${STAT#* mtime=}; mtime=${mtime%% *}; inode=${STAT##* inode=}
  [[ $size =~ ^[0-9]+$ ]] || { STAT=''; return 0; }
  SIZE=$size; FROM=$(( size > WINDOW ? size - WINDOW : 0 ))
  [[ -r $LOG && $seen =~ ^[0-9]+$ && $inode == "${SEEN_INODES[R]}" ]] || return 0
  if [[ $size == "$seen" && $mtime == "${SEEN_MTIMES[R]}" ]]; then VIEW=same
  elif (( size > seen && seen - OVERLAP >= FROM )); then VIEW=grown; FROM=$(( seen > OVERLAP ? seen - OVERLAP : 0 )); fi
}

meta() {
  # Builtins, not $(...): every fork shows when a sweep probes hundreds of runs.
  printf 'now=%s\nhost=%s\n' "${EPOCHREALTIME:-$(date +%s)}" "${HOSTNAME:-}"
  if [ -e "$LOG" ]; then
    if [ -n "$STAT" ]; then printf '%s\n' "$STAT"; else stat -L -c 'size=%s mtime=%Y inode=%i' -- "$LOG"; fi
    [ -r "$LOG" ] || echo 'readable=0'
  else
    echo 'exists=0'
    [ -d "$(dirname -- "$LOG")" ] || echo 'dir=0'
  fi
}

window() {  # exactly the bytes [FROM, SIZE) that stat counted: the bot knows where its copy ends
  [ -r "$LOG" ] && [ "$SIZE" -gt "$FROM" ] || return 0
  # A dd without byte offsets (an old busybox) refuses its arguments before reading: tail and head then.
  dd if="$LOG" iflag=skip_bytes,count_bytes skip="$FROM" count=$((SIZE - FROM)) bs="$WINDOW" status=none 2>/dev/null ||
    tail -c "+$((FROM + 1))" -- "$LOG" | head -c "$((SIZE - FROM))"
}

steps() {
  [ -r "$LOG" ] || return 0
  local cap size found
  size=$(stat -L -c %s -- "$LOG") || return 1
  for cap in $CAPS; do
    found=$(tail -c "$cap" -- "$LOG" | tr '\r' '\n' | grep -aE -- "$STEP_ERE" | tail -n "$STEP_LINES" | cut -c "1-$LINE_CAP")
    if [ -n "$found" ]; then printf 'cap=%s\n%s\n' "$cap" "$found"; return 0; fi
    [ "$cap" -ge "$size" ] && break
  done
  echo "cap=$cap"
}

scan() {  # one pass over /proc for the whole group: who holds each log open for writing, what cannot be seen
  local d i
  HIDDEN=0; WPIDS=()
  # A probe that may not look into other users' fds cannot tell "no writer" from "not allowed
  # to see it": count what it could not read, so the diagnosis does not call the run stopped.
  # (A process that exits between the glob and the test is gone, not hidden.)
  for d in /proc/[0-9]*/fd; do [[ -r $d && -x $d ]] || [[ ! -e $d ]] || HIDDEN=$((HIDDEN + 1)); done
  for i in "${!LOGS[@]}"; do WPIDS[i]=' '; done
  if command -v find >/dev/null 2>&1 && command -v realpath >/dev/null 2>&1; then scan_listed; else scan_each; fi
}

literal() {  # literal VAR PATH: VAR = PATH as a literal glob for find -lname, its * ? [ \ escaped (no fork)
  local p=${2//\\/\\\\}; p=${p//\*/\\*}; p=${p//\?/\\?}; printf -v "$1" '%s' "${p//\[/\\[}"
}

writing() {  # writing /proc/PID/fd/N: is that descriptor open for writing? (fdinfo's flags, octal: O_WRONLY or O_RDWR)
  local fd=$1 p flags=0 k v
  p=${fd#/proc/}; p=${p%%/*}
  while read -r k v; do [ "$k" = flags: ] && flags=$v && break; done < "/proc/$p/fdinfo/${fd##*/}" 2>/dev/null
  (( (8#$flags & 3) != 0 ))
}

held() {  # held FD_PATH PID I: record PID as a writer of log I if FD_PATH is open for writing
  writing "$1" || return 0   # opened read-only: a reader (tail -f), not the writer
  case ${WPIDS[$3]} in *" $2 "*) return 0 ;; esac
  WPIDS[$3]="${WPIDS[$3]}$2 "
}

scan_listed() {  # one find, told the logs' real paths, lists only the fds that point at one of them
  local real fd pid i pattern
  local -a names=() expr=()
  while IFS= read -r -d '' real; do names+=("$real"); done < <(realpath -mz -- "${LOGS[@]}" 2>/dev/null)
  for real in "${names[@]}"; do
    literal pattern "$real"
    expr+=(${expr[0]+-o} -lname "$pattern")
  done
  [ ${#expr[@]} -gt 0 ] || return 0
  while IFS= read -r -d '' fd; do
    pid=${fd#/proc/}; pid=${pid%%/*}
    for i in "${!LOGS[@]}"; do [[ $fd -ef ${LOGS[i]} ]] && held "$fd" "$pid" "$i"; done
  done < <(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 -type l \( "${expr[@]}" \) -printf '%p\0' 2>/dev/null)
}

scan_each() {  # without find or realpath: every fd against every log
  local fd i pid
  for fd in /proc/[0-9]*/fd/*; do
    for i in "${!LOGS[@]}"; do
      [[ $fd -ef ${LOGS[i]} ]] || continue
      pid=${fd#/proc/}; pid=${pid%%/*}
      held "$fd" "$pid" "$i"
    done
  done
}

writers() {
  [ -e "$LOG" ] || return 0
  local pids=${WPIDS[R]# }
  pids=${pids% }; pids=${pids// /,}
  echo "# hidden $HIDDEN"
  if [ -z "$pids" ]; then moved || near; return 0; fi
  ps -o pid=,etimes=,stat=,args= -p "$pids" | cut -c "1-$LINE_CAP"
}

near() {  # nobody writes $LOG: a training process working in its folder may open it for each write
  local dir=${LOG%/*} d p pid skip dirs=() pids='' i
  # The log's folder and two above it, but never a top-level one (/tmp, /home, /data): those hold everyone's work.
  d=$dir
  for ((i = 0; i < 3; i++)); do
    [[ $d == /*/* ]] || break
    dirs+=("$d"); d=${d%/*}
  done
  [ ${#dirs[@]} -gt 0 ] || return 0
  skip=" $(ancestors | tr '\n' ' ')"
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    case $skip in *" $pid "*) continue ;; esac
    for d in "${dirs[@]}"; do
      if [[ $p/cwd -ef $d ]]; then own "$pid" || pids="$pids${pids:+,}$pid"; break; fi
    done
  done
  [ -n "$pids" ] || return 0
  echo '# near'
  uses "${dirs[${#dirs[@]}-1]}" "$pids"
  # The probe's own subshells share its folder when runbot runs from the log's: their command line holds the nonce.
  ps -o pid=,etimes=,stat=,args= -p "$pids" | grep -aE -- "$PROC_HINT" | grep -av -e "$NONCE" | cut -c "1-$LINE_CAP"
  return 0
}

own() {  # own PID: is PID this probe's own child (a subshell, nvidia-smi, ps)? Those never count as the run
  local p=$1 rest stat i
  for ((i = 0; i < 32; i++)); do
    read -r stat < "/proc/$p/stat" 2>/dev/null || return 1
    rest=${stat##*) }; set -- $rest; p=$2
    [ "$p" = "$$" ] && return 0
    [ "$p" -gt 1 ] 2>/dev/null || return 1
  done
  return 1
}

uses() {  # uses DIR PIDS: per process, how it holds files under DIR (read-only, for writing) and the GPU:
  # `# use PID ppid=P r=N w=N g=N`. A TensorBoard in the folder only reads; the run writes, or holds a GPU.
  command -v find >/dev/null 2>&1 && command -v realpath >/dev/null 2>&1 || return 0
  local top pid fd kind stat rest
  local -A r=() w=() g=()
  top=$(realpath -m -- "$1" 2>/dev/null) || return 0
  literal top "$top"
  local -a procs=()
  for pid in ${2//,/ }; do procs+=("/proc/$pid/fd"); r[$pid]=0; w[$pid]=0; g[$pid]=0; done
  while read -r kind fd; do
    pid=${fd#/proc/}; pid=${pid%%/*}
    if [ "$kind" = g ]; then g[$pid]=$((g[$pid] + 1))
    elif writing "$fd"; then w[$pid]=$((w[$pid] + 1))
    else r[$pid]=$((r[$pid] + 1)); fi
  done < <(find "${procs[@]}" -mindepth 1 -maxdepth 1 -type l \( -lname '/dev/nvidia*' -printf 'g %p\n' \) -o \
             \( -lname "$top/*" -printf 'f %p\n' \) 2>/dev/null)
  for pid in ${2//,/ }; do
    read -r stat < "/proc/$pid/stat" 2>/dev/null || continue
    rest=${stat##*) }; set -- $rest
    printf '# use %s ppid=%s r=%s w=%s g=%s\n' "$pid" "$2" "${r[$pid]}" "${w[$pid]}" "${g[$pid]}"
  done
}

moved() {  # nobody writes $LOG: does a process write another file of its folder (a log rotated away under it)?
  local dir=${LOG%/*} base=${LOG##*/} cands c fd
  cands=$(ls -1t -- "$dir/$base"?* 2>/dev/null | head -n 3)
  while [ -n "$cands" ] && IFS= read -r c; do
    for fd in /proc/[0-9]*/fd/*; do
      [[ $fd -ef $c ]] && writing "$fd" || continue
      moved_to "$c" "$fd"
      return 0
    done
  done <<< "$cands"
  # Deleted under its writer (rm, then a new file by the same name): the writer's descriptor still reaches the old
  # inode, whose link reads `PATH (deleted)`; read it through the descriptor.
  command -v find >/dev/null 2>&1 && command -v realpath >/dev/null 2>&1 || return 1
  local real pattern
  real=$(realpath -m -- "$LOG" 2>/dev/null) || return 1
  literal pattern "$real (deleted)"
  while IFS= read -r -d '' fd; do
    writing "$fd" || continue
    moved_to "$real (deleted)" "$fd"
    return 0
  done < <(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 -type l -lname "$pattern" -print0 2>/dev/null)
  return 1
}

moved_to() {  # moved_to NAME FD: the file the writer writes instead of $LOG, read through its descriptor
  local pid=${2#/proc/}; pid=${pid%%/*}
  printf '# moved %s\n' "$1"
  stat -L -c 'size=%s mtime=%Y' -- "$2"
  ps -o pid=,etimes=,stat=,args= -p "$pid" | cut -c "1-$LINE_CAP"
  mark moved.window; tail -c "$MOVED_WINDOW" -- "$2"
}

ancestors() {  # this probe's own chain (bash, timeout, pct, sshd, or the bot itself): never "the run"
  local p=$$ rest stat
  # pid 1 counts only when it really is an ancestor (a test's PID namespace); a process
  # attached from outside (pct exec, docker exec) has ppid 0 and never reaches it.
  while [ -n "$p" ] && [ "$p" -gt 0 ] 2>/dev/null; do
    printf '%s\n' "$p"
    [ "$p" -eq 1 ] && break
    read -r stat < "/proc/$p/stat" 2>/dev/null || break
    rest=${stat##*) }; set -- $rest; p=$2   # field 4 (ppid), after the parenthesised command
  done
}

procs() {
  [ -e "$LOG" ] && return 0   # only "log not found" needs to know what else runs; ps is costly on busy hosts
  local skip
  skip=" $(ancestors | tr '\n' ' ')"
  # Snapshot first: a ps piped into grep would list that grep, whose arguments match the hint.
  local list
  list=$(ps -eo pid=,etimes=,stat=,args=) || return 1
  printf '%s\n' "$list" | awk -v skip="$skip" 'index(skip, " " $1 " ") == 0' \
    | grep -aE -- "$PROC_HINT" | grep -v -e "$NONCE" | head -n 20 | cut -c 1-300
}

exec 4< <(gpu_rounds)   # ~70 ms with the driver's window, ~1 s of sampling without: let it run while the logs are read
scan
for R in "${!LOGS[@]}"; do
  LOG=${LOGS[R]}; STEP_ERE=${STEP_ERES[R]}
  look
  mark "run $R"
  part meta meta
  if [ "$VIEW" = same ]; then
    mark unchanged   # a quiet log costs its stat: no window, no step search (the bot holds both)
  else
    if [ "$VIEW" = grown ]; then mark window.since; else mark window.from; fi
    printf '%s' "$FROM"
    part window window
    part steps steps
  fi
  part writers writers
  part procs procs
done
cat <&4   # gpu_rounds marks its own sections (gpu.window, gpus): shared by every run
mark end
"""


def output_bound(runs: int) -> int:
    """How many bytes of stdout a probe of `runs` runs may print: the runner stops it past this."""
    return GPU_OUTPUT_BYTES + runs * RUN_OUTPUT_BYTES
