#!/usr/bin/env bash
# demo/demo.sh: a narrated end-to-end run of ipcache-agent in network
# namespaces (run it with `make demo`, as root).
#
# An endpoint namespace reaches, through a veth, a host namespace that
# routes to a server namespace owning two addresses. The agent runs in the
# host namespace with the endpoint's veth as its device and a policy
# directory (the host namespace's own addresses are the agent's host
# entity: they are in the ipcache from the start). The demo applies a policy that allows one
# address and shows the other denied; restarts the agent under a continuous
# ping and shows the same identity numbers and zero lost packets; shows the
# restore status and, after the grace period, a restored prefix that nobody
# re-asserted released. Every step is checked: the script exits non-zero
# if anything is not as shown. Everything it made is removed on exit, also
# on failure.
set -euo pipefail

cd "$(dirname "$0")/.."

# ---- parameters -----------------------------------------------------------
ID=$$
EP_NS="demo-ep-$ID"         # the endpoint
HOST_NS="demo-host-$ID"     # the "host": the agent runs here
SRV_NS="demo-srv-$ID"       # a server the host routes to
DEV="demo-veth0"            # host side of the endpoint's veth (in HOST_NS)
ALLOWED_IP="10.201.1.1"     # server address the policy allows
DENIED_IP="10.201.1.2"      # server address nothing allows
EXTRA_PREFIX="198.51.100.0/24" # in a second policy file, removed before the restart
GRACE_SECONDS=5
AGENT="$PWD/bin/ipcache-agent"

say() { printf '\n==> %s\n' "$*"; }
show() { sed '/^[[:space:]]*$/d; s/^/    /'; }
ok() { printf '    OK: %s\n' "$*"; }
# has TEXT REGEX: whether TEXT has a line matching REGEX (no pipe into
# grep -q: with pipefail, its early exit would fail the writer with SIGPIPE).
has() { grep -qE -- "$2" <<<"$1"; }

WORK=""
AGENT_PID=""
PING_PID=""
AGENT_RUN=0

fail() {
	printf '\nDEMO FAILED: %s\n' "$*" >&2
	exit 1
}

# ---- root and tools -------------------------------------------------------
if [ "$(id -u)" -ne 0 ]; then
	echo "demo: must run as root (network namespaces, bpffs, BPF programs): try 'sudo make demo'" >&2
	exit 1
fi
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v ping >/dev/null 2>&1 || missing+=(iputils-ping)
if [ "${#missing[@]}" -gt 0 ]; then
	say "Installing ${missing[*]}"
	command -v apt-get >/dev/null 2>&1 || fail "need ${missing[*]} and there is no apt-get to install them"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x "$AGENT" ] || fail "$AGENT is missing: run 'make build' (or 'make demo')"

# ---- cleanup, always ------------------------------------------------------
cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	say "Cleaning up"
	if [ -n "$PING_PID" ]; then
		kill -INT "$PING_PID" 2>/dev/null
		wait "$PING_PID" 2>/dev/null
	fi
	if [ -n "$AGENT_PID" ]; then
		kill -TERM "$AGENT_PID" 2>/dev/null
		wait "$AGENT_PID" 2>/dev/null
	fi
	if [ -n "$WORK" ]; then
		if [ "$rc" -ne 0 ]; then
			local f
			for f in "$WORK"/agent-*.log; do
				[ -f "$f" ] || continue
				printf -- '--- last lines of %s ---\n' "$(basename "$f")" >&2
				tail -n 25 "$f" >&2
				cp "$f" "/tmp/ipcache-agent-demo-$ID-$(basename "$f")" &&
					echo "(kept as /tmp/ipcache-agent-demo-$ID-$(basename "$f"))" >&2
			done
		fi
		if mountpoint -q "$WORK/bpf"; then
			"$AGENT" cleanup --bpf-root="$WORK/bpf" --state-dir="$WORK/state" 2>&1 | show
		fi
	fi
	ip netns del "$EP_NS" 2>/dev/null
	ip netns del "$HOST_NS" 2>/dev/null
	ip netns del "$SRV_NS" 2>/dev/null
	if [ -n "$WORK" ]; then
		mountpoint -q "$WORK/bpf" && umount "$WORK/bpf"
		rm -rf "$WORK"
	fi
	# Nothing may be left behind.
	local left
	left="$(ip netns list | grep -E "^($EP_NS|$HOST_NS|$SRV_NS)( |$)")"
	[ -n "$WORK" ] && left+="$(grep -F " $WORK" /proc/mounts)"
	if [ -n "$left" ]; then
		echo "    left behind:" >&2
		echo "$left" | show >&2
		[ "$rc" -eq 0 ] && rc=1
	else
		echo "    agent stopped, pins and state removed, namespaces deleted, bpffs unmounted"
	fi
	if [ "$rc" -eq 0 ]; then
		printf '\n==> DEMO PASSED\n'
	else
		printf '\n==> DEMO FAILED (exit %d)\n' "$rc" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- helpers --------------------------------------------------------------
shell() { "$AGENT" shell --shell-sock-path="$WORK/state/shell.sock" "$@"; }

start_agent() {
	AGENT_RUN=$((AGENT_RUN + 1))
	local log="$WORK/agent-$AGENT_RUN.log"
	ip netns exec "$HOST_NS" "$AGENT" \
		--bpf-root="$WORK/bpf" --state-dir="$WORK/state" --policy-dir="$WORK/policy" \
		--devices="$DEV" --identity-restore-grace-period="${GRACE_SECONDS}s" \
		--shell-sock-path="$WORK/state/shell.sock" >"$log" 2>&1 &
	AGENT_PID=$!
	local i
	for i in $(seq 100); do
		kill -0 "$AGENT_PID" 2>/dev/null || fail "the agent exited at start (see $log)"
		# Restore reads the pinned map after the start: wait for it too.
		if grep -q 'Started hive' "$log" && shell restore/status -o json 2>/dev/null | grep -q '"restoring": *false'; then
			echo "    agent pid $AGENT_PID, log $log:"
			grep -E 'Started hive|Restored prefixes|Policy directory read' "$log" | show
			return 0
		fi
		sleep 0.1
	done
	fail "the agent did not start within 10s"
}

stop_agent() {
	local rc=0
	kill -TERM "$AGENT_PID"
	wait "$AGENT_PID" || rc=$?
	AGENT_PID=""
	[ "$rc" -eq 0 ] || fail "the agent exited with $rc on SIGTERM (want 0)"
	echo "    agent stopped on SIGTERM, exit 0"
}

reachable() { ip netns exec "$EP_NS" ping -c1 -W1 "$1" >/dev/null 2>&1; }

# wait_verdicts ALLOWED DENIED: until ALLOWED answers and DENIED does not.
wait_verdicts() {
	local deadline=$((SECONDS + 20))
	until reachable "$1" && ! reachable "$2"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "want $1 allowed and $2 denied, still not so after 20s"
		sleep 0.2
	done
}

# ping_expect ADDR allowed|denied: three pings, all answered or none.
ping_expect() {
	local out rc=0 want=3
	[ "$2" = denied ] && want=0
	out="$(ip netns exec "$EP_NS" ping -c3 -i0.2 -W1 "$1" 2>&1)" || rc=$?
	echo "    \$ ping -c3 $1  (from $EP_NS)"
	echo "$out" | grep -E 'packets transmitted' | show | show
	has "$out" "3 packets transmitted, $want received" ||
		fail "ping $1: want $want of 3 answered ($2)"
	ok "$1 $2"
}

# identities: "labels number" per local identity (db/show identities).
identities() { shell db/show identities | awk 'NR > 1 && NF >= 3 { print $2, $1 }' | sort; }
# ipcache: "prefix identity source" per entry (db/show ipcache).
ipcache() { shell db/show ipcache | awk 'NR > 1 && NF >= 3 { print $1, $2, $3 }' | sort; }
identity_of() { identities | awk -v l="cidr:$1" '$1 == l { print $2 }'; }
status_field() { shell restore/status | sed -n "s/^$1: *//p"; }

# ---- the demo -------------------------------------------------------------
say "Setting up: endpoint netns $EP_NS --veth--> host netns $HOST_NS (device $DEV) --veth--> server netns $SRV_NS"
WORK="$(mktemp -d /tmp/ipcache-agent-demo.XXXXXX)"
mkdir -m 0700 "$WORK/bpf" "$WORK/state" "$WORK/policy"
ip netns add "$EP_NS"
ip netns add "$HOST_NS"
ip netns add "$SRV_NS"
ip -n "$HOST_NS" link add "$DEV" type veth peer name eth0 netns "$EP_NS"
ip -n "$HOST_NS" link set lo up
ip -n "$HOST_NS" addr add 10.201.0.1/24 dev "$DEV"
ip -n "$HOST_NS" link set "$DEV" up
ip -n "$HOST_NS" link add demo-srv0 type veth peer name eth0 netns "$SRV_NS"
ip -n "$HOST_NS" addr add 10.201.9.1/30 dev demo-srv0
ip -n "$HOST_NS" link set demo-srv0 up
ip -n "$HOST_NS" route add "$ALLOWED_IP/32" via 10.201.9.2
ip -n "$HOST_NS" route add "$DENIED_IP/32" via 10.201.9.2
ip netns exec "$HOST_NS" sysctl -qw net.ipv4.ip_forward=1
ip -n "$SRV_NS" link set lo up
ip -n "$SRV_NS" addr add "$ALLOWED_IP/32" dev lo
ip -n "$SRV_NS" addr add "$DENIED_IP/32" dev lo
ip -n "$SRV_NS" addr add 10.201.9.2/30 dev eth0
ip -n "$SRV_NS" link set eth0 up
ip -n "$SRV_NS" route add default via 10.201.9.1
ip -n "$EP_NS" link set lo up
ip -n "$EP_NS" addr add 10.201.0.2/24 dev eth0
ip -n "$EP_NS" link set eth0 up
ip -n "$EP_NS" route add default via 10.201.0.1
# bpffs is mounted here, in this mount namespace, so that the agent's pins
# (made inside `ip netns exec`, which has a mount namespace of its own)
# outlive each agent process.
mount -t bpf -o mode=0700 bpf "$WORK/bpf"
echo "    endpoint 10.201.0.2 (eth0) -> host 10.201.0.1 ($DEV) -> server 10.201.9.2 (eth0), which owns $ALLOWED_IP and $DENIED_IP"
echo "    work dir $WORK (bpffs at bpf/, state dir state/, policy dir policy/)"

say "Without the agent, the endpoint reaches both server addresses"
ping_expect "$ALLOWED_IP" allowed
ping_expect "$DENIED_IP" allowed

say "Starting the agent (background) with an empty policy directory, grace period ${GRACE_SECONDS}s"
start_agent
ping_expect "$DENIED_IP" allowed
echo "    (no policy has an egress rule, so egress is not enforced)"

say "Applying a policy: egress allowed to $ALLOWED_IP/32 only (plus $EXTRA_PREFIX in a second file)"
cat >"$WORK/policy/.allow.tmp" <<EOF
name: demo-allow
egress:
  - toCIDR: ["$ALLOWED_IP/32"]
EOF
cat >"$WORK/policy/.extra.tmp" <<EOF
name: demo-extra
egress:
  - toCIDR: ["$EXTRA_PREFIX"]
EOF
mv "$WORK/policy/.allow.tmp" "$WORK/policy/allow.yaml"
mv "$WORK/policy/.extra.tmp" "$WORK/policy/extra.yaml"
sed 's/^/    allow.yaml | /' "$WORK/policy/allow.yaml"
sed 's/^/    extra.yaml | /' "$WORK/policy/extra.yaml"
list=""
deadline=$((SECONDS + 10))
until list="$(shell policy/list)" && has "$list" '^allow\.yaml +in force' && has "$list" '^extra\.yaml +in force'; do
	[ "$SECONDS" -lt "$deadline" ] || fail "allow.yaml and extra.yaml not both in force after 10s: $list"
	sleep 0.1
done
echo "    \$ ipcache-agent shell policy/list"
echo "$list" | show
wait_verdicts "$ALLOWED_IP" "$DENIED_IP"

say "Traffic: $ALLOWED_IP allowed, $DENIED_IP denied"
ping_expect "$ALLOWED_IP" allowed
ping_expect "$DENIED_IP" denied
echo "    \$ ipcache-agent shell policy/explain $DENIED_IP egress"
shell policy/explain "$DENIED_IP" egress | show
has "$(shell policy/explain "$DENIED_IP" egress)" '^Verdict: drop' || fail "explain: $DENIED_IP is not dropped"
has "$(shell policy/explain "$ALLOWED_IP" egress)" '^Verdict: allow' || fail "explain: $ALLOWED_IP is not allowed"

say "Identities and ipcache before the restart"
echo "    \$ ipcache-agent shell db/show identities"
shell db/show identities | show
echo "    \$ ipcache-agent shell db/show ipcache"
shell db/show ipcache | show
ids_before="$(identities)"
# The host namespace's own addresses (the host entity's) are in the
# ipcache too, and restored with the policies' prefixes.
hosts="$(shell node/addresses | awk 'NR > 1 && $2 == "host"' | wc -l)"
allowed_id="$(identity_of "$ALLOWED_IP/32")"
extra_id="$(identity_of "$EXTRA_PREFIX")"
[ -n "$allowed_id" ] && [ -n "$extra_id" ] || fail "no identity for $ALLOWED_IP/32 or $EXTRA_PREFIX"
ok "$ALLOWED_IP/32 has identity $allowed_id, $EXTRA_PREFIX has identity $extra_id"

say "Starting a continuous ping to $ALLOWED_IP (20/s) that runs across the restart and the grace period"
ip netns exec "$EP_NS" ping -n -i 0.05 -W 1 -c 300 "$ALLOWED_IP" >"$WORK/ping.txt" 2>&1 &
PING_PID=$!
sleep 1

say "Stopping the agent (SIGTERM): the pinned maps and program keep enforcing"
stop_agent
ping_expect "$DENIED_IP" denied
echo "    removing extra.yaml while the agent is down: $EXTRA_PREFIX is now wanted only by the old run"
rm "$WORK/policy/extra.yaml"
sleep 0.5

say "Restarting the agent"
start_agent
kill -0 "$PING_PID" 2>/dev/null || fail "the continuous ping ended before the restart was done"
deadline=$((SECONDS + 10))
until has "$(ipcache)" "^${ALLOWED_IP//./\\.}/32 [0-9]+ directory$"; do
	[ "$SECONDS" -lt "$deadline" ] || fail "$ALLOWED_IP/32 was not re-asserted by the policy after the restart"
	sleep 0.1
done

say "Restore status right after the restart"
echo "    \$ ipcache-agent shell restore/status"
shell restore/status | show
restored="$(status_field Restored)"
held="$(status_field 'Held only by restore')"
released="$(status_field Released)"
[ "$restored" = $((2 + hosts)) ] || fail "restore/status: Restored is '$restored', want $((2 + hosts)) (2 policy prefixes, $hosts host addresses)"
[ "$held" = 1 ] || fail "restore/status: Held only by restore is '$held', want 1 ($EXTRA_PREFIX)"
[ "$released" = false ] || fail "restore/status: Released is '$released' already"
ok "$restored prefixes restored from the pinned map (2 of the policies, $hosts host addresses); $EXTRA_PREFIX is held only by restore"

say "Identity numbers after the restart: unchanged"
echo "    \$ ipcache-agent shell db/show identities"
shell db/show identities | show
echo "    \$ ipcache-agent shell db/show ipcache"
shell db/show ipcache | show
ids_after="$(identities)"
if [ "$ids_before" != "$ids_after" ]; then
	diff <(echo "$ids_before") <(echo "$ids_after") | show
	fail "identities changed across the restart"
fi
has "$(ipcache)" "^${EXTRA_PREFIX//./\\.} $extra_id restored$" ||
	fail "$EXTRA_PREFIX is not in the ipcache as restored with identity $extra_id"
ok "$ALLOWED_IP/32 still $allowed_id, $EXTRA_PREFIX still $extra_id (source restored)"
ping_expect "$ALLOWED_IP" allowed
ping_expect "$DENIED_IP" denied

say "Waiting past the ${GRACE_SECONDS}s grace period: the restore is released"
deadline=$((SECONDS + GRACE_SECONDS + 10))
until [ "$(status_field Released)" = true ]; do
	[ "$SECONDS" -lt "$deadline" ] || fail "the restore was not released after the grace period"
	sleep 0.2
done
deadline=$((SECONDS + 5))
while has "$(ipcache)" "^${EXTRA_PREFIX//./\\.} "; do
	[ "$SECONDS" -lt "$deadline" ] || fail "$EXTRA_PREFIX is still in the ipcache after the release"
	sleep 0.1
done
kill -0 "$PING_PID" 2>/dev/null || fail "the continuous ping ended before the grace period was over"
echo "    \$ ipcache-agent shell restore/status"
shell restore/status | show
echo "    \$ ipcache-agent shell db/show ipcache"
shell db/show ipcache | show
echo "    \$ ipcache-agent shell db/show identities"
shell db/show identities | show
[ -z "$(identity_of "$EXTRA_PREFIX")" ] || fail "identity $extra_id of $EXTRA_PREFIX was not freed"
[ "$(identity_of "$ALLOWED_IP/32")" = "$allowed_id" ] || fail "$ALLOWED_IP/32 changed identity at the release"
ok "$EXTRA_PREFIX released and identity $extra_id freed; $ALLOWED_IP/32 kept $allowed_id"

say "The continuous ping across the restart and the release"
wait "$PING_PID" || true
PING_PID=""
summary="$(grep -E 'packets transmitted' "$WORK/ping.txt" || true)"
echo "$summary" | show
sent="$(echo "$summary" | sed -nE 's/^([0-9]+) packets transmitted.*/\1/p')"
received="$(echo "$summary" | sed -nE 's/.* ([0-9]+) received.*/\1/p')"
[ -n "$sent" ] && [ -n "$received" ] || fail "no ping summary: $(cat "$WORK/ping.txt")"
[ "$sent" -ge 100 ] || fail "only $sent pings sent"
[ "$sent" = "$received" ] || fail "$((sent - received)) of $sent packets lost across the restart"
ok "$sent sent, $received received: zero loss"
ping_expect "$DENIED_IP" denied

say "Stopping the agent"
stop_agent
