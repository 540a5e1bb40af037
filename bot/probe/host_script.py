"""The host probe: one bash script run on the Proxmox host itself (outside every CT) — `pct list`, each running
CT's training processes and the files they write, and who holds each GPU (pure: string work).

Like bot.probe.script, the body is constant and only these assignments vary, each `shlex`-quoted; none of
them comes from Slack.
"""

from __future__ import annotations

import re
import shlex

from bot.core.host_view import (APPS_MAX, APPS_QUERY, CT_BYTES, CT_LINES, CT_MIN_BYTES, CTS_BYTES,
                                HOST_GPU_QUERY)
from bot.probe.script import PROCESS_HINT, SECTION_FUNCTIONS

CT_PARALLEL = 8  # `pct exec` at once: each is a perl process of ~50 MB on the host
CT_TIMEOUT_S = 10  # one CT's scan; a hung CT costs its own section, not the whole answer
PROC_ROOT = "/proc"  # where the host's processes' cgroup files are read; only tests lay out another


def build_host_script(nonce: str, skip: str, *, discover: bool, proc_root: str = PROC_ROOT) -> str:
    """The host probe; `discover` adds each running CT's scan (the GPU view alone needs none). `nonce` frames the
    answer and never reaches a CT; `skip` (letters and digits, not the nonce) is what each CT's scan is handed
    to know its own shells by (a CT that reads it learns nothing of the framing)."""
    if not re.fullmatch(r"[A-Za-z0-9]{8,64}", nonce):
        raise ValueError("nonce must be 8-64 letters or digits")
    if not re.fullmatch(r"[A-Za-z0-9]{8,64}", skip) or nonce in skip:
        raise ValueError("skip must be 8-64 letters or digits, and not hold the nonce")
    if not proc_root.startswith("/"):
        raise ValueError("proc_root must be an absolute path")
    values = {
        "NONCE": nonce,
        "SKIP": skip,
        "DISCOVER": "1" if discover else "0",
        "PROC_ROOT": proc_root,
        "PROC_HINT": PROCESS_HINT,
        "CT_PAR": str(CT_PARALLEL),
        "CT_TIMEOUT": str(CT_TIMEOUT_S),
        "CT_BYTES": str(CT_BYTES),
        "CT_MIN_BYTES": str(CT_MIN_BYTES),
        "CTS_BYTES": str(CTS_BYTES),
        "CT_LINES": str(CT_LINES),
        "APPS_MAX": str(APPS_MAX),
        "GPU_QUERY": ",".join(HOST_GPU_QUERY),
        "APPS_QUERY": ",".join(APPS_QUERY),
        "CT_SCAN": _CT_SCAN,
    }
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items()) + "\n" + _BODY


# Run inside each CT by `pct exec CT -- bash -c "$CT_SCAN" rb-scan TOKEN HINT`: the processes whose
# command line looks like training, and for each the regular files it holds open for writing. TOKEN (the
# CT's own, never the host's nonce) is an argument so that this scan's own shells (whose arguments hold the
# hint) are left out. Whatever runs in the CT may print anything instead: the host cuts and frames it (cts).
_CT_SCAN = r"""
export LC_ALL=C
token=$1 hint=$2
list=$(ps -eo pid=,etimes=,args=) || exit 1
while read -r pid et args; do
  [ "$pid" = "$$" ] && continue
  case $args in *"$token"*) continue ;; esac
  printf 'p\t%s\t%s\t%s\n' "$pid" "$et" "${args:0:300}"
  while IFS=$'\t' read -r fd path; do
    [[ $path == /* && $path != /dev/* && $path != /proc/* && $path != /sys/* ]] || continue
    [[ -f /proc/$pid/fd/$fd ]] || continue
    flags=0
    while read -r k v; do [ "$k" = flags: ] && flags=$v && break; done < "/proc/$pid/fdinfo/$fd" 2>/dev/null
    (( (8#$flags & 3) == 0 )) && continue   # read-only: not what it writes
    printf 'f\t%s\t%s\t%s\n' "$pid" "$fd" "$path"
  done < <(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 -type l -printf '%f\t%l\n' 2>/dev/null)
done < <(printf '%s\n' "$list" | grep -aE -- "$hint")
exit 0
"""

_BODY = r"""
export LC_ALL=C
""" + SECTION_FUNCTIONS + r"""T=''
command -v timeout >/dev/null 2>&1 && T="timeout $CT_TIMEOUT"

pct_list() { printf '%s\n' "$PCT_OUT"; return "$PCT_RC"; }

# One CT's answer, cut here on the host: at most CAP bytes and CT_LINES lines, whole lines only, then a last
# line of the cut's own: `~-`, `~bytes:CAP` or `~lines:N`. Whatever the CT prints, the host holds no more.
CUT_AWK='{ n += length($0) + 1 }
NR > lines { cut = "lines:" lines; exit }
n > cap { cut = "bytes:" cap; exit }
{ print }
END { print "~" (cut == "" ? "-" : cut) }'

scan_one() {  # scan_one VMID CAP: that CT's scan, kept in memory (bounded), then framed on stdout under the lock
  local out rc meta body
  # The CT's scan gets its own token, never the nonce, and no descriptor but the pipe it writes to (the
  # lock closed, stdin /dev/null). `timeout` on both ends: a CT process holding the pipe open ends too.
  out=$(exec {LOCK}>&-
        $T pct exec "$1" -- bash -c "$CT_SCAN" rb-scan "rb$SKIP$1" "$PROC_HINT" < /dev/null 2>&1 \
          | $T head -c "$(( $2 + 1 ))" | awk -v cap="$2" -v lines="$CT_LINES" "$CUT_AWK"
        exit "${PIPESTATUS[0]}") 2> /dev/null
  rc=$?
  meta=${out##*$'\n'}
  body=${out:0:${#out}-${#meta}}
  # The length frames the answer (LC_ALL=C: bytes), so nothing in it is read as anything but this CT's.
  read -r -n 1 -u "$LOCK" _
  printf '@@CT:%s@@ %s rc=%s len=%s cut=%s\n%s' "$NONCE" "$1" "$rc" "${#body}" "${meta#\~}" "$body"
  printf x >&"$LOCK"
}

cts() {  # every running CT scanned, CT_PAR at once; each answer printed whole under a lock, so none interleave
  local ct st rest ids=() cap n=0
  while read -r ct st rest; do
    [[ $ct =~ ^[0-9]+$ && $st == running ]] && ids+=("$ct")
  done < <(printf '%s\n' "$PCT_OUT")  # a pipe: a here-string may be a temp file
  [ "${#ids[@]}" -gt 0 ] || return 0
  # Each CT's share of CTS_BYTES, between CT_MIN_BYTES and CT_BYTES: many CTs flooding at once stay bounded too.
  cap=$(( CTS_BYTES / ${#ids[@]} ))
  (( cap > CT_BYTES )) && cap=$CT_BYTES
  (( cap < CT_MIN_BYTES )) && cap=$CT_MIN_BYTES
  exec {LOCK}<> <(:)  # a pipe open both ways, holding one token: the lock (no file anywhere)
  printf x >&"$LOCK"
  for ct in "${ids[@]}"; do
    scan_one "$ct" "$cap" < /dev/null &
    n=$((n + 1))
    if [ "$n" -ge "$CT_PAR" ]; then wait -n; n=$((n - 1)); fi
  done
  wait
  exec {LOCK}>&-
}

gpus() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then echo '@missing'; return 0; fi
  $T nvidia-smi --query-gpu="$GPU_QUERY" --format=csv,noheader,nounits
}

apps() { printf '%s\n' "$APPS_OUT"; return "$APPS_RC"; }

cgroups() {  # each GPU process's cgroup, which names its CT (read here, on the host: the driver gives host PIDs)
  # One pass of builtins, no process per row, APPS_MAX rows at most (split in memory: `read` would take a
  # pipe a byte at a time); only lines that can name a CT come back, so a CT's cgroup names add no `# pid`.
  local IFS=$'\n' row pid line rows lines
  set -f; rows=($APPS_OUT); set +f
  for row in "${rows[@]:0:APPS_MAX}"; do
    pid=${row%%,*}; pid=${pid// /}
    [[ $pid =~ ^[0-9]+$ ]] || continue
    printf '# pid %s\n' "$pid"
    lines=()
    mapfile -t -n 64 lines 2> /dev/null < "$PROC_ROOT/$pid/cgroup"
    for line in "${lines[@]}"; do [[ $line == *lxc* ]] && printf '%s\n' "$line"; done
  done
  return 0
}

PCT_OUT=$(pct list 2>&1); PCT_RC=$?
part pct pct_list
part gpus gpus
APPS_OUT='' APPS_RC=0
if command -v nvidia-smi >/dev/null 2>&1; then  # APPS_MAX rows and one more (which says there were more)
  APPS_OUT=$($T nvidia-smi --query-compute-apps="$APPS_QUERY" --format=csv,noheader,nounits 2>&1 \
             | head -n "$((APPS_MAX + 1))"; exit "${PIPESTATUS[0]}"); APPS_RC=$?
fi
part apps apps
part cgroups cgroups
[ "$DISCOVER" = 1 ] && [ "$PCT_RC" = 0 ] && { mark cts; cts; }
mark end
"""
