#!/bin/sh
# Slurm Epilog (slurmd, as root): remove this job's files from the job-mapping directory that
# prolog-gpu-job-map.sh wrote. A file that names another job (a later one on the same GPU) is
# left alone. Every failure exits 0: an epilog that fails drains the node.
dir="${GPU_JOB_MAP_DIR:-/run/dcgm-job-map}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "$gpus" ] && [ -n "${SLURM_JOB_ID:-}" ] || exit 0
[ -d "$dir" ] && [ ! -L "$dir" ] && [ -O "$dir" ] || exit 0
for gpu in $(printf '%s' "$gpus" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*) continue ;; esac
    file="$dir/$gpu"
    [ -f "$file" ] && [ ! -L "$file" ] || continue
    [ "$(head -c 64 "$file" 2>/dev/null)" = "$SLURM_JOB_ID" ] && rm -f "$file"
done
exit 0
