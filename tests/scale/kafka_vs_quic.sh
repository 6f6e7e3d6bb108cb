#!/usr/bin/env bash
# Produce/consume throughput through the Kafka listener (confluent-kafka,
# librdkafka's batching producer) against the QUIC path (`rill bench`), one
# broker, the same topic shape and record size. Run from the repository root
# after `cargo build --release --bin rill`, with the test venv
# (target/tmp/kafka-venv, made by .ci/run or the Kafka tests); figures in
# docs/BENCHMARKS.md ("The Kafka listener against QUIC").
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
PY=${PYTHON:-target/tmp/kafka-venv/bin/python}
N=${RECORDS:-2000000}
rm -rf /tmp/kq && mkdir -p /tmp/kq
export RILL_HOME=/tmp/kq/home
$R broker --listen 127.0.0.1:19600 --data /tmp/kq/data --kafka-listen 127.0.0.1:19601 > /tmp/kq/broker.log 2>&1 &
B=$!
trap 'kill $B; wait' EXIT
sleep 2
export RILL_BOOTSTRAP=127.0.0.1:19600
for run in 1 2 3; do
  $R topic create kafka-$run --partitions 2 > /dev/null
  echo "== run $run, Kafka listener (confluent-kafka, 1 producer, 1 consumer)"
  $PY tests/scale/kafka_bench.py produce 127.0.0.1:19601 kafka-$run $N 100
  $PY tests/scale/kafka_bench.py consume 127.0.0.1:19601 kafka-$run $N
  echo "== run $run, QUIC (rill bench, 1 producer, 1 consumer)"
  $R bench produce --topic quic-$run --partitions 2 --records $N --record-size 100 --producers 1 --acks 1 2>&1 | grep -iE "records/s|MB/s" | head -3
  $R bench consume --topic quic-$run --records $N --consumers 1 2>&1 | grep -iE "records/s|MB/s" | head -3
done
