#!/usr/bin/env bash
# Metadata at scale (issue 17, item 7), run by hand; not part of `cargo test`.
#
# Starts three release brokers on 127.0.0.1, creates TOPICS topics of PARTITIONS
# partitions each with replication factor 3 (default 1,000 x 10 = 10,000
# partitions, so every broker hosts 10,000 replicas), and measures:
#
#   create     from the first `rill topic create` to every broker's
#              `rill topic describe` (no name: every topic) listing every
#              partition with a leader and a 3-member ISR, and to every broker's
#              log saying it opened every topic's local logs ("opened topic").
#              Topics are created by PARALLEL concurrent CLI processes, one
#              topic per process (`xargs -P`).
#   restart    SIGTERM of broker 2 (never the controller at that point) until
#              it exits; then from its new process start to (a) its first
#              answer to `rill cluster info`, (b) its `rill topic describe`
#              listing every partition, (c) its log saying it opened every
#              topic, (d) broker 0's describe showing every partition with a
#              3-member ISR again (broker 2 is back in every ISR).
#   failover   SIGKILL of the controller (the Raft leader marked `*` by
#              `rill cluster info`) until (a) a surviving broker names another
#              controller and (b) no partition is led by the killed broker
#              (every partition it led has a new leader). The killed broker is
#              then restarted (its restart after SIGKILL is timed like above).
#   resources  per broker, from /proc: VmRSS, open fds, threads, before and
#              after creating the topics; per partition = difference / hosted.
#
# Polls run back to back, so a time is as fine as one poll (the script prints
# the poll's own duration). Figures go to stdout as `RESULT name value`.
#
#   cargo build --release --bin rill
#   tests/scale/metadata_scale.sh            # TOPICS=1000 PARTITIONS=10 PARALLEL=4
#
# Environment: RILL (binary, default target/release/rill), TOPICS, PARTITIONS,
# PARALLEL, PORT_BASE (default 29092: brokers on PORT_BASE..PORT_BASE+2),
# WORK (default /tmp/rill-scale: data dirs, RILL_HOME and logs; removed at the
# end unless KEEP=1). Every broker started is stopped on exit.
set -euo pipefail

RILL=${RILL:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/rill}
TOPICS=${TOPICS:-1000}
PARTITIONS=${PARTITIONS:-10}
PARALLEL=${PARALLEL:-4}
PORT_BASE=${PORT_BASE:-29092}
WORK=${WORK:-/tmp/rill-scale}
TOTAL=$((TOPICS * PARTITIONS))

export RILL_HOME=$WORK/home
declare -a PIDS=("" "" "")

addr() { echo "127.0.0.1:$((PORT_BASE + $1))"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
result() { echo "RESULT $*"; }

cleanup() {
    for i in 0 1 2; do
        if [[ -n ${PIDS[$i]} ]] && kill -0 "${PIDS[$i]}" 2>/dev/null; then
            kill -TERM "${PIDS[$i]}" 2>/dev/null || true
        fi
    done
    for i in 0 1 2; do
        [[ -n ${PIDS[$i]} ]] && wait "${PIDS[$i]}" 2>/dev/null || true
    done
    if [[ ${KEEP:-0} != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

start_broker() { # id
    local id=$1 join=()
    [[ $id != 0 ]] && join=(--join "$(addr 0)")
    "$RILL" broker --id "$id" --listen "$(addr "$id")" --data "$WORK/data-$id" \
        "${join[@]}" >>"$WORK/broker-$id.log" 2>&1 &
    PIDS[$id]=$!
}

# Every topic's describe from broker $1, or nothing while it does not answer.
describe_all() { "$RILL" topic describe --bootstrap "$(addr "$1")" 2>/dev/null || true; }
# Partitions broker $1 lists with a leader and a 3-member ISR.
complete_partitions() {
    describe_all "$1" | awk -F'\t' '$2 ~ /^Topic: scale-/ && $4 !~ /none/ {
        split($6, isr, ": "); if (split(isr[2], m, ",") == 3) n++ } END { print n + 0 }'
}
# Partitions broker $1 lists, whatever their state.
listed_partitions() { describe_all "$1" | awk -F'\t' '$2 ~ /^Topic: scale-/ { n++ } END { print n + 0 }'; }
# Partitions broker $1 lists as led by broker $2 (or with no leader).
led_by() {
    describe_all "$1" | awk -F'\t' -v b="$2" '$2 ~ /^Topic: scale-/ && ($4 == "Leader: " b || $4 == "Leader: none") { n++ } END { print n + 0 }'
}
opened_topics() { grep -c 'opened topic topic=scale-' "$WORK/broker-$1.log" 2>/dev/null || true; }
controller() {
    "$RILL" cluster info --bootstrap "$(addr "$1")" 2>/dev/null | awk '$4 == "*" { print $1 }'
}
# Broker $1 names a controller other than $2.
new_controller_shown() { local c; c=$(controller "$1"); [[ -n $c && $c != "$2" ]]; }
alive_brokers() {
    "$RILL" cluster info --bootstrap "$(addr "$1")" 2>/dev/null | awk '$3 == "yes" { n++ } END { print n + 0 }'
}
proc_field() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
resources() { # label
    for i in 0 1 2; do
        local pid=${PIDS[$i]}
        local rss fds threads
        rss=$(proc_field "$pid" VmRSS)
        fds=$(ls "/proc/$pid/fd" | wc -l)
        threads=$(proc_field "$pid" Threads)
        result "$1.broker$i.rss_kib $rss"
        result "$1.broker$i.fds $fds"
        result "$1.broker$i.threads $threads"
    done
}
wait_for() { # description, timeout s, condition (evaluated at each poll)
    local what=$1 limit=$2 cond=$3 t0
    t0=$(now)
    until eval "$cond"; do
        if awk -v t="$(since "$t0")" -v l="$limit" 'BEGIN { exit !(t > l) }'; then
            echo "timed out after ${limit}s waiting for $what" >&2
            for b in 0 1 2; do describe_all "$b" >"$WORK/describe-$b-at-timeout.txt"; done
            exit 1
        fi
        sleep 0.05
    done
}

# One topic; retried (up to 5 times, 1 s apart) when the controller moved
# during the request (NOT_CONTROLLER with no new controller yet); a retry that
# finds the topic created counts as success. Retries are counted in the log.
create_topic() {
    local out
    for _ in 1 2 3 4 5; do
        if out=$("$RILL" topic create "$1" --partitions "$PARTITIONS" --replication-factor 3 \
            --bootstrap "$BOOTSTRAP" 2>&1); then return 0; fi
        [[ $out == *TOPIC_ALREADY_EXISTS* || $out == *"already exists"* ]] && return 0
        echo "retrying $1: $out" >&2
        sleep 1
    done
    echo "giving up on $1: $out" >&2
    return 1
}
export -f create_topic

echo "rill: $RILL; $TOPICS topics x $PARTITIONS partitions, RF 3, $PARALLEL parallel creates"
echo "ulimit -n $(ulimit -n), -Hn $(ulimit -Hn); $(nproc) cores"
rm -rf "$WORK"
mkdir -p "$WORK"

start_broker 0
wait_for "broker 0" 30 'test "$(alive_brokers 0)" -ge 1'
start_broker 1
start_broker 2
wait_for "three live brokers" 60 'test "$(alive_brokers 0)" -eq 3'
sleep 2
resources before

# --- create -------------------------------------------------------------------
t0=$(now)
export RILL PARTITIONS BOOTSTRAP="$(addr 0),$(addr 1),$(addr 2)"
seq 0 $((TOPICS - 1)) | xargs -P "$PARALLEL" -I{} bash -c 'create_topic "scale-{}"' >/dev/null
result create.cli_done_s "$(since "$t0")"
for i in 0 1 2; do
    wait_for "broker $i to list every partition" 600 'test "$(complete_partitions "$i")" -ge "$TOTAL"'
    result "create.broker$i.describe_complete_s" "$(since "$t0")"
done
for i in 0 1 2; do
    wait_for "broker $i to open every topic" 600 'test "$(opened_topics "$i")" -ge "$TOPICS"'
    result "create.broker$i.logs_opened_s" "$(since "$t0")"
done
tp=$(now)
describe_all 0 >/dev/null
result poll.describe_all_s "$(since "$tp")"
sleep 5
resources after

# --- restart (SIGTERM) of a broker that is not the controller --------------------
ctl=$(controller 0)
victim=2
[[ $ctl == 2 ]] && victim=1
result restart.broker "$victim"
t0=$(now)
kill -TERM "${PIDS[$victim]}"
wait "${PIDS[$victim]}" || true
result restart.shutdown_s "$(since "$t0")"
mv "$WORK/broker-$victim.log" "$WORK/broker-$victim.log.1"
t0=$(now)
start_broker "$victim"
wait_for "restarted broker to answer" 120 'test "$(alive_brokers "$victim")" -ge 1'
result restart.answers_cluster_info_s "$(since "$t0")"
wait_for "restarted broker to list every partition" 120 'test "$(listed_partitions "$victim")" -ge "$TOTAL"'
result restart.describe_lists_all_s "$(since "$t0")"
wait_for "restarted broker to open every topic" 300 'test "$(opened_topics "$victim")" -ge "$TOPICS"'
result restart.logs_opened_s "$(since "$t0")"
wait_for "restarted broker back in every ISR" 300 'test "$(complete_partitions 0)" -ge "$TOTAL"'
result restart.back_in_every_isr_s "$(since "$t0")"

# --- controller failover (SIGKILL) ------------------------------------------------
sleep 3
ctl=$(controller 0)
other=0
[[ $ctl == 0 ]] && other=1
result failover.killed_controller "$ctl"
result failover.partitions_led_before "$(led_by "$other" "$ctl")"
t0=$(now)
kill -KILL "${PIDS[$ctl]}"
wait "${PIDS[$ctl]}" 2>/dev/null || true
PIDS[$ctl]=""
wait_for "a new controller" 60 'new_controller_shown "$other" "$ctl"'
result failover.new_controller_s "$(since "$t0")"
result failover.new_controller "$(controller "$other")"
wait_for "new leaders for the killed broker's partitions" 120 'test "$(led_by "$other" "$ctl")" -eq 0'
result failover.partitions_moved_s "$(since "$t0")"

# --- restart after SIGKILL --------------------------------------------------------
mv "$WORK/broker-$ctl.log" "$WORK/broker-$ctl.log.2"
t0=$(now)
start_broker "$ctl"
wait_for "killed broker to answer" 120 'test "$(alive_brokers "$ctl")" -ge 1'
result restart_after_kill.answers_cluster_info_s "$(since "$t0")"
wait_for "killed broker to open every topic" 300 'test "$(opened_topics "$ctl")" -ge "$TOPICS"'
result restart_after_kill.logs_opened_s "$(since "$t0")"
wait_for "killed broker back in every ISR" 300 'test "$(complete_partitions "$other")" -ge "$TOTAL"'
result restart_after_kill.back_in_every_isr_s "$(since "$t0")"
resources end
echo "done; logs in $WORK (kept with KEEP=1)"
