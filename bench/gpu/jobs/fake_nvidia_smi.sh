#!/usr/bin/env bash
# CPU dry runs only (run_jobs.sh puts it on PATH as `nvidia-smi` when DEVICE=cpu and FAKE_SMI=1):
# answers the few forms the capture and runbot use, with one made-up idle GPU, so a dry run
# writes the same files as the real one. Never used on the GPU machine.
q=""; lms=""; d=""
for a in "$@"; do
    case $a in
        --query-gpu=*) q=${a#--query-gpu=} ;;
        --query-compute-apps=*) exit 0 ;;
        -lms) lms=next ;;
        -L) echo "GPU 0: FAKE GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0 ;;
        *) [ "$lms" = next ] && lms=$a ;;
    esac
done
row() {
    local out="" f
    IFS=, read -ra fs <<< "$q"
    for f in "${fs[@]}"; do
        case $f in
            index) v=0 ;; pci.bus_id) v=00000000:00:00.0 ;; memory.used) v=0 ;; memory.total) v=143771 ;;
            utilization.gpu) v=0 ;; timestamp) v=$(date '+%Y/%m/%d %H:%M:%S.%3N') ;; name) v="FAKE GPU" ;;
            driver_version) v=0.0 ;; *) v="[N/A]" ;;
        esac
        out=${out:+$out, }$v
    done
    echo "$out"
}
if [ -n "$q" ]; then
    if [ -n "$lms" ] && [ "$lms" != next ]; then
        while :; do row; sleep "$(awk -v m="$lms" 'BEGIN{print m/1000}')"; done
    fi
    row; exit 0
fi
if [ "${1:-}" = -q ]; then
    printf '\n==============NVSMI LOG==============\n\nTimestamp                                 : %s\nDriver Version                            : fake\n\nAttached GPUs                             : 1\nGPU 00000000:00:00.0\n    Product Name                          : FAKE GPU\n    Utilization\n        GPU                               : 0 %%\n        Memory                            : 0 %%\n    GPU Utilization Samples\n        Duration                          : 0.00 sec\n        Number of Samples                 : 0\n        Max                               : 0 %%\n        Min                               : 0 %%\n        Avg                               : 0 %%\n\n' "$(date)"
    exit 0
fi
echo "fake nvidia-smi (dry run)"
