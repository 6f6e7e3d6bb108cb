#!/usr/bin/env bash
# Tiered storage figures: local vs remote read throughput, upload rate under produce.
# usage: docs/bench/tier.sh RILL_BIN STORE(file|s3) [S3_PORT]
set -uo pipefail
RILL=$1; STORE=$2
W=$(mktemp -d /tmp/tierbench.XXXX)
export RILL_HOME=$W/home; mkdir -p $RILL_HOME
PORT=$((20000 + RANDOM % 20000)); MPORT=$((PORT+1))
if [ "$STORE" = file ]; then URL="file://$W/tier"; else URL="s3://rill-tier/bench"; export AWS_ENDPOINT_URL=http://127.0.0.1:$3 AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y; fi
cat > $W/rill.toml <<T
retention_check_interval_ms = 500
[object_store]
url = "$URL"
upload_interval_ms = 200
cache_bytes = 67108864
T
$RILL broker --listen 127.0.0.1:$PORT --data $W/data --config $W/rill.toml --metrics 127.0.0.1:$MPORT > $W/out 2> $W/log &
BPID=$!
trap "kill $BPID; wait $BPID 2>/dev/null; grep -m3 -i \"failed\\|error\" $W/log; rm -rf $W" EXIT
sleep 2
export RILL_BOOTSTRAP=127.0.0.1:$PORT
N=${N:-1000000}
$RILL topic create local --partitions 1 --config segment.bytes=8388608
$RILL topic create remote --partitions 1 --config segment.bytes=8388608 --config remote.storage.enable=true --config local.retention.bytes=0
echo "== produce to the local-only topic"; $RILL bench produce --topic local --records $N --record-size 100 | tail -1
up0=$(curl -s 127.0.0.1:$MPORT/metrics | awk '/^rill_tier_upload_bytes_total/{print $2}'); up0=${up0:-0}
t0=$(date +%s.%N)
echo "== produce to the tiered topic (uploads run meanwhile)"; $RILL bench produce --topic remote --records $N --record-size 100 | tail -1
t1=$(date +%s.%N)
up1=$(curl -s 127.0.0.1:$MPORT/metrics | awk '/^rill_tier_upload_bytes_total/{print $2}'); up1=${up1:-0}
echo "uploaded_during_produce_bytes=$(echo "$up1 - $up0" | bc) seconds=$(echo "$t1 - $t0" | bc) upload_mb_per_s=$(echo "($up1 - $up0) / ($t1 - $t0) / 1000000" | bc -l | cut -c1-6)"
# wait until everything closed is remote and local is down to the active segment
for i in $(seq 1 40); do
  line=$($RILL topic describe remote | grep "Partition: 0")
  ls=$(echo "$line" | sed 's/.*LocalLogStartOffset: \([0-9]*\).*/\1/')
  [ "$ls" -gt $((N * 7 / 10)) ] && break; sleep 1
done
echo "$line"
up2=$(curl -s 127.0.0.1:$MPORT/metrics | awk '/^rill_tier_upload_bytes_total/{print $2}')
echo "total_uploaded_bytes=$up2 seconds_from_produce_start=$(echo "$(date +%s.%N) - $t0" | bc)"
echo "== consume the local topic"; $RILL bench consume --topic local --records $N | tail -1
echo "== consume the tiered topic (remote below offset $ls, cold cache)"; $RILL bench consume --topic remote --records $ls | tail -1
curl -s 127.0.0.1:$MPORT/metrics | grep -E "^rill_tier_(download|cache|errors)" || true
