// SPDX-License-Identifier: Apache-2.0

// Command bench-peer is the benchmark behind `make bench-peer`: the agent
// against what a user would pick instead, nftables, side by side in one
// run, on the same namespaces and the same policy.
//
// # The network
//
// Each scenario (a family and a number of prefixes N) creates three network
// namespaces, bpeer-<pid>-c (the client), -r (the router) and -s (the
// server), a veth from the client to the router and one from the router to
// the server, and forwarding in the router; it removes them at the end.
// Interrupted (^C, SIGTERM), a run stops the agent (its pins and bpffs
// go), dnsmasq and perf, removes the namespaces and its scratch
// directory, and exits with 128 + the signal; a second ^C stops at once.
// The server has three addresses of each family on its veth: one in the
// policy, one the change under load adds, one never allowed.
//
// # The policy
//
// The client's egress may reach N prefixes, all else is dropped: IPv4 only,
// IPv6 only or every other one IPv6 (-families ipv4|ipv6|mixed), /32 and
// /128 or lengths from /24 to /32 and /48 to /128 (-lengths host|mixed),
// the server's allowed address(es) among them. The generated prefixes
// neither overlap nor touch, so nft keeps each as an interval of its own.
//
// # The three modes
//
//   - none: no filter, the baseline every traffic figure is divided by;
//     run first and again last (none-after), the ratios are to the mean
//     of both;
//   - agent: bin/ipcache-agent itself, in the router namespace, with
//     --devices on the client's veth (its program on the veth's TCX
//     ingress enforces the client's egress), a private bpffs, state
//     directory and shell socket, its maps sized for N, and a policy
//     directory of native policy files of one toCIDR rule each (100,000
//     CIDRs a file: a file is at most 4 MiB). Enforced means: /readyz
//     answers ready (every table initialized, nothing degraded) and
//     /metrics counts at least N keys written to both the ipcache and the
//     policy map (each CIDR is a prefix of an identity of its own with one
//     allow entry), polled every 20 ms, then the shell's
//     datapath/ipcache-status has no entry pending or failing, and the
//     pinned enforcement map switches egress on (the agent does so only
//     once the entries are written);
//   - nft: an inet table with an interval set per family and, in the
//     forward hook, for what enters from the client's veth, the rules an
//     administrator writes: ct state established,related accept; daddr in
//     the set accept; drop. Loaded with `nft -f` in the router namespace;
//     the table is deleted at the end.
//
// Before its traffic, each mode is checked: the allowed address(es)
// connect, and the outside address and the change's (before the change)
// do not under a filter, and do with none. A filter that does not filter
// fails the run: no figure is a non-filter's.
//
// # The figures
//
//   - traffic: -rounds rounds (default 3) of TCP request/response (one
//     byte each way on one connection, as netperf's TCP_RR, for
//     -duration) then bulk (128 KiB writes on one connection for
//     -duration, counted by the server); the medians of the rounds' p50,
//     p99, transactions a second and Gbit/s, and their ratios to none.
//     The load generator is this process, client and server in their
//     namespaces. The traffic goes to the server's IPv4 address for ipv4
//     and to its IPv6 address otherwise;
//   - load: agent, from the process's start until enforced (the agent's
//     start, the files read, identities, both maps written); nft, `nft -f`
//     from start to exit. With the loader's CPU (user and system);
//   - change under load: while request/response traffic runs, one prefix
//     is added, the server's change address (agent: a policy file written
//     into the directory, which the agent reads 100 ms after changes
//     settle; nft: `nft add element`), and the time from the change's
//     start until a TCP connection to it succeeds (a new connection
//     attempt every 2 ms: a dropped SYN is resent only after a second);
//   - memory: the kernel's, the change of unreclaimable slab, per-CPU and
//     vmalloc memory (/proc/meminfo) over the load (agent: its maps,
//     programs and whatever its process takes of the kernel; nft: the
//     table, sets and rules), and for the agent the memlock of its BPF
//     maps (/proc/<pid>/fdinfo); the user space's: the agent's RSS after
//     the load (and its peak), nft's peak while loading (none after).
//
// # By DNS name
//
// -names N (at most 1000; -sizes "" for it alone) compares egress by DNS
// name, in fresh namespaces per mode: N names, each answered by a dnsmasq
// in the server namespace with an address of its own bound on the server;
// the client asks each once over UDP and connects to the answer. Modes:
// direct (the client asks the server's dnsmasq, no filter), forward (a
// dnsmasq in the router that only forwards, no filter: the baseline),
// agent (a toFQDNs rule plus a DNS rule on port 53: the agent's DNS proxy
// intercepts the query; ready once its cache has a warm-up name) and nft
// (the router's dnsmasq with --nftset filling a set the forward-hook rules
// accept). Each filter must drop an address whose name was never asked,
// and with no filter it must connect. The figures: the query's p50 and p99,
// from the query's start to the first established connection, and the
// first connections not established within 300 ms. It needs dnsmasq
// (Debian's dnsmasq-base) and says so when missing. With -o json it is a
// second JSON value after the array of scenarios.
//
// The modes run in the order none, agent, nft, none-after in fresh
// namespaces per scenario; the machine's speed varies between runs, so compare the
// ratios of one run. -agent-perf and -agent-perf-change record the first
// agent's load or change under load with `perf record -g` (Debian's
// linux-perf), the agent having no profiling flag of its own. It needs root, nft (Debian's nftables) and the agent
// binary (-agent, default bin/ipcache-agent). -o json prints the figures
// as JSON. docs/SCALE.md has the figures and the run times.
package main
