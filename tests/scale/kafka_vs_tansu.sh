#!/usr/bin/env bash
# Rill's Kafka listener side by side with Tansu 0.6 (a Kafka-compatible broker
# in Rust), both driven by the same Kafka clients with the same parameters, and
# Rill's QUIC path in the same run for reference:
#   - produce throughput: confluent-kafka (librdkafka's batching producer, from
#     Python: tests/scale/kafka_bench.py produce) and kcat (C), RECORDS records
#     of 100 bytes, acks=1, linger.ms=5, batch.size=65536, no compression;
#   - consume throughput: the same records read back from the beginning
#     (kafka_bench.py consume; kcat -C ... -e into wc -l);
#   - end-to-end latency: kafka_bench.py latency (RATE records/s for
#     E2E_SECONDS s, 100-byte values carrying their send time, linger.ms=0,
#     acks=1, fetch.wait.max.ms=10), and for QUIC `rill bench e2e` at the same
#     rate, size and count;
#   - QUIC throughput: `rill bench produce/consume`, 1 producer, 1 consumer;
#   - after the runs, latency again at fetch.wait.max.ms 1 and 100 (FETCH_WAITS).
# Topics have 2 partitions on every path. Before each measurement the script
# waits (up to QUIET_WAIT s per run, 60 s per measurement) for the 1-minute load
# average to fall below QUIET_LOAD, and prints the load it ran at.
#
# Run from the repository root after `cargo build --release --bin rill` and
# `cargo install tansu@0.6.0 --locked --features dynostore --root /work/tansu`,
# with the test venv (target/tmp/kafka-venv, made by .ci/run or the Kafka
# tests) and kcat on PATH:
#   RILL_BIN=target/release/rill TANSU_BIN=/work/tansu/bin/tansu \
#     tests/scale/kafka_vs_tansu.sh 2>&1 | tee /tmp/kafka_vs_tansu.log
# Debian's kcat is built on librdkafka 2.0.2, which cannot read Tansu 0.6's
# ApiVersions answer; KCAT_LIBRDKAFKA=DIR runs kcat (on both brokers) with
# LD_LIBRARY_PATH=DIR, DIR holding a librdkafka.so.1 of a newer release, e.g. a
# link to the one in the venv's confluent_kafka.libs (librdkafka 2.16.0):
#   mkdir -p /tmp/rdkafka && ln -sf $PWD/target/tmp/kafka-venv/lib/python3*/site-packages/confluent_kafka.libs/librdkafka-*.so.1 /tmp/rdkafka/librdkafka.so.1
#   KCAT_LIBRDKAFKA=/tmp/rdkafka RILL_BIN=... tests/scale/kafka_vs_tansu.sh
# Tansu runs with its in-memory storage engine (memory://tansu/, dynostore);
# Rill writes its log to a temporary directory. Figures in docs/BENCHMARKS.md
# ("Rill's Kafka listener side by side with Tansu 0.6").
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
T=${TANSU_BIN:-/work/tansu/bin/tansu}
PY=${PYTHON:-target/tmp/kafka-venv/bin/python}
KCAT=${KCAT:-kcat}
if [ -n "${KCAT_LIBRDKAFKA:-}" ]; then
  KCAT_BIN=$(command -v "$KCAT")
  kcat_env() { LD_LIBRARY_PATH=$KCAT_LIBRDKAFKA "$KCAT_BIN" "$@"; }
  KCAT=kcat_env
fi
N=${RECORDS:-1000000}
RATE=${RATE:-1000}
E2E_SECONDS=${E2E_SECONDS:-10}
RUNS=${RUNS:-3}
QUIET_LOAD=${QUIET_LOAD:-0.6}
QUIET_WAIT=${QUIET_WAIT:-600}
BENCH=tests/scale/kafka_bench.py
RILL_QUIC=127.0.0.1:19620
RILL_KAFKA=127.0.0.1:19621
TANSU=127.0.0.1:19622

D=$(mktemp -d /tmp/kafka-vs-tansu.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT

# Waits at most $1 seconds for the 1-minute load average to fall below
# QUIET_LOAD; prints the load average it goes on with.
quiet() {
  local waited=0
  while awk -v q="$QUIET_LOAD" '{ exit !($1 >= q) }' /proc/loadavg && [ "$waited" -lt "$1" ]; do
    sleep 5
    waited=$((waited + 5))
  done
  echo "   [load average $(cut -d' ' -f1-3 /proc/loadavg), waited ${waited} s]"
}

wait_port() {
  local i
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "nothing listens on $1" >&2
  return 1
}

# kcat produce/consume; the time is the process's wall time, start to exit.
kcat_produce() {
  local s e
  s=$(date +%s.%N)
  "$KCAT" -b "$1" -P -t "$2" -X linger.ms=5 -X batch.size=65536 -X acks=1 -l "$D/lines" 2> "$D/kcat.err"
  e=$(date +%s.%N)
  if grep -q ERROR "$D/kcat.err"; then cat "$D/kcat.err"; return 1; fi
  awk -v s="$s" -v e="$e" -v n="$N" 'BEGIN { printf "kcat produce: %d records in %.2f s: %.0f records/s\n", n, e - s, n / (e - s) }'
}
kcat_consume() {
  local s e got
  s=$(date +%s.%N)
  got=$("$KCAT" -b "$1" -C -t "$2" -o beginning -e -q | wc -l)
  e=$(date +%s.%N)
  awk -v s="$s" -v e="$e" -v n="$got" 'BEGIN { printf "kcat consume: %d records in %.2f s: %.0f records/s\n", n, e - s, n / (e - s) }'
  [ "$got" -eq "$N" ] || echo "kcat consume: expected $N records, got $got"
}

rss() { echo "   [$1 RSS: $(awk '/VmRSS/ { print $2, $3 }' "/proc/$2/status")]"; }

awk -v n="$N" 'BEGIN { s = sprintf("%100s", ""); gsub(/ /, "x", s); for (i = 0; i < n; i++) print s }' > "$D/lines"

export RILL_HOME=$D/rill-home
"$R" broker --listen "$RILL_QUIC" --data "$D/rill-data" --kafka-listen "$RILL_KAFKA" > "$D/rill.log" 2>&1 &
RILL_PID=$!
PIDS+=("$RILL_PID")
"$T" broker --listener-url "tcp://$TANSU" --advertised-listener-url "tcp://$TANSU" \
  --storage-engine memory://tansu/ > "$D/tansu.log" 2>&1 &
TANSU_PID=$!
PIDS+=("$TANSU_PID")
wait_port "$RILL_KAFKA"
wait_port "$TANSU"
sleep 1
export RILL_BOOTSTRAP=$RILL_QUIC
echo "rill: $("$R" --version); tansu: $("$T" --version 2>&1 | head -1); kcat: $("$KCAT" -V | grep -m1 Version)"
echo "records: $N of 100 bytes; latency: $RATE records/s for $E2E_SECONDS s"
# kcat on Debian's librdkafka 2.0.2 cannot read Tansu 0.6's ApiVersions v3
# answer ("Protocol read buffer underflow"); try once, skip kcat there if so.
KCAT_TANSU=1
if ! "$KCAT" -b "$TANSU" -L -m 5 > "$D/kcat-probe" 2>&1; then
  KCAT_TANSU=0
  echo "kcat cannot talk to Tansu, kcat runs skipped there:"
  grep -m1 -E "ApiVersion|ERROR" "$D/kcat-probe" || true
fi

for run in $(seq 1 "$RUNS"); do
  echo "===== run $run"
  quiet "$QUIET_WAIT"
  for t in py kcat lat; do
    "$R" topic create "$t-$run" --partitions 2 > /dev/null
    "$T" topic create "$t-$run" --partitions 2 --broker "tcp://$TANSU" > /dev/null
  done
  for side in rill tansu; do
    if [ "$side" = rill ]; then B=$RILL_KAFKA; else B=$TANSU; fi
    echo "== run $run, $side ($B), confluent-kafka"
    quiet 60
    $PY $BENCH produce "$B" "py-$run" "$N" 100
    quiet 60
    $PY $BENCH consume "$B" "py-$run" "$N"
    if [ "$side" = rill ] || [ "$KCAT_TANSU" = 1 ]; then
      echo "== run $run, $side ($B), kcat"
      quiet 60
      kcat_produce "$B" "kcat-$run" || echo "kcat produce failed"
      quiet 60
      kcat_consume "$B" "kcat-$run" || echo "kcat consume failed"
    fi
    echo "== run $run, $side ($B), end-to-end latency (confluent-kafka)"
    quiet 60
    $PY $BENCH latency "$B" "lat-$run" "$RATE" "$E2E_SECONDS" 100 0 10
  done
  echo "== run $run, rill QUIC ($RILL_QUIC), rill bench"
  quiet 60
  "$R" bench produce --topic "quic-$run" --partitions 2 --records "$N" --record-size 100 --producers 1 --acks 1 2>&1 | grep -E "^produce:|^latency"
  quiet 60
  "$R" bench consume --topic "quic-$run" --records "$N" --consumers 1 2>&1 | grep -E "^consume:|^latency"
  quiet 60
  "$R" bench e2e --topic "e2e-$run" --partitions 2 --records $((RATE * E2E_SECONDS)) --rate "$RATE" --record-size 100 --acks 1 --linger-ms 0 2>&1 | grep -E "^e2e:|^latency"
  rss rill "$RILL_PID"
  rss tansu "$TANSU_PID"
done

# How end-to-end latency depends on the consumer's fetch.wait.max.ms (a broker
# that answers a fetch as soon as records arrive does not depend on it).
for w in ${FETCH_WAITS:-1 100}; do
  for side in rill tansu; do
    if [ "$side" = rill ]; then B=$RILL_KAFKA; else B=$TANSU; fi
    "$R" topic create "lat-w$w" --partitions 2 > /dev/null 2>&1 || true
    "$T" topic create "lat-w$w" --partitions 2 --broker "tcp://$TANSU" > /dev/null 2>&1 || true
    echo "== $side ($B), end-to-end latency, fetch.wait.max.ms=$w"
    quiet 60
    $PY $BENCH latency "$B" "lat-w$w" "$RATE" "$E2E_SECONDS" 100 0 "$w"
  done
done
