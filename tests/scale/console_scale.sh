#!/usr/bin/env bash
# The console's API at 10,000 partitions with users signed in (issue 23):
# one broker with --auth mtls and the console, TOPICS topics of PARTITIONS
# partitions, a user `viewer` allowed to describe the topics whose names start
# with t-0 (a tenth of them; names are t-000 ... t-999), then the time of the console's topic list (first
# page) as the super user (no filtering needed: every check allowed) and as
# viewer (every topic checked with CheckAccess), and of one topic's page.
# Usage: [RILL_BIN=target/release/rill] [TOPICS=1000] [PARTITIONS=10] tests/scale/console_scale.sh
set -euo pipefail
RILL_BIN=${RILL_BIN:-target/debug/rill}
TOPICS=${TOPICS:-1000}
PARTITIONS=${PARTITIONS:-10}
WORK=$(mktemp -d /tmp/rill-console-scale-XXXXXX)
export RILL_HOME=$WORK/home
PORT=19700
CONSOLE=19701
"$RILL_BIN" broker --listen 127.0.0.1:$PORT --data "$WORK/data" --auth mtls --super-user root \
    --console 127.0.0.1:$CONSOLE > "$WORK/broker.log" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null; rm -rf "$WORK"' EXIT
export RILL_BOOTSTRAP=127.0.0.1:$PORT
for _ in $(seq 100); do grep -q "listening on" "$WORK/broker.log" && break; sleep 0.1; done
"$RILL_BIN" cert issue --principal root > /dev/null
export RILL_TLS_CERT=$RILL_HOME/certs/root.pem RILL_TLS_KEY=$RILL_HOME/certs/root-key.pem
start=$(date +%s.%N)
for i in $(seq -w 0 $((TOPICS - 1))); do
    "$RILL_BIN" topic create "t-$i" --partitions "$PARTITIONS" > /dev/null
done
echo "created $TOPICS topics x $PARTITIONS partitions in $(echo "$(date +%s.%N) - $start" | bc) s"
"$RILL_BIN" acl add --principal viewer --operation describe --topic-prefix t-0 > /dev/null
root=$("$RILL_BIN" token issue --principal root 2>/dev/null)
viewer=$("$RILL_BIN" token issue --principal viewer 2>/dev/null)
time_get() { # NAME TOKEN PATH
    for run in 1 2 3; do
        out=$(curl -s -o "$WORK/body" -w "%{http_code} %{time_total}" -H "Authorization: Bearer $2" \
            "http://127.0.0.1:$CONSOLE$3")
        echo "$1 run $run: HTTP ${out% *}, ${out#* } s, total=$(grep -o '"total":[0-9]*' "$WORK/body" || true)"
    done
}
time_get "topic list as root (super user)" "$root" "/api/topics"
time_get "topic list as viewer (1,000 topic checks)" "$viewer" "/api/topics"
time_get "topic page t-001 as viewer" "$viewer" "/api/topics/t-001"
