#!/usr/bin/env bash
# On the device: run several GPU scripts at once, each on its own GPUs, so one device call does the work of
# several (the machine has the cores; device time is what is scarce). Each argument is one job, a shell
# command line; job N gets its own OUT, MODEL_DIR and GPU_STATE (/tmp/job-N/...), so two jobs never share
# a file. A job still running after JOB_TIMEOUT_S (default 540) gets SIGTERM, its whole process group (the
# scripts stop their graphs on it), then SIGKILL 20 s later. When every job has ended, each job's output
# folder becomes $OUT/job-N.tgz (a device call brings back at most 8 files), its last 40 lines are
# printed, and the exit status is the number of jobs that failed.
#
#   bash tests/gpu/parallel.sh "GRAPH_GPUS=0 python3 tests/gpu/run_hicache.py" \
#                              "GRAPH_GPUS=1 python3 tests/gpu/run_lora.py agg"
set -uo pipefail
out=${OUT:-/tmp/dynamo-gpu-out}
limit=${JOB_TIMEOUT_S:-540}
mkdir -p "$out"
pids=()
n=0
for job in "$@"; do
  n=$((n + 1))
  dir=/tmp/job-$n
  mkdir -p "$dir/out" "$dir/state"
  echo "job-$n: $job"
  OUT=$dir/out MODEL_DIR=$dir/model GPU_STATE=$dir/state PYTHONUNBUFFERED=1 \
    setsid bash -c "$job" >"$dir/out/job.log" 2>&1 &
  pids+=("$!")
done
(
  sleep "$limit"
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null && echo "job of pid $pid: SIGTERM after ${limit}s"; done
  sleep 20
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
) &
watchdog=$!
failed=0
n=0
for pid in "${pids[@]}"; do
  n=$((n + 1))
  if wait "$pid"; then rc=0; else rc=$?; fi
  [ "$rc" = 0 ] || failed=$((failed + 1))
  echo "===== job-$n exit $rc ====="
  tail -n 40 "/tmp/job-$n/out/job.log"
  tar czf "$out/job-$n.tgz" -C "/tmp/job-$n" out
done
kill "$watchdog" 2>/dev/null
exit "$failed"
