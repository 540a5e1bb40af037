"""The host probe: one bash script run on the Proxmox host itself (outside every CT) — `pct list`, each running
CT's training processes and the files they write, and who holds each GPU (pure: string work).

Like bot.probe.script, the body is constant and only these assignments vary, each `shlex`-quoted; none of
them comes from Slack.
"""

from __future__ import annotations

import re
import shlex

from bot.core.host_view import APPS_QUERY, HOST_GPU_QUERY
from bot.probe.script import PROCESS_HINT, SECTION_FUNCTIONS

CT_PARALLEL = 8  # `pct exec` at once: each is a perl process of ~50 MB on the host
CT_TIMEOUT_S = 10  # one CT's scan; a hung CT costs its own section, not the whole answer
PROC_ROOT = "/proc"  # where the host's processes' cgroup files are read; only tests lay out another


def build_host_script(nonce: str, *, discover: bool, proc_root: str = PROC_ROOT) -> str:
    """The host probe; `discover` adds each running CT's scan (the GPU view alone needs none)."""
    if not re.fullmatch(r"[A-Za-z0-9]{8,64}", nonce):
        raise ValueError("nonce must be 8-64 letters or digits")
    if not proc_root.startswith("/"):
        raise ValueError("proc_root must be an absolute path")
    values = {
        "NONCE": nonce,
        "DISCOVER": "1" if discover else "0",
        "PROC_ROOT": proc_root,
        "PROC_HINT": PROCESS_HINT,
        "CT_PAR": str(CT_PARALLEL),
        "CT_TIMEOUT": str(CT_TIMEOUT_S),
        "GPU_QUERY": ",".join(HOST_GPU_QUERY),
        "APPS_QUERY": ",".join(APPS_QUERY),
        "CT_SCAN": _CT_SCAN,
    }
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items()) + "\n" + _BODY


# Run inside each CT by `pct exec CT -- bash -c "$CT_SCAN" rb-scan NONCE HINT`: the processes whose
# command line looks like training, and for each the regular files it holds open for writing. The nonce
# is an argument so that this scan's own shells (whose arguments hold the hint) are left out.
_CT_SCAN = r"""
export LC_ALL=C
nonce=$1 hint=$2
list=$(ps -eo pid=,etimes=,args=) || exit 1
while read -r pid et args; do
  [ "$pid" = "$$" ] && continue
  case $args in *"$nonce"*) continue ;; esac
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

scan_one() {  # scan_one VMID DIR: that CT's scan into DIR/VMID, its exit status into DIR/VMID.rc
  $T pct exec "$1" -- bash -c "$CT_SCAN" rb-scan "$NONCE" "$PROC_HINT" > "$2/$1" 2> "$2/$1.err"
  echo $? > "$2/$1.rc"
}

cts() {  # every running CT scanned, CT_PAR at once; printed one after another so that none interleave
  local dir ct st rest n=0 f
  dir=$(mktemp -d) || return 1
  while read -r ct st rest; do
    [[ $ct =~ ^[0-9]+$ && $st == running ]] || continue
    scan_one "$ct" "$dir" &
    n=$((n + 1))
    if [ "$n" -ge "$CT_PAR" ]; then wait -n; n=$((n - 1)); fi
  done <<< "$PCT_OUT"
  wait
  for f in "$dir"/*.rc; do
    [ -e "$f" ] || continue
    ct=${f##*/}; ct=${ct%.rc}
    printf '@@CT:%s@@ %s rc=%s\n' "$NONCE" "$ct" "$(< "$f")"
    cat "$dir/$ct"
    sed 's/^/e\t/' "$dir/$ct.err" | head -n 5
  done
  rm -rf -- "$dir"
}

gpus() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then echo '@missing'; return 0; fi
  $T nvidia-smi --query-gpu="$GPU_QUERY" --format=csv,noheader,nounits
}

apps() { printf '%s\n' "$APPS_OUT"; return "$APPS_RC"; }

cgroups() {  # each GPU process's cgroup, which names its CT (read here, on the host: the driver gives host PIDs)
  local pid rest
  while IFS=, read -r pid rest; do
    pid=${pid// /}
    [[ $pid =~ ^[0-9]+$ ]] || continue
    printf '# pid %s\n' "$pid"
    head -n 64 -- "$PROC_ROOT/$pid/cgroup"
  done <<< "$APPS_OUT"
  return 0
}

PCT_OUT=$(pct list 2>&1); PCT_RC=$?
part pct pct_list
[ "$DISCOVER" = 1 ] && [ "$PCT_RC" = 0 ] && { mark cts; cts; }
part gpus gpus
APPS_OUT='' APPS_RC=0
if command -v nvidia-smi >/dev/null 2>&1; then
  APPS_OUT=$($T nvidia-smi --query-compute-apps="$APPS_QUERY" --format=csv,noheader,nounits 2>&1); APPS_RC=$?
fi
part apps apps
part cgroups cgroups
mark end
"""
