#!/usr/bin/env bash
# Transactions (issue 20): transactional produce (a commit every 100 ms)
# against plain idempotent produce, and the identity transform with
# exactly-once delivery against at-least-once and plain consume-and-produce.
# One broker, release build; run from the repository root after
# `cargo build --release --bin rill` and `rill transform build examples/identity`
# (the tests build it into target/wasm-guests). Figures in docs/BENCHMARKS.md
# ("Transactions"); the latency through a transform is tests/scale/txn_latency.sh.
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
WASM=${WASM:-target/wasm-guests/wasm32-wasip2/release/identity.wasm}
N=${RECORDS:-1000000}
T=${TRANSFORM_RECORDS:-200000}
rm -rf /tmp/txnb && mkdir -p /tmp/txnb
export RILL_HOME=/tmp/txnb/home
$R broker --listen 127.0.0.1:19700 --data /tmp/txnb/data > /tmp/txnb/broker.log 2>&1 &
B=$!
trap 'kill $B; wait' EXIT
sleep 2
export RILL_BOOTSTRAP=127.0.0.1:19700
for run in 1 2 3; do
  echo "== run $run: idempotent produce (acks=all), 1 producer, 2 partitions, $N x 100 B"
  $R bench produce --topic idem-$run --partitions 2 --records $N --record-size 100 --producers 1 --acks all 2>&1 | grep -iE "records/s" | head -2
  echo "== run $run: transactional produce, a commit every 100 ms"
  $R bench produce --topic txn-$run --partitions 2 --records $N --record-size 100 --producers 1 --acks all --transaction-interval-ms 100 2>&1 | grep -iE "records/s" | head -2
  echo "== run $run: identity transform, at-least-once"
  $R bench transform --module $WASM --records $T 2>&1 | grep "^records="
  echo "== run $run: identity transform, exactly-once (commit every 100 ms)"
  $R bench transform --module $WASM --records $T --exactly-once-interval-ms 100 2>&1 | grep "^records="
done
