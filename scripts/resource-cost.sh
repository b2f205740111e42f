#!/usr/bin/env bash
# resource-cost.sh measures what delayd's streams and buckets cost a NATS cluster: it starts a 3-node nats-server
# cluster and one delayd with DELAYD_REPLICAS (default 3), waits for it to be ready, then reads the servers' /jsz and
# /varz and, over IDLE seconds with no traffic (default 60), the JetStream API requests, the messages every server
# handled (clients, routes and Raft together), the lease bucket's writes and the CPU time of the servers and of
# delayd. It does this with DELAYD_PRECISION=on and =off, each on fresh store directories, and prints one line per
# setting. docs/operations.md ("What each stream and bucket costs") quotes its output.
#
# Usage: scripts/resource-cost.sh            (from the repository root; builds nats-server and delayd into a temp dir)
# Variables: IDLE (seconds, default 60), REPLICAS (default 3), BASE_PORT (default 24000: client ports BASE+1..3,
# cluster BASE+11..13, monitoring BASE+21..23, delayd HTTP BASE+30).
set -euo pipefail
IDLE=${IDLE:-60}
REPLICAS=${REPLICAS:-3}
BASE=${BASE_PORT:-24000}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/nats-server" github.com/nats-io/nats-server/v2
go build -o "$work/delayd" ./cmd/delayd

cputicks() { # utime+stime of a pid, in clock ticks
	awk '{print $14+$15}' "/proc/$1/stat"
}
sum_jsz() { # sum of a /jsz field over the three servers
	local f=$1 t=0
	for i in 1 2 3; do t=$((t + $(curl -s "http://127.0.0.1:$((BASE + 20 + i))/jsz" | jq "$f"))); done
	echo "$t"
}
sum_varz() {
	local f=$1 t=0
	for i in 1 2 3; do t=$((t + $(curl -s "http://127.0.0.1:$((BASE + 20 + i))/varz" | jq "$f"))); done
	echo "$t"
}
raft_groups() { # Raft groups of delayd's account (streams' and consumers' groups), counted once over the servers
	for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE + 20 + i))/raftz?acc=\$G" | jq -r '.["$G"] // {} | keys[]'; done | sort -u | wc -l
}
assets() { # "streams consumers" of delayd's account, each counted once over the servers
	local s c
	s=$(for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE + 20 + i))/jsz?streams=true" | jq -r '.account_details[]?.stream_detail[]?.name'; done | sort -u | wc -l)
	c=$(for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE + 20 + i))/jsz?consumers=true" | jq -r '.account_details[]?.stream_detail[]? | .name as $s | .consumer_detail[]? | $s + "/" + .name'; done | sort -u | wc -l)
	echo "$s $c"
}
lease_seq() { # the lease bucket's last sequence: its writes so far
	for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE + 20 + i))/jsz?streams=true" |
		jq '[.account_details[]?.stream_detail[]? | select(.name=="KV_DELAYD_LEASES") | .state.last_seq] | max // 0'; done | sort -n | tail -1
}

run() { # $1: DELAYD_PRECISION
	local prec=$1 dir="$work/$1" routes="" spids=()
	for i in 1 2 3; do routes+="nats://127.0.0.1:$((BASE + 10 + i)),"; done
	for i in 1 2 3; do
		mkdir -p "$dir/s$i"
		"$work/nats-server" -js -sd "$dir/s$i" -a 127.0.0.1 -p $((BASE + i)) -m $((BASE + 20 + i)) \
			--cluster_name cost -cluster "nats://127.0.0.1:$((BASE + 10 + i))" -routes "${routes%,}" -n "n$i" \
			>"$dir/s$i.log" 2>&1 &
		pids+=($!)
		spids+=($!)
	done
	for i in 1 2 3; do
		until curl -sf "http://127.0.0.1:$((BASE + 20 + i))/healthz?js-enabled-only=true" >/dev/null; do sleep 0.2; done
	done
	sleep 3 # the meta leader
	DELAYD_NATS_URL="nats://127.0.0.1:$((BASE + 1)),nats://127.0.0.1:$((BASE + 2)),nats://127.0.0.1:$((BASE + 3))" \
		DELAYD_REPLICAS=$REPLICAS DELAYD_PRECISION=$prec DELAYD_HTTP_ADDR="127.0.0.1:$((BASE + 30))" DELAYD_LOG_FORMAT=json \
		"$work/delayd" >"$dir/delayd.log" 2>&1 &
	local dpid=$!
	pids+=($dpid)
	until curl -sf "http://127.0.0.1:$((BASE + 30))/readyz" >/dev/null; do sleep 0.5; done
	sleep 10 # settle: every lease taken, every consumer created

	local streams consumers groups mem0 api0 msgs0 bytes0 lease0 cpu_s0=0 cpu_d0
	read -r streams consumers <<<"$(assets)"
	groups=$(raft_groups)
	mem0=$(sum_varz .mem)
	api0=$(sum_jsz .api.total)
	msgs0=$(sum_varz .in_msgs)
	bytes0=$(sum_varz .in_bytes)
	lease0=$(lease_seq)
	for p in "${spids[@]}"; do cpu_s0=$((cpu_s0 + $(cputicks "$p"))); done
	cpu_d0=$(cputicks "$dpid")
	sleep "$IDLE"
	local api1 msgs1 bytes1 lease1 cpu_s1=0 cpu_d1 mem1 hz
	api1=$(sum_jsz .api.total)
	msgs1=$(sum_varz .in_msgs)
	bytes1=$(sum_varz .in_bytes)
	lease1=$(lease_seq)
	mem1=$(sum_varz .mem)
	for p in "${spids[@]}"; do cpu_s1=$((cpu_s1 + $(cputicks "$p"))); done
	cpu_d1=$(cputicks "$dpid")
	hz=$(getconf CLK_TCK)
	local disk
	disk=$(du -sk "$dir" | awk '{print $1}')
	awk -v p="$prec" -v r="$REPLICAS" -v s="$streams" -v c="$consumers" -v g="$groups" -v m0="$mem0" -v m1="$mem1" \
		-v a="$((api1 - api0))" -v n="$((msgs1 - msgs0))" -v b="$((bytes1 - bytes0))" -v l="$((lease1 - lease0))" \
		-v cs="$((cpu_s1 - cpu_s0))" -v cd="$((cpu_d1 - cpu_d0))" -v hz="$hz" -v t="$IDLE" -v dk="$disk" 'BEGIN {
		printf "DELAYD_PRECISION=%s DELAYD_REPLICAS=%s: streams %d, consumers %d, Raft groups %d; servers RSS %.0f MiB (after %ds idle %.0f MiB), store directories %.1f MiB on disk; ", p, r, s, c, g, m0/1048576, t, m1/1048576, dk/1024
		printf "idle, per second: %.1f JetStream API requests, %.0f messages in (%.0f KiB) over the servers, %.1f lease writes; CPU: servers %.1f%%, delayd %.1f%% of one core\n", a/t, n/t, b/t/1024, l/t, 100*cs/hz/t, 100*cd/hz/t
	}'
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	pids=()
}

run on
run off
