#!/usr/bin/env bash
# Produce throughput through the Kafka listener with a C client (Debian's
# kcat, librdkafka's batching producer) against the QUIC path (`rill bench
# produce`), one broker, the same topic shape, record size and count. kcat's
# figure is its wall time from start to exit (start-up, metadata and the
# final flush included), so RECORDS is large enough for those to matter
# little. Run from the repository root after `cargo build --release --bin
# rill`; figures in docs/BENCHMARKS.md.
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
for run in 1 2 3; do
  $R topic create kcat-$run --partitions 2 > /dev/null
  start=$(date +%s.%N)
  kcat -b 127.0.0.1:19701 -P -t kcat-$run -X linger.ms=5 -X batch.size=65536 -X acks=1 -l "$W/lines"
  end=$(date +%s.%N)
  python3 -c "s=$end-$start; print(f'run $run kcat produce: {s:.2f} s, {$N/s/1e6:.2f} M rec/s')"
  $R bench produce --topic quic-$run --partitions 2 --records "$N" --record-size 100 \
    --producers 1 --acks 1 2>&1 | grep -iE "records/s" | head -1 | sed "s/^/run $run QUIC produce: /"
done
