#!/bin/sh
# Slurm Prolog (slurmd, as root): record the GPUs this job holds in the job-mapping directory,
# one file per GPU index naming the job id, the layout dcgm-exporter's --hpc-job-mapping-dir
# reads and gpu-exporter reads too (docs/slurm.md). Install as Prolog= or in a prolog.d/.
#
# SLURM_JOB_GPUS is Slurm's index of each GPU in the node's gres.conf list; it is the NVML
# index when gres.conf lists every GPU in device-minor order (AutoDetect=nvml does).
# A prolog that fails drains the node, so every failure here exits 0.
dir="${GPU_JOB_MAP_DIR:-/run/dcgm-job-map}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "$gpus" ] && [ -n "${SLURM_JOB_ID:-}" ] || exit 0
mkdir -p -m 0755 "$dir" 2>/dev/null
# Only a real directory of our own: a link, or another user's directory, could send root's
# writes elsewhere (keep it 0755 root, e.g. systemd-tmpfiles: d /run/dcgm-job-map 0755 root root).
[ -d "$dir" ] && [ ! -L "$dir" ] && [ -O "$dir" ] || exit 0
for gpu in $(printf '%s' "$gpus" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*) continue ;; esac
    # Written beside and renamed, so a reader never sees half a file; an exclusive GPU has one
    # job, so a file a lost epilog left behind is replaced rather than appended to. noclobber
    # creates the temporary file with O_EXCL: never through an existing name.
    tmp="$dir/.$gpu.$SLURM_JOB_ID"
    rm -f "$tmp"
    (set -C && printf '%s\n' "$SLURM_JOB_ID" >"$tmp") 2>/dev/null &&
        mv -f "$tmp" "$dir/$gpu" 2>/dev/null
done
exit 0
