#!/usr/bin/env bash
# make test: the whole suite, in three pytest runs so that a fresh machine does not wait for the
# control-plane binaries before it tests anything, and the real-node tier gets the machine to itself. The binaries (Go builds: most of a cold run's CPU)
# build in the background at the lowest priority while every test that needs none of them runs (those
# mostly wait on processes and timers); then the tests marked control_plane run. With the binaries
# cached, the build step returns at once. A build already running (CI starts one early) is waited for,
# not repeated (hack/build-binaries.sh holds a lock). Last, the real-node tier (tests/real): one real-node
# cluster (tests/support/realnode.py) that its tests share, in one process, after the images are built
# (an image build already running is waited for; an unchanged image rebuilds from its layer cache).
#
# usage: XDIST="-n 3 --dist loadfile" bash hack/test.sh [PYTEST ARGS...]   (make test passes its XDIST and PYTEST_ARGS)
# Exit: 0 when both runs pass; a half that selects no test (pytest's exit 5) counts as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python

build_log=$(mktemp -t binaries.XXXXXX.log)
nice -n 19 bash hack/build-binaries.sh >"$build_log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null' EXIT

passed() { [ "$1" = 0 ] || [ "$1" = 5 ]; }

t0=$(date +%s)
"$py" -m pytest -q -m "not control_plane" ${XDIST:-} "$@"
first=$?
echo "make test: the tests that need no control plane took $(( $(date +%s) - t0 ))s"

if ! wait "$build"; then
  tail -n 40 "$build_log" >&2
  echo "make test: building the control-plane binaries failed (whole log: $build_log); the tests that" \
    "need them did not run" >&2
  exit 1
fi
rm -f "$build_log"

t0=$(date +%s)
"$py" -m pytest -q -m "control_plane and not real_node" ${XDIST:-} "$@"
second=$?
echo "make test: the tests on the control plane took $(( $(date +%s) - t0 ))s"

# The real-node tier runs in one process (no XDIST): 2 cores hold one such cluster.
t0=$(date +%s)
"$py" -m tests.support.realnode run --rebuild --dir "$(mktemp -d -t realnode.XXXXXX)" -- \
  "$py" -m pytest -q -p no:cacheprovider -m real_node tests/real "$@"
third=$?
echo "make test: the real-node tier took $(( $(date +%s) - t0 ))s"

passed "$first" && passed "$second" && passed "$third"
