#!/usr/bin/env bash
# Produce/consume throughput with --auth mtls and 100 ACL rules against --auth none.
# Run from the repository root after `cargo build --release --bin rill`;
# figures in docs/BENCHMARKS.md ("Security: --auth mtls with 100 ACL rules").
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
rm -rf /tmp/bn && mkdir -p /tmp/bn
export RILL_HOME=/tmp/bn/home
$R broker --listen 127.0.0.1:19500 --data /tmp/bn/a > /tmp/bn/a.log 2>&1 &
A=$!
sleep 2
$R broker --listen 127.0.0.1:19501 --data /tmp/bn/b --auth mtls --super-user admin > /tmp/bn/b.log 2>&1 &
B=$!
sleep 2
$R cert issue --principal admin > /dev/null
$R cert issue --principal bench > /dev/null
ADM="--bootstrap 127.0.0.1:19501 --tls-cert $RILL_HOME/certs/admin.pem --tls-key $RILL_HOME/certs/admin-key.pem"
BEN="--tls-cert $RILL_HOME/certs/bench.pem --tls-key $RILL_HOME/certs/bench-key.pem"
for i in $(seq 1 98); do
  $R acl add --principal user$i --operation read --topic topic$i $ADM > /dev/null
done
$R acl add --principal bench --operation all --topic-prefix bench- $ADM > /dev/null
$R acl add --principal bench --operation create --cluster $ADM > /dev/null
echo "rules: $($R acl list $ADM | tail -n +2 | wc -l)"
for run in 1 2 3; do
  for mode in none mtls; do
    if [ $mode = none ]; then C="--bootstrap 127.0.0.1:19500"; else C="--bootstrap 127.0.0.1:19501 $BEN"; fi
    echo "== run $run, auth $mode: produce"
    $R bench produce --topic bench-p$run --records 5000000 --record-size 100 --producers 2 --partitions 2 --acks 1 $C 2>&1 | grep -iE "records/s|MB/s" | head -3
    echo "== run $run, auth $mode: consume"
    $R bench consume --topic bench-p$run --records 5000000 --consumers 2 $C 2>&1 | grep -iE "records/s|MB/s" | head -3
  done
done
kill $A $B; wait
