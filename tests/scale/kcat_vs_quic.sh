#!/usr/bin/env bash
# Produce throughput through the Kafka listener with a C client (Debian's
# kcat, librdkafka's batching producer) against the QUIC path (`rill bench
# produce`), one broker, the same topic shape, record size and count. kcat's
# figure is its wall time from start to exit (start-up, metadata and the
# final flush included), so RECORDS is large enough for those to matter
# little. Run from the repository root after `cargo build --release --bin
# rill`; figures in docs/BENCHMARKS.md. Each run also prints the broker's CPU
# time for it (so the two paths are compared apart from their clients) and
# consumes both topics back.
set -euo pipefail
R=${RILL_BIN:-target/release/rill}
N=${RECORDS:-5000000}
W=${WORK:-/tmp/kcatq}
rm -rf "$W" && mkdir -p "$W"
export RILL_HOME=$W/home
$R broker --listen 127.0.0.1:19700 --data "$W/data" --kafka-listen 127.0.0.1:19701 > "$W/broker.log" 2>&1 &
B=$!
trap 'kill $B 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
sleep 2
export RILL_BOOTSTRAP=127.0.0.1:19700
# N lines of 100 bytes (99 characters and the newline).
python3 -c "
import sys
line = ('x' * 92)
out = sys.stdout
for i in range($N):
    out.write(f'{i:07d}{line}\n')
" > "$W/lines"
echo "records: $N of 100 bytes; $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# The broker's CPU time (user + system, in clock ticks) so far, from
# /proc/PID/stat: what each path cost the broker, apart from the client.
ticks() { awk '{print $14 + $15}' /proc/$B/stat; }
hz=$(getconf CLK_TCK)
cpu() { python3 -c "print(f'broker CPU {($2 - $1) / $hz:.2f} s, {($2 - $1) / $hz / $N * 1e9:.0f} ns/record')"; }
for run in 1 2 3; do
  $R topic create kcat-$run --partitions 2 > /dev/null
  c0=$(ticks); start=$(date +%s.%N)
  kcat -b 127.0.0.1:19701 -P -t kcat-$run -X linger.ms=5 -X batch.size=65536 -X acks=1 -l "$W/lines"
  end=$(date +%s.%N); c1=$(ticks)
  python3 -c "s=$end-$start; print(f'run $run kcat produce: {s:.2f} s, {$N/s/1e6:.2f} M rec/s')"
  echo "run $run kcat produce: $(cpu $c0 $c1)"
  c0=$(ticks)
  $R bench produce --topic quic-$run --partitions 2 --records "$N" --record-size 100 \
    --producers 1 --acks 1 2>&1 | grep -iE "records/s" | head -1 | sed "s/^/run $run QUIC produce: /"
  c1=$(ticks)
  echo "run $run QUIC produce: $(cpu $c0 $c1)"
  # Consume both topics from the beginning: kcat to the end of the topic
  # (counted, to check it read them all), `rill bench consume` likewise.
  c0=$(ticks); start=$(date +%s.%N)
  got=$(kcat -b 127.0.0.1:19701 -C -t kcat-$run -o beginning -e -q | wc -l)
  end=$(date +%s.%N); c1=$(ticks)
  python3 -c "s=$end-$start; print(f'run $run kcat consume: {$got} records, {s:.2f} s, {$got/s/1e6:.2f} M rec/s')"
  echo "run $run kcat consume: $(cpu $c0 $c1)"
  c0=$(ticks)
  $R bench consume --topic quic-$run --records "$N" --consumers 1 2>&1 | grep -iE "records/s" | head -1 \
    | sed "s/^/run $run QUIC consume: /"
  c1=$(ticks)
  echo "run $run QUIC consume: $(cpu $c0 $c1)"
done

# The same kcat produce and consume over TLS (`--kafka-tls`, the broker's
# certificate from the development CA; no client certificate), since the
# QUIC path is always encrypted and the runs above are plaintext.
$R broker --listen 127.0.0.1:19702 --data "$W/data-tls" --kafka-listen 127.0.0.1:19703 --kafka-tls \
  > "$W/broker-tls.log" 2>&1 &
B2=$!
trap 'kill $B $B2 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
sleep 2
B=$B2
TLS="-X security.protocol=SSL -X ssl.ca.location=$RILL_HOME/ca.pem"
for run in 1 2 3; do
  RILL_BOOTSTRAP=127.0.0.1:19702 $R topic create tls-$run --partitions 2 > /dev/null
  c0=$(ticks); start=$(date +%s.%N)
  kcat -b 127.0.0.1:19703 $TLS -P -t tls-$run -X linger.ms=5 -X batch.size=65536 -X acks=1 -l "$W/lines"
  end=$(date +%s.%N); c1=$(ticks)
  python3 -c "s=$end-$start; print(f'run $run kcat TLS produce: {s:.2f} s, {$N/s/1e6:.2f} M rec/s')"
  echo "run $run kcat TLS produce: $(cpu $c0 $c1)"
  c0=$(ticks); start=$(date +%s.%N)
  got=$(kcat -b 127.0.0.1:19703 $TLS -C -t tls-$run -o beginning -e -q | wc -l)
  end=$(date +%s.%N); c1=$(ticks)
  python3 -c "s=$end-$start; print(f'run $run kcat TLS consume: {$got} records, {s:.2f} s, {$got/s/1e6:.2f} M rec/s')"
  echo "run $run kcat TLS consume: $(cpu $c0 $c1)"
done
