#!/usr/bin/env bash
# End-to-end latency through an identity transform run by the broker, as a
# read-committed reader of its output, at 10,000 records/s: exactly-once
# (commit every 100 ms, the default) and at-least-once, two runs each, then a
# plain produce-to-consume run for reference. Run from the repository root
# after `cargo build --release --bin rill` with the identity guest built into
# target/wasm-guests (the transform tests build it). Figures in
# docs/BENCHMARKS.md ("Transactions").
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
WASM=${WASM:-target/wasm-guests/wasm32-wasip2/release/identity.wasm}
rm -rf /tmp/latb && mkdir -p /tmp/latb
export RILL_HOME=/tmp/latb/home
$R broker --listen 127.0.0.1:19710 --data /tmp/latb/data > /tmp/latb/broker.log 2>&1 &
B=$!
trap 'kill $B; wait; rm -rf /tmp/latb' EXIT
sleep 2
export RILL_BOOTSTRAP=127.0.0.1:19710
for run in 1 2; do
for delivery in exactly-once at-least-once; do
  n=$delivery-$run
  $R topic create lat-in-$n --partitions 2 > /dev/null
  $R topic create lat-out-$n --partitions 2 > /dev/null
  $R transform deploy $WASM --name lat-$n --input lat-in-$n --output lat-out-$n --from earliest --delivery $delivery > /dev/null
  sleep 3
  echo "== run $run: e2e through the identity transform, $delivery, read-committed reader, 10,000 records/s"
  $R bench e2e --topic lat-in-$n --read-topic lat-out-$n --isolation read-committed --rate 10000 --records 100000 --record-size 100 --acks all 2>&1 | grep -E "^latency|^e2e" | head -3
  $R transform delete lat-$n > /dev/null 2>&1 || true
done
done
echo "== plain e2e (no transform), 10,000 records/s"
$R bench e2e --topic lat-plain --partitions 2 --rate 10000 --records 100000 --record-size 100 --acks all 2>&1 | grep -E "^latency|^e2e" | head -3
