// SPDX-License-Identifier: (GPL-2.0-only OR MIT)

//go:build ignore

// Enforcement program of ipcache-agent: CIDR policy by security identity on
// the host side of an endpoint's link (docs/CONTRACT.md).
//
// Two entry points, one per TCX hook of a --devices interface:
//
//   enforce_from_endpoint  TCX ingress: packets the endpoint sends. This is
//                          the endpoint's egress direction; the remote
//                          address is the destination.
//   enforce_to_endpoint    TCX egress: packets the endpoint receives. This is
//                          the endpoint's ingress direction; the remote
//                          address is the source.
//
// Every packet belongs to a subject: the local endpoint whose traffic it
// is, or the host-wide default (subject 0). The endpoint address (the
// source of what a device sends, the destination of what it receives) is
// looked up in `endpoints` (local_endpoint; a frame that is not IPv4 or
// IPv6, a VLAN-tagged one, or one too short for the address, has none);
// no entry is the default, as is an address of a slot that the agent
// says, in endpoint_absent, holds none, whose lookup is skipped (and an
// IPv4 address whose entry the agent copied into its slot's word,
// endpoint_words, is read from there instead of looked up). An
// endpoint bound to a device (`ifindex` set) is only itself on that
// device: a packet another device sends with its address as the source
// is dropped (REASON_SPOOFED_SOURCE, whatever is enforced), and one sent
// to its address on another device belongs to the default. A device that
// endpoints are bound to (a FAMILY_DEVICE key in `endpoints`, looked up
// unless its slot is said to be absent as well) sends only from their
// addresses: anything else it sends is dropped alike, but for neighbour
// discovery. The subject's identity goes into the connection's key
// (ct_key.subject, its low 16 bits: subjects are 0 and label identities,
// below 65536), so a reply is one only for the subject whose policy
// allowed its connection, and into events.
//
// For an IP packet, the remote address's identity is the longest-prefix
// match in `ipcache` (world, 2, when nothing matches). A direction is
// enforced when `enforcement`[subject * 2 + direction] is
// ENFORCE_DEFAULT_DENY (1), ENFORCE_DENY_ONLY (2) or ENFORCE_DROP_ALL (3,
// every IP packet dropped, replies too); a subject nobody
// wrote is 0, not enforced. There a packet that replies to a tracked connection (below)
// passes; any other is looked up in the subject's policy map (`policy` is a
// hash of maps from a subject to an LPM trie; a subject without one has no
// entries) by policy_verdict, for the remote identity and for identity 0
// (rules for any identity; in the default's map skipped while the agent
// says, in policy_flags, that it holds none), with its protocol and
// destination port (ICMP: type
// and code) at prefix length 64, or with the protocol only (48) when it
// has no port. A deny from either lookup drops it (REASON_POLICY_DENY);
// else an allow from either passes it; else 1 drops it (REASON_NO_POLICY)
// and 2 passes it (REASON_NOT_DENIED). A tracked packet may take the
// remote identity and verdict of the last packet checked on its CPU to the
// same subject, direction, remote address, protocol and port, if no write
// that could change them came between (`decision`, by the revision below). Every verdict on IP traffic is
// counted in `counters`, in packets and bytes (skb->len): index
// direction * COUNTERS_SLOTS (8) + slot, slot 0 allowed, slots 1-7 a drop
// of that reason (REASON_NO_POLICY .. REASON_SPOOFED_SOURCE) (layout in
// bpfmaps/counters.go).
//
// Connection tracking (docs/CONTRACT.md; map layout in bpfmaps/conntrack.go):
//   - What the endpoint sends that is not a reply or an established
//     connection's, and so is checked against policy, is first checked
//     for its source address: when the host routes that address to
//     another device (a strict reverse-path filter, by the kernel's FIB;
//     not checked where the FIB cannot tell: a link-local source, a
//     device that does not forward), it is dropped
//     (REASON_SPOOFED_SOURCE). The last answer is kept per CPU for a
//     second (`src_check`, not pinned), so a route change is heeded
//     within a second.
//   - A connection's entry is keyed by the endpoint's and the remote's
//     address and port, protocol, family and the device (ifindex) the
//     packet is on: both directions of a connection find the same entry,
//     and a packet on another device carrying the same addresses and
//     ports (a second workload spoofing the first's address) neither finds
//     nor creates it. The entry says which direction opened it (`origin`),
//     its TCP state and when it expires (CLOCK_MONOTONIC_COARSE,
//     bpf_ktime_get_coarse_ns: a tick's resolution is plenty for timeouts
//     in seconds, and reading it costs a fraction of bpf_ktime_get_ns).
//     The program reads that clock once per jiffy and CPU and keeps it in
//     the per-CPU, unpinned map `clock` (now_ns), so an expiry may be set
//     one tick early.
//   - Two maps of that layout: a new connection's entry is made in
//     `ct_opening` (LRU hash); it moves to `conntrack` (hash, never
//     evicts) when its origin sends a packet after a reply was seen (for
//     TCP, the handshake's last ACK). A flood of new connections (SYNs
//     from spoofed sources never get that far) churns `ct_opening` only
//     and cannot evict an established connection. A full `conntrack`
//     leaves the connection in `ct_opening`, where it works on but can be
//     evicted, and the failed move is counted in `ct_stats` (per CPU, not
//     pinned). A packet looks its entry up in `conntrack`, then in
//     `ct_opening`.
//   - Tracked: TCP, UDP and SCTP (by ports), ICMP and ICMPv6 echo (by the
//     echo identifier, in the endpoint port; remote port 0: the policy
//     lookup uses the type and code instead, see flow.dport). SCTP is
//     tracked like UDP, by its common header's ports: its chunks are not
//     read, and a multihomed association's packets from or to another of
//     the peer's addresses are another entry. Nothing else is tracked:
//     every packet of another protocol, and every packet without ports
//     (unknown IPv6 headers, short L4 headers), is decided by policy
//     alone, in both directions.
//   - A reply is a packet whose entry was opened in the other direction
//     and is not revoked (an echo request never is one). It passes
//     whatever its own direction's policy says, and refreshes the entry.
//   - Any other packet in an enforced direction is checked against policy,
//     every packet, also when its connection is tracked. Allowed: its entry
//     is created (in an enforced direction any TCP packet creates one, not
//     only a SYN, so that a connection that predates enforcement is picked
//     up by its next packet that policy allows) or refreshed, and a revoked
//     entry is no longer revoked. Dropped: its connection's entry is
//     revoked (CT_REVOKED; its stored verdict cleared), not deleted: the
//     connection's packets the other way are then no replies (policy
//     decides on them, and they create nothing), so that revoking a policy
//     stops the connection both ways, whatever the other direction
//     enforces. The revoked entry lives while either side keeps sending.
//   - The check of a tracked forward packet is kept in its entry: the entry
//     stores the revision (the pinned `revision`, which the agent bumps
//     after every write to ipcache, policy or enforcement) at which policy
//     last allowed it. A forward packet whose entry holds the current
//     revision passes without the ipcache and policy lookups: nothing that
//     could change its verdict was written since, so the check would say
//     the same. Any other forward packet is checked in full, and the
//     revision stored is the one read before the lookups (with a full
//     barrier), so that a write racing the lookups leaves a revision that
//     is no longer current. A packet that reads the bumped revision thus
//     sees the write; one that reads the old one is concurrent with the
//     write, as a packet in flight during a write always was. Revision 0
//     (low 48 bits) is never trusted: entries created in a direction that
//     is not enforced, revoked ones, and those of older programs hold it.
//   - The last connection of `conntrack` that passed on a CPU, as a
//     reply or as a forward packet allowed at the current revision, is
//     kept there by direction (`flows`, per CPU, not pinned), with the
//     revision read then: its next packets in a kept direction pass as
//     their entry would let them, without its lookup or update, while
//     the revision stays and for at most FLOW_KEEP_NS (a second), if they
//     change nothing in the entry but its expiry: not a TCP SYN, FIN or
//     RST, not an echo request, nothing to or from a remote port 53 (the
//     endpoint's DNS queries and their answers). An entry is
//     kept only while it is far from expiring, and a reply only when
//     nothing can revoke its entry at the revision (policy allowed its
//     forward direction at it, or does not enforce that direction). The
//     agent bumps the revision after deleting entries that had not
//     expired (a flush). An entry's expiry thus lags its last packet by
//     at most two seconds.
//   - In a direction that is not enforced, packets pass. They are tracked
//     only while the other direction is enforced, since an entry matters
//     only to replies in an enforced direction; with neither direction
//     enforced, nothing is parsed past the EtherType. There only a packet
//     that opens a connection creates an entry: a TCP SYN without ACK, an
//     ICMP or ICMPv6 echo request, any UDP or SCTP packet (the first of a
//     flow has nothing to tell it from the others). A peer's ACK in a
//     direction that is not enforced thus cannot make a connection its own
//     (origin flipped), which would let the endpoint's packets pass the
//     enforced direction as its replies. So when a direction becomes
//     enforced, the connections opened while neither was have no entry:
//     one whose origin direction becomes enforced gets its entry from its
//     next forward packet that policy allows; one whose reply direction
//     becomes enforced has its replies decided by policy.
//   - ICMP destination unreachable (including IPv4's fragmentation needed)
//     and time exceeded, and ICMPv6 destination unreachable, packet too
//     big and time exceeded, pass in either direction as related
//     (REASON_RELATED) when the packet they quote (the inner IP header and
//     the first 8 bytes after it: ports or echo identifier) belongs to a
//     tracked connection that is not revoked, and the error is consistent
//     with it: the error's destination is the quoted packet's source, and
//     for an error the endpoint sends, the error's source is also the
//     quoted packet's destination (the endpoint). A router on the path
//     may send an error about the endpoint's packet, so the source of an
//     error the endpoint receives is not otherwise checked (netfilter does
//     the same); deny rules still apply to it: an error whose own remote
//     address a deny entry matches is dropped (REASON_POLICY_DENY). Any
//     other ICMP error is decided by policy. The inner IPv6 header's
//     extension headers are not walked: a quoted packet with any is not
//     matched (policy decides).
//   - TCP states: opening (only SYNs seen so far) 60 s; established (a
//     packet without SYN seen) 6 h; closing (a RST, or a FIN from both
//     sides) 10 s. A SYN without ACK in the origin direction on a closing
//     entry starts it again as opening (the port pair is being reused). A
//     FIN from one side only keeps the established timeout: a half-closed
//     connection may go on carrying data. UDP, SCTP and ICMP echo: 60 s. These
//     are Cilium's defaults; the loader may set others (the globals
//     ct_timeout_*). An entry's expiry is rewritten only when it moves by
//     more than CT_REFRESH_NS or gets shorter, so that a busy connection
//     does not write its cache line on every packet.
//   - A full `ct_opening` evicts its least recently used entries (LRU): a
//     packet is never dropped because a map is full, and an insertion that
//     fails anyway is ignored (the packet passes, its replies are then
//     decided by policy). The agent deletes expired entries of both maps
//     (conntrackcell/gc.go).
//
// What is parsed, and what is not (a frame the program cannot classify
// with certainty is dropped in an enforced direction, with a reason of
// its own; only what is certainly not IP passes as non-IP):
//   - Only Ethernet framing is understood: the program reads the EtherType at
//     offset 12 (the loader refuses devices that are not Ethernet). The
//     kernel moves a frame's outer VLAN tag into skb metadata before TCX
//     ingress (offloaded tags at egress are metadata too), and the program
//     then sees and enforces the packet inside. A frame whose EtherType is
//     still 802.1Q or 802.1ad carries another tag in the packet: the kernel
//     may strip a priority tag (VLAN ID 0) and route what is inside without
//     running this program again, so such a frame is dropped
//     (REASON_VLAN_TAGGED), whatever it holds, in a direction where any
//     subject is enforced: the tag hides the address that would say whose
//     traffic it is. The agent keeps `enforcement`[ENFORCE_TAGGED_SUBJECT
//     * 2 + direction] on while any endpoint's direction is; the default's
//     own entry counts as well. It passes where nothing is enforced.
//   - Other EtherTypes (ARP, LLDP, ...) are not IP to the kernel either:
//     they pass and are not counted.
//   - IPv6 neighbour discovery (ICMPv6 types 133-137 with hop limit 255,
//     right after the IPv6 header) passes and is counted as allowed when it
//     stays on the link: its remote address (the destination of what the
//     endpoint sends, the source of what it receives) is one the host does
//     not forward to: link-local, link-scope multicast or one of the host's
//     own addresses, as the kernel's FIB says (bpf_fib_lookup: "not
//     forwarded", or "forwarding disabled" on the device; of multicast
//     groups only interface- and link-scope ones, which the FIB does not
//     tell apart), or the
//     unspecified source of duplicate address detection. Neighbour
//     discovery to or from any other address (a routed one), or behind
//     extension headers, is decided by policy. It is exempt because it is
//     what ARP is to IPv4: dropping it would cut an enforced endpoint off
//     its link. For the same reason it passes from a device of endpoints
//     with an address of none of them (link-local, unspecified); with an
//     endpoint's address sent from another device it is spoofed, dropped.
//   - Fragments (IPv4: more-fragments set or an offset; IPv6: a fragment
//     header with either) are placed by the map `fragments` (LRU hash, not
//     pinned, FRAGMENTS_MAX_ENTRIES), keyed by the datagram: its addresses,
//     identification, family, direction and device (and for IPv4 its
//     protocol, which Linux's reassembly keys by too). The first fragment
//     carries the ports and is decided like any packet; when it passes,
//     the entry records its protocol, ports and where the next fragment
//     must start. A later fragment passes (REASON_FRAGMENT_OF_ALLOWED)
//     only if its datagram's entry exists and it starts exactly where the
//     ones before it ended; the last one deletes the entry. A later
//     fragment without an entry (its first fragment was dropped, not seen,
//     or came after it), or one that overlaps or leaves a gap, is dropped
//     (REASON_FRAGMENT) and deletes the entry, so the rest of that datagram
//     is dropped too: fragments that come out of order fail closed. An
//     allowed datagram thus passes whole and a denied one not at all.
//     Fragments are not tracked by conntrack beyond their first fragment.
//   - IPv6 extension headers (hop-by-hop, routing, fragment, destination
//     options, AH) are walked, at most MAX_IPV6_EXT_HDRS (8) of them. A
//     chain that goes on past that is dropped in an enforced direction
//     (REASON_EXT_HEADERS), whatever the policy: Linux walks the whole
//     chain, so the protocol and port it would deliver to are not known
//     here. After a later fragment's header, what follows is data and is
//     not walked. Another next header (ESP, "no next header", ...) is
//     matched as that protocol, without a port: only rules for that
//     protocol or for any protocol pass it.
//   - A packet too short for its IP header, or with a wrong version or
//     IPv4 header length, is dropped in an enforced direction
//     (REASON_MALFORMED) and passed in a non-enforced one. A TCP, UDP or
//     SCTP header too short to hold the ports (also one cut short by IPv4
//     options that run past the packet) is matched with no port and not
//     tracked; a TCP header too short for its flags is matched with its
//     port but not tracked; an ICMP echo too short for its identifier is
//     matched by type and code and not tracked.
//
// DNS to the proxy (the transparent DNS proxy of toFQDNs, dnsproxy/):
//   - A policy entry's verdict VERDICT_DNS_PROXY (3) is an allow, in
//     everything above (conntrack, counters, events, REASON_POLICY), whose
//     DNS the proxy is to see. Of the two lookups, a deny from either wins;
//     else a dns-proxy from either (a DNS rule on the port applies whatever
//     other rule allows the peer); else an allow from either, as
//     policy.Resolve (and policy/explain) resolves them.
//   - Only at TCX ingress (what the endpoint sends, where bpf_sk_assign
//     works), and only for a TCP or UDP packet to port 53 that passes a
//     full check (not a fragment; IPv4 or IPv6, extension headers walked
//     as above): such packets never take the established fast path, for a
//     UDP query from a socket that sent one before (the same ports) must
//     be steered again, which needs its verdict. Every other packet pays
//     one compare of its port.
//   - TCP, whatever the allow: the packet's own tuple is looked up
//     (bpf_skc_lookup_tcp, which also finds request sockets). A local
//     socket other than a listener is a connection the proxy has accepted
//     or is accepting: the packet is only marked MARK_TO_PROXY, and the
//     stack's own lookup delivers it to that socket (assigning the
//     listener would answer the handshake's ACK with a reset). A listener
//     so found is some local server on port 53, not used.
//   - Verdict 3, UDP or a TCP SYN without ACK: the proxy's socket is
//     looked up on the port in the pinned `dns_proxy` (pin `dns-proxy`;
//     0 no proxy) with the packet's addresses and source port
//     (bpf_sk_lookup_udp/tcp: a listener or an unconnected socket, on the
//     wildcard address) and, if it carries the proxy's mark
//     (MARK_PROXY_ANSWER: not another process's socket on a port a crashed
//     agent left pinned), assigned with bpf_sk_assign and the packet marked
//     MARK_TO_PROXY. Another TCP segment without a local socket belongs to
//     a connection opened to the server while no proxy listened: it keeps
//     going there.
//   - No socket, or port 0: the packet passes unchanged to its server
//     (fail-open: DNS keeps being answered while the agent or its proxy is
//     down, without the proxy's name rules).
//   - The mark only makes the host deliver the packet locally: the host
//     needs the policy route `ip rule add fwmark 0x200/0xf00 lookup 2004`,
//     `ip route add local 0.0.0.0/0 dev lo table 2004` (and the same with
//     -6 and ::/0), which the agent installs. The proxy's answer comes
//     from the server's address and port at TCX egress: a reply of the
//     connection the query created.
//
// DNS answers that bypass the proxy (the agent down or restarting, its
// proxy's sockets gone: the queries went to their servers):
//   - Only at TCX egress (what the endpoint receives), for a UDP packet
//     from port 53 that passes as a reply of a tracked connection (so a
//     query the endpoint sent to that server and port, which policy
//     allowed; a dropped packet, one passed by policy alone, a fragment,
//     and TCP are never recorded), while `dns_proxy` holds a port (a proxy
//     was configured: its answers are expected through it) and the packet
//     is not the proxy's own answer (mark MARK_PROXY_ANSWER, 0xa00 in
//     0xf00, which the proxy sets on its sockets).
//   - Such an answer is copied into a struct dns_answer in the pinned ring
//     buffer `dns_answers` (pin `dns-answers`, DNS_ANSWERS_RING_BYTES):
//     the endpoint's and the server's address, the device, the UDP
//     payload's length and its first DNS_ANSWER_PAYLOAD_MAX bytes. The
//     agent reads the ring at start (what was answered while it was down)
//     and while it runs, and allows the addresses answered. An answer the
//     full ring cannot take is counted per CPU in the pinned
//     `dns_answers_lost` (pin `dns-answers-lost`).
//   - Every other reply pays a compare of its protocol and port.
//
// Events (docs/CONTRACT.md "Monitor events"; layout in events/events.go):
//   - The program writes one struct event per verdict to the ring buffer
//     `events` (EVENTS_RING_BYTES, not pinned: each loaded program has its
//     own, which the agent that loaded it reads; a restarted agent loads a
//     new program and reads that one's). What is written is set by the
//     agent in the global events_mask: EVENTS_DROPS, one event for every
//     drop; EVENTS_VERDICTS, also one for every allowed IP packet in an
//     enforced direction. The agent sets the bits only while a monitor
//     client wants them: with nobody reading, events would only fill the
//     ring. With the mask 0 the only added work is that one load.
//   - Rate limit: at most EVENTS_PER_SEC_PER_CPU events per second and CPU,
//     counted in a fixed one-second window per CPU (`event_state`, a
//     per-CPU array), so that a flood costs a map lookup and an increment
//     per packet. Events refused by the limit, and events the full ring
//     buffer could not take, are counted there per CPU (lost_rate,
//     lost_full); the agent sums them (ipcache_agent_events_lost_total).
//   - Reasons (one table, mirrored in bpfmaps/reason.go): drops REASON_NO_POLICY
//     (default deny: no policy entry allows it), REASON_MALFORMED (an IP
//     header too short or wrong), REASON_POLICY_DENY (a deny entry matches
//     it), REASON_VLAN_TAGGED (a VLAN tag in the packet),
//     REASON_EXT_HEADERS (an IPv6 extension header chain past the bound),
//     REASON_FRAGMENT (a fragment the program cannot place),
//     REASON_SPOOFED_SOURCE (the endpoint sent it with a source address
//     the host routes to another device, or that `endpoints` binds to
//     another device); allows
//     REASON_POLICY (a policy entry), REASON_REPLY (a reply of a tracked
//     connection), REASON_ESTABLISHED (a tracked forward packet allowed at
//     the current revision), REASON_RELATED (an ICMP error about a tracked
//     connection), REASON_NOT_DENIED (nothing matches it in a direction of
//     deny rules only), REASON_FRAGMENT_OF_ALLOWED (a later fragment of a
//     datagram whose first fragment passed).
//     A drop's reason is also its slot in `counters` (COUNT_ALLOWED, 0, is
//     the allowed packets'), so the drop reasons stay below COUNTERS_SLOTS.
//
// Headers are read directly from the linear part of the skb when they lie
// in it (the common case, and several times cheaper than a helper call),
// and with bpf_skb_load_bytes otherwise, so that headers outside the linear
// part are read correctly without pulling data. Fields are read with loads
// of their own size, and the keys of conntrack, ipcache and policy are
// written in whole words (see set_ct_tail): byte-wise copies out of the
// packet and keys assembled from narrow stores were a large part of a
// reply's cost (docs/SCALE.md).
//
// The build needs clang and libbpf's bpf_helpers.h only; the few kernel UAPI
// values used are defined below so that no kernel headers for the target
// architecture are needed (see README.md).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// The start of struct __sk_buff (include/uapi/linux/bpf.h), up to the
// fields this program reads; the verifier checks context accesses by
// offset, so a prefix of the UAPI layout is enough.
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
};

// The start of struct bpf_sock (include/uapi/linux/bpf.h), up to the
// field read here (state), for the socket lookups of DNS steering.
struct bpf_sock {
	__u32 bound_dev_if;
	__u32 family;
	__u32 type;
	__u32 protocol;
	__u32 mark;
	__u32 priority;
	__u32 src_ip4;
	__u32 src_ip6[4];
	__u32 src_port;
	__be16 dst_port;
	__u16 unused;
	__u32 dst_ip4;
	__u32 dst_ip6[4];
	__u32 state;
};

// struct bpf_sock_tuple: the socket lookup helpers tell its two forms by
// the size they are given.
struct bpf_sock_tuple {
	union {
		struct {
			__be32 saddr;
			__be32 daddr;
			__be16 sport;
			__be16 dport;
		} ipv4;
		struct {
			__be32 saddr[4];
			__be32 daddr[4];
			__be16 sport;
			__be16 dport;
		} ipv6;
	};
};

#define BPF_F_CURRENT_NETNS (-1L)
#define BPF_TCP_LISTEN 10

// struct bpf_fib_lookup (include/uapi/linux/bpf.h), with the unions
// reduced to the members used here; the size is the UAPI's (64 bytes).
struct bpf_fib_lookup {
	__u8 family;
	__u8 l4_protocol;
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u32 ifindex;
	__be32 flowinfo;
	__u32 ipv6_src[4];
	__u32 ipv6_dst[4];
	__u32 tbid;
	__u8 smac[6];
	__u8 dmac[6];
};

#define BPF_FIB_LKUP_RET_SUCCESS 0
#define BPF_FIB_LKUP_RET_NOT_FWDED 4
#define BPF_FIB_LKUP_RET_FWD_DISABLED 5
#define BPF_FIB_LOOKUP_SKIP_NEIGH (1U << 2)

// Kernel UAPI values (include/uapi/linux/bpf.h, if_ether.h, in.h, pkt_cls.h,
// icmp.h, icmpv6.h, tcp.h).
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_MAP_TYPE_HASH_OF_MAPS 13
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_F_NO_PREALLOC 1
#define BPF_F_MMAPABLE 1024
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define EEXIST 17

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define AF_INET 2
#define AF_INET6 10

#define IPPROTO_HOPOPTS 0
#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_AH 51
#define IPPROTO_ICMPV6 58
#define IPPROTO_DSTOPTS 60
#define IPPROTO_SCTP 132

#define ICMP_ECHOREPLY 0
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
#define ICMP_TIME_EXCEEDED 11
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY 129

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

// TCX verdicts. TCX_NEXT hands the packet to the next program attached to
// the hook (or, after the last one, to the rest of the stack, including any
// classic tc filters) as if this program were not there. TCX_PASS would
// instead end the TCX chain and accept the packet, silently skipping every
// program attached after this one; an allow from a policy program must not
// override what other programs decide, so allow is TCX_NEXT.
#define TCX_NEXT -1
#define TCX_DROP 2

// The map layouts are the agent's ABI (bpfmaps/abi.go, docs/CONTRACT.md
// "BPF maps and pins"); sizes and flags must match bpfmaps/mapspecs.go, as the
// loader replaces these maps with the agent's pinned ones.

#define DIRECTION_INGRESS 0
#define DIRECTION_EGRESS 1

#define FAMILY_IPV4 1
#define FAMILY_IPV6 2
// An `endpoints` key of a device that endpoints are bound to: its ifindex
// where an IPv4 key has the address.
#define FAMILY_DEVICE 3

// Room in `policy` and `endpoints` (bpfmaps.PolicySubjects and
// EndpointsMaxEntries): every subject below 65536.
#define POLICY_SUBJECTS 65536
#define ENDPOINTS_MAX_ENTRIES (2 * POLICY_SUBJECTS)

#define IDENTITY_WORLD 2
#define VERDICT_ALLOW 1
#define VERDICT_DENY 2
// An allow whose DNS (port 53) goes to the DNS proxy (header above).
#define VERDICT_DNS_PROXY 3

#define DNS_PORT 53
// The mark of a packet steered to the DNS proxy, which the host's policy
// route delivers locally: Cilium's "to proxy" mark (MARK_MAGIC_TO_PROXY)
// and its bits.
#define MARK_TO_PROXY 0x200
#define MARK_TO_PROXY_MASK 0xf00
// The DNS proxy's mark on its answers (dnsproxy.AnswerMark), in the same
// mask: such answers are not recorded in `dns_answers`.
#define MARK_PROXY_ANSWER 0xa00

// Prefix lengths of policy_key lookups: a packet with a port (or an ICMP
// type and code) is looked up with all of it; one without, with identity,
// direction and protocol only, so that only protocol-wide and any-protocol
// entries match it.
#define POLICY_PREFIX_PORT 64
#define POLICY_PREFIX_PROTOCOL 48

// Values of `enforcement`[subject * 2 + direction].
#define ENFORCE_NONE 0
#define ENFORCE_DEFAULT_DENY 1
#define ENFORCE_DENY_ONLY 2
// An endpoint's direction whose deny rule did not fit in its policy map:
// every packet is dropped (REASON_POLICY_DENY) until it fits, rather than
// the deny failing open.
#define ENFORCE_DROP_ALL 3

// The slot of `enforcement` that says, per direction, whether any
// endpoint's direction is enforced (bpfmaps.TaggedSubject): no label
// identity has this number, and the default is 0.
#define ENFORCE_TAGGED_SUBJECT 255

// Bits of ipcache_key before ip: cluster_id, pad and family.
#define IPCACHE_STATIC_PREFIX_BITS 32

#define MAX_IPV6_EXT_HDRS 8

#define NSEC_PER_SEC 1000000000ULL

// Conntrack entry flags (ct_value.flags).
#define CT_ESTABLISHED 0x01 // TCP: a packet without SYN seen
#define CT_FIN_ORIGIN 0x02  // TCP: FIN from the origin side
#define CT_FIN_REPLY 0x04   // TCP: FIN from the reply side
#define CT_RST 0x08         // TCP: RST from either side
#define CT_REPLY_SEEN 0x10  // a reply passed
#define CT_REVOKED 0x20     // policy dropped a forward packet since it last allowed one

// An entry's expiry is rewritten only when it moves by more than this.
#define CT_REFRESH_NS NSEC_PER_SEC

// How long `flows` answers for a connection before its entry is looked up
// (and its expiry refreshed) again.
#define FLOW_KEEP_NS NSEC_PER_SEC

#define REVISION_MASK 0xffffffffffffULL

// Events: the bits of events_mask, the rate limit, the ring's size and the
// reason codes (the header above; bpfmaps/reason.go mirrors them).
#define EVENTS_DROPS 0x1
#define EVENTS_VERDICTS 0x2
#define EVENTS_PER_SEC_PER_CPU 1000
#define EVENTS_RING_BYTES (256 * 1024)

// Datagrams being fragmented at once (per program, all devices).
#define FRAGMENTS_MAX_ENTRIES 8192

// COUNT_ALLOWED is the `counters` slot of allowed packets; a drop's slot is
// its reason.
#define COUNT_ALLOWED 0
#define REASON_NO_POLICY 1
#define REASON_MALFORMED 2
#define REASON_POLICY_DENY 3
#define REASON_VLAN_TAGGED 4
#define REASON_EXT_HEADERS 5
#define REASON_FRAGMENT 6
#define REASON_SPOOFED_SOURCE 7
#define REASON_POLICY 16
#define REASON_REPLY 17
#define REASON_ESTABLISHED 18
#define REASON_RELATED 19
#define REASON_NOT_DENIED 20
#define REASON_FRAGMENT_OF_ALLOWED 21

// Slots of `counters` per direction: COUNT_ALLOWED and the drop reasons
// (1..7).
#define COUNTERS_SLOTS 8

#define EVENT_DROP 0
#define EVENT_ALLOW 1

// endpoint_absent is set by the agent at run time, in .bss: bit s (word
// s / 64, bit s % 64) says that no address of slot s (endpoint_slot) is
// in `endpoints`, so that a packet whose endpoint address falls there
// skips that lookup, a hash map's, which is a call and a hash and was
// the dearest part of an established packet. A new program starts at 0,
// which skips nothing, until the agent knows what the pinned map holds;
// the agent clears a slot's bit before it writes an address of that
// slot to the map, and sets it only after the slot's last address left.
#define ENDPOINT_SLOT_BITS 16
#define ENDPOINT_SLOT_MUL 0x9e3779b1U
volatile __u64 endpoint_absent[(1 << ENDPOINT_SLOT_BITS) / 64];

// endpoint_words is set by the agent at run time, in .bss: per slot, the
// one IPv4 address of `endpoints` in that slot and its entry, in one word
// (bits 0-31 the address as loaded, 32-47 the identity, 48-63 the device
// it is bound to, 0 any), so that an IPv4 endpoint's packet reads its
// entry with a load instead of the map's lookup. 0 is no word: the map is
// looked up (unless the slot is absent). The agent writes a word only for
// a slot that holds one IPv4 address, of an identity (never 0 for an
// endpoint) and a device that fit in 16 bits; it clears the word before
// the address's entry changes or goes, and sets it after the entry is
// written, each time with one aligned 8-byte store, so that a packet
// reads the entry as the map holds it (or held it a moment before,
// which a lookup in flight may as well) or 0.
#define ENDPOINT_WORD_ADDR 0xffffffffULL
volatile __u64 endpoint_words[1 << ENDPOINT_SLOT_BITS];

// policy_flags is set by the agent at run time (POLICY_*), in .bss: a
// new program starts at 0, which skips nothing, until the agent knows
// what the pinned policy map holds.
#define POLICY_NO_ANY_IDENTITY 0x1 // no identity-0 entry in the default's map: skip that lookup
volatile __u32 policy_flags;

// events_mask is set by the agent at run time (EVENTS_*): in .bss, which
// the agent writes through its mapping.
volatile __u32 events_mask;

// Timeouts, Cilium's defaults. The loader may rewrite them (the agent's
// hidden test flag does, to shorten them); volatile const keeps them in
// .rodata where it can, and the verifier still sees them as constants.
volatile const __u64 ct_timeout_tcp_opening = 60 * NSEC_PER_SEC;
volatile const __u64 ct_timeout_tcp_established = 21600 * NSEC_PER_SEC;
volatile const __u64 ct_timeout_tcp_closing = 10 * NSEC_PER_SEC;
volatile const __u64 ct_timeout_other = 60 * NSEC_PER_SEC;

struct ipcache_key {
	__u32 prefixlen;
	__u16 cluster_id;
	__u8 pad;
	__u8 family;
	__u8 ip[16];
};

struct remote_endpoint_info {
	__u32 sec_identity;
	__u8 tunnel_endpoint[16];
	__u16 pad;
	__u8 key;
	__u8 flags;
};

// The policy map's LPM key: prefixlen counts the bits after it that must
// match (40 identity and direction, 48 also the protocol, 48 + n also the
// first n bits of dport).
struct policy_key {
	__u32 prefixlen;
	__u32 sec_identity;
	__u8 direction;
	__u8 protocol;
	__be16 dport;
};

struct policy_value {
	__u32 verdict;
	__u32 pad;
};

// IPv4 addresses take the first 4 bytes of an address, the rest is zero.
struct ct_key {
	__u8 endpoint_addr[16];
	__u8 remote_addr[16];
	__be16 endpoint_port;
	__be16 remote_port;
	__u8 protocol;
	__u8 family;
	__u16 subject; // the low 16 bits of the subject whose connection it is
	__u32 ifindex; // the device it was created on
};

// The second word is origin | flags << 8 | checked << 16: checked is the
// low 48 bits of `revision` at which policy last allowed a forward packet
// in an enforced direction (0: never), see allowed_at. It is written in
// one store with origin and flags (ct_forward), so that no CPU reads a
// revision half old and half new. That store may undo a flag another CPU
// set a moment before, as two CPUs' flag updates already may: a flag is
// set again by the connection's next packet of the kind.
struct ct_value {
	__u64 expires; // bpf_ktime_get_coarse_ns() after which the entry is dead
	__u8 origin;   // direction of the packet that created it
	__u8 flags;    // CT_*
	__u16 checked_lo;
	__u32 checked_hi;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct remote_endpoint_info);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ipcache SEC(".maps");

// A subject's policy map (the inner maps of `policy`). Sizes rather than
// types: clang gives types seen only through the outer map's pointer a
// forward declaration, which has no size.
struct policy_inner {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(key_size, sizeof(struct policy_key));
	__uint(value_size, sizeof(struct policy_value));
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32); // the subject
	__uint(max_entries, POLICY_SUBJECTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__array(values, struct policy_inner);
} policy SEC(".maps");

// Indexed by subject * 2 + direction: an array, whose lookup the verifier
// inlines, for it is read for every packet (bpfmaps/abi.go).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2 * POLICY_SUBJECTS);
} enforcement SEC(".maps");

// A local endpoint's address (IPv4 in the first 4 bytes of addr) and what
// it is: its identity (the subject) and the device it is bound to (0:
// any).
struct endpoint_key {
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct endpoint_info {
	__u32 identity;
	__u32 ifindex;
	__u32 flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, ENDPOINTS_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} endpoints SEC(".maps");

// counter is a value of `counters`: one slot's packets and bytes.
struct counter {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(max_entries, 2 * COUNTERS_SLOTS);
} counters SEC(".maps");

// Connections live in two maps of the same layout. A new one starts in
// `ct_opening` (LRU hash) and moves to `conntrack` (hash, never evicts)
// once its origin has sent a packet after a reply, the third packet of a
// TCP handshake: a flood of new connections (SYNs from spoofed sources
// never get that far) churns `ct_opening` only, and cannot evict an
// established connection. When `conntrack` is full, a connection stays in
// `ct_opening` and the move's failure is counted in `ct_stats`.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 262144);
} conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 65536);
} ct_opening SEC(".maps");

// ct_stats counts, per CPU, the moves to `conntrack` that failed because
// it was full (index CT_STAT_FULL). Not pinned.
#define CT_STAT_FULL 0
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} ct_stats SEC(".maps");

// revision counts the agent's writes that can change a verdict (ipcache,
// policy, enforcement): the agent adds one after each such write has
// returned, with an atomic add through a shared mapping of this map.
// Pinned, so that it only grows across restarts. Only its low 48 bits are
// compared; 0 there means "do not trust a stored verdict".
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
} revision SEC(".maps");

// dns_proxy (pinned as `dns-proxy`) holds the DNS proxy's port, in host
// order, which the agent writes once its proxy listens: 0 (or anything
// above 65535) is no proxy, and nothing is steered.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} dns_proxy SEC(".maps");

// An answer's bytes kept in a record: EDNS's safe UDP size, which few
// answers exceed; a longer one keeps its length and first bytes.
#define DNS_ANSWER_PAYLOAD_MAX 1232
// Room for a few thousand records: what an agent restart may leave
// unread.
#define DNS_ANSWERS_RING_BYTES (4 * 1024 * 1024)

// A record of `dns_answers` (1280 bytes; layout in bpfmaps/dnsanswers.go).
// Addresses as in ct_key: IPv4 in the first 4 bytes.
struct dns_answer {
	__u8 family; // FAMILY_IPV4 or FAMILY_IPV6
	__u8 pad[3];
	__u32 length; // the UDP payload's, whose first bytes (at most DNS_ANSWER_PAYLOAD_MAX) are in payload
	__u32 ifindex;
	__u32 pad2;
	__u8 endpoint_addr[16]; // the destination
	__u8 server_addr[16];   // the source
	__u8 payload[DNS_ANSWER_PAYLOAD_MAX];
};

// Puts struct dns_answer into the object's BTF, for bpf2go to generate its
// Go type, whose layout the agent's decoder is tested against.
const struct dns_answer *unused_dns_answer __attribute__((unused));

// dns_answers (pinned as `dns-answers`): DNS answers that reached an
// endpoint without passing the proxy (rules at the top of the file).
// Pinned, so that what was answered while no agent read is there for the
// next one.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, DNS_ANSWERS_RING_BYTES);
} dns_answers SEC(".maps");

// dns_answers_lost (pinned as `dns-answers-lost`) counts, per CPU, the
// answers the full `dns_answers` could not take.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} dns_answers_lost SEC(".maps");

// clock holds, per CPU, the coarse clock as read at the first packet of
// the current jiffy: see now_ns. Not pinned: a reload starts it empty.
struct clock_cache {
	__u64 jiffies;
	__u64 ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct clock_cache);
	__uint(max_entries, 1);
} clock SEC(".maps");

// src_check is, per CPU, the last source address checked by
// source_on_device, on which device, with the answer and until when it
// holds (SRC_CHECK_NS): a workload opens its connections from the same
// address, and the FIB lookup costs more than the rest of the check. Not
// pinned. A route changed under it is heeded within SRC_CHECK_NS.
struct src_check {
	__u64 until; // now_ns() before which the answer holds
	__u32 ifindex;
	__u16 family;
	__u16 on_device;
	__u8 addr[16];
};

#define SRC_CHECK_NS NSEC_PER_SEC

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct src_check);
	__uint(max_entries, 1);
} src_check SEC(".maps");

// decision is, per CPU, the last remote identity and policy verdict that
// a tracked packet was checked to (remote_identity, policy_verdict), with
// what they depend on: the subject, direction, family, remote address,
// protocol and port, and the revision read before the lookups. A workload
// opens its connections to the same peers, and the lookups (two tries)
// are most of a new connection's cost (docs/SCALE.md). It answers only
// at the same revision, which every write that could change either adds
// to, as a connection's stored verdict does (allowed_at). Not pinned.
struct decision_cache {
	__u64 revision; // 0: nothing kept
	__u64 remote[2];
	__u64 what; // subject << 32 | port << 16 | direction << 8 | protocol
	__u32 how;  // policy_flags' POLICY_NO_ANY_IDENTITY << 16 | family << 8 | has_port
	__u32 identity;
	__u32 verdict;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct decision_cache);
	__uint(max_entries, 1);
} decision SEC(".maps");

// flows is, per CPU, the last connection of `conntrack` whose packet
// passed as established (a forward packet that policy allowed at the
// current revision) or as a reply, by direction, with the revision read
// then: a packet of the same connection and direction that changes
// nothing in the entry passes as the lookup would let it, without the
// lookup, whose key hash and compare are about half of an established
// packet's cost (docs/SCALE.md). The rules are at flow_kept and
// keep_flow. Not pinned.
struct flow_cache {
	struct ct_key key;
	__u8 reason[2]; // by direction: REASON_ESTABLISHED, REASON_REPLY, 0 nothing kept
	__u16 pad;
	__u64 revision; // the revision, read as allowed_at does
	__u64 until;    // now_ns() before which it answers
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_cache);
	__uint(max_entries, 1);
} flows SEC(".maps");

// A fragmented datagram whose first fragment passed, keyed as the
// connection is (its addresses, the device) with the datagram's
// identification and the direction instead of the ports, which only the
// first fragment carries (and for IPv4 the protocol, as Linux keys its
// reassembly). Not pinned: a reload starts it empty, and the
// rest of a datagram in flight then is dropped (a fragment the program
// cannot place).
struct frag_key {
	__u8 endpoint_addr[16];
	__u8 remote_addr[16];
	__u32 id; // IPv4's 16-bit or IPv6's 32-bit identification
	__u8 family;
	__u8 direction;
	__u8 protocol; // IPv4's, which is part of its datagram's key; 0 for IPv6
	__u8 pad;
	__u32 ifindex;
};

// What the first fragment told, and the offset (in bytes) the next
// fragment must start at: fragments are placed in order, and one that
// overlaps or leaves a gap drops the rest of the datagram.
struct frag_value {
	__u32 ports;
	__be16 dport;
	__u8 protocol;
	__u8 has_port;
	__u32 next;
	__u32 identity;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key);
	__type(value, struct frag_value);
	__uint(max_entries, FRAGMENTS_MAX_ENTRIES);
} fragments SEC(".maps");

// One event in `events` (64 bytes). Addresses and ports are the
// connection key's: the endpoint's and the remote's (the direction says
// which is the source); ports holds endpoint_port and remote_port as in
// ct_key, the echo identifier for ICMP echo.
struct event {
	__u64 time_ns; // now_ns(): CLOCK_MONOTONIC_COARSE
	__u32 ifindex;
	__u32 identity; // the remote one; 0 when not known (REASON_MALFORMED)
	__u8 direction;
	__u8 verdict; // EVENT_DROP or EVENT_ALLOW
	__u8 reason;  // REASON_*
	__u8 family;
	__u8 protocol;
	__u8 icmp_type;
	__u16 pad;
	__u32 ports;
	__u32 subject; // the local endpoint's identity, 0 the host-wide default
	__u8 endpoint_addr[16];
	__u8 remote_addr[16];
};

// Puts struct event into the object's BTF, for bpf2go to generate its Go
// type (EnforceEvent): the agent decodes the ring's records with it.
const struct event *unused_event __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_RING_BYTES);
} events SEC(".maps");

// event_state is a CPU's rate-limit window and lost events.
struct event_state {
	__u64 window_ns; // start of the current one-second window
	__u64 sent;      // events written in it
	__u64 lost_rate; // refused by the rate limit, ever
	__u64 lost_full; // refused by a full ring buffer, ever
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct event_state);
	__uint(max_entries, 1);
} event_state SEC(".maps");

// What the policy lookup and connection tracking need from a packet. The
// remote address is ct.remote_addr (family says which): the ipcache key
// is built from it only when policy is looked up.
struct flow {
	struct ct_key ct; // addresses by parse_*, the rest by set_ct_tail
	__u32 ports;      // endpoint_port and remote_port as in the key
	__u8 protocol;
	__u8 family;
	__be16 dport;      // for ICMP and ICMPv6: the bytes type, code
	__u8 has_port;
	__u8 tracked;      // a TCP, UDP, SCTP or ICMP echo packet with its ports or identifier
	__u8 tcp_flags;
	__u8 echo_request;
	__u8 icmp_error;   // ct is then the quoted packet's connection, if it has one
	__u8 icmp_type;    // for events
	__u8 fragment;     // part of a fragmented datagram
	__u8 first_fragment;
	__u8 more_fragments;
	__u16 frag_offset; // bytes
	__u16 frag_len;    // bytes of the datagram in this fragment
	__u32 frag_id;
	__u32 subject;
	__u32 l4_off; // where the L4 header starts (set by read_l4)
};

// Offsets in the IPv4 header.
#define IPV4_HLEN 20
#define IPV4_OFF_TOTLEN 2
#define IPV4_OFF_ID 4
#define IPV4_OFF_FRAG 6
#define IPV4_FRAG_MORE 0x2000
#define IPV4_OFF_PROTO 9
#define IPV4_OFF_SADDR 12
#define IPV4_OFF_DADDR 16
#define IPV4_FRAG_OFFSET_MASK 0x1fff

// Offsets in the IPv6 header.
#define IPV6_HLEN 40
#define IPV6_OFF_PAYLOAD_LEN 4
#define IPV6_OFF_NEXTHDR 6
#define IPV6_OFF_HOPLIMIT 7
#define IPV6_OFF_SADDR 8
#define IPV6_OFF_DADDR 24
#define IPV6_FRAG_OFFSET_MASK 0xfff8
#define IPV6_FRAG_MORE 0x0001

// The ICMP and ICMPv6 header before the quoted packet of an error.
#define ICMP_HLEN 8

enum parse_result {
	PARSE_OK,
	PARSE_NDP,         // pass, counted as allowed
	PARSE_MALFORMED,   // drop when enforced (REASON_MALFORMED)
	PARSE_EXT_HEADERS, // drop when enforced (REASON_EXT_HEADERS)
};

// header returns where the len bytes at off of the packet can be read: in
// the linear data if they are there, else in buf, copied by the helper
// (buf must hold len bytes and be 8-byte aligned). Returns 0 if the packet
// is shorter. Callers read fields with loads of their natural alignment
// relative to the header: the verifier requires that of stack reads, and
// byte-wise copies out of the packet were a large part of a reply's cost.
static __always_inline const __u8 *header_at(struct __sk_buff *skb, __u32 off, __u32 len, void *buf, int direct)
{
	void *data, *data_end;

	// Read with an instruction of their own each time: the compiler
	// would otherwise keep skb + offsetof(data) in a register across
	// calls, and the verifier refuses a load through a moved context
	// pointer.
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(data) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	asm volatile("%0 = *(u32 *)(%1 + %2)"
		     : "=r"(data_end)
		     : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));

	if (direct && off < 0xffff && data + off + len <= data_end)
		return data + off;
	if (bpf_skb_load_bytes(skb, off, buf, len) < 0)
		return 0;
	return buf;
}

// header is header_at reading from the linear data where it can.
static __always_inline const __u8 *header(struct __sk_buff *skb, __u32 off, __u32 len, void *buf)
{
	return header_at(skb, off, len, buf, 1);
}

// header_copy is header_at always through the helper: for headers at an
// offset that depends on a walk (behind IPv6 extension headers, inside an
// ICMP error), which are rare. The verifier must treat an offset added to
// a packet pointer as precise, so each distinct offset of a walk would be
// one more state for all that follows; as a helper's argument it is not.
static __always_inline const __u8 *header_copy(struct __sk_buff *skb, __u32 off, __u32 len, void *buf)
{
	return header_at(skb, off, len, buf, 0);
}

#define LOAD16(p, off) (*(const __u16 *)((p) + (off)))
#define LOAD32(p, off) (*(const __u32 *)((p) + (off)))
#define LOAD64(p, off) (*(const __u64 *)((p) + (off)))

// count adds skb to the counter of direction and slot: COUNT_ALLOWED, or
// the drop's reason (REASON_NO_POLICY, REASON_MALFORMED).
static __always_inline void count(struct __sk_buff *skb, __u8 direction, __u32 slot)
{
	__u32 index = direction * COUNTERS_SLOTS + slot;
	struct counter *value = bpf_map_lookup_elem(&counters, &index);

	// Per-CPU: no other writer on this CPU while the program runs.
	if (value) {
		value->packets += 1;
		value->bytes += skb->len;
	}
}

// set_ct_tail writes the key's ports, protocol, family and padding from
// the flow in one store: the hash function reads the key in words, and a
// load that spans several narrower stores stalls until they retire.
static __always_inline void set_ct_tail(struct flow *flow)
{
	*(__u64 *)&flow->ct.endpoint_port = (__u64)flow->ports | (__u64)flow->protocol << 32 |
					    (__u64)flow->family << 40 | (__u64)(__u16)flow->subject << 48;
}

// set_ct_addrs4 and set_ct_addrs6 fill the key's addresses from a packet's
// source and destination at ip (an IPv4 or IPv6 header) seen in
// direction: the endpoint sends at egress and receives at ingress. The
// IPv4 case zeroes the rest of the address fields.
static __always_inline void set_ct_addrs4(struct ct_key *ct, __u8 direction, const __u8 *ip)
{
	__u32 saddr = LOAD32(ip, IPV4_OFF_SADDR), daddr = LOAD32(ip, IPV4_OFF_DADDR);
	__u64 *ep = (__u64 *)ct->endpoint_addr, *rem = (__u64 *)ct->remote_addr;

	ep[0] = direction == DIRECTION_EGRESS ? saddr : daddr;
	ep[1] = 0;
	rem[0] = direction == DIRECTION_EGRESS ? daddr : saddr;
	rem[1] = 0;
}

static __always_inline void set_ct_addrs6(struct ct_key *ct, __u8 direction, const __u8 *ip)
{
	__u64 *ep = (__u64 *)ct->endpoint_addr, *rem = (__u64 *)ct->remote_addr;
	__u32 eoff = direction == DIRECTION_EGRESS ? IPV6_OFF_SADDR : IPV6_OFF_DADDR;
	__u32 roff = direction == DIRECTION_EGRESS ? IPV6_OFF_DADDR : IPV6_OFF_SADDR;

	ep[0] = LOAD64(ip, eoff);
	ep[1] = LOAD64(ip, eoff + 8);
	rem[0] = LOAD64(ip, roff);
	rem[1] = LOAD64(ip, roff + 8);
}

// read_l4 reads what policy and tracking need from the L4 header at l4_off
// of a packet seen in direction: the destination port (TCP, UDP, SCTP:
// all three start with the source and destination ports), and for
// tracking the ports and TCP flags, or the ICMP type and echo identifier.
// An ICMP error sets icmp_error and returns the offset of the quoted IP
// header in *quoted. In a quoted packet (quoted_pkt) only the first 8
// bytes are there for certain, so TCP flags are not read. The key's ports
// are zero unless set here.
static __always_inline void read_l4(struct __sk_buff *skb, __u8 direction, __u32 l4_off,
				    struct flow *flow, __u32 *quoted, int quoted_pkt, int direct)
{
	__u8 buf[16] __attribute__((aligned(8)));
	const __u8 *l4;
	__u8 protocol = flow->protocol;

	flow->ports = 0;
	flow->l4_off = l4_off;
	switch (protocol) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (protocol == IPPROTO_TCP && !quoted_pkt) {
			l4 = header_at(skb, l4_off, 14, buf, direct);
			if (l4) {
				flow->tcp_flags = l4[13];
				flow->tracked = 1;
			} else {
				l4 = header_at(skb, l4_off, 4, buf, direct);
				if (!l4)
					break;
			}
		} else {
			l4 = header_at(skb, l4_off, 4, buf, direct);
			if (!l4)
				break;
			flow->tracked = 1;
		}
		flow->dport = LOAD16(l4, 2);
		flow->has_port = 1;
		if (direction == DIRECTION_EGRESS)
			flow->ports = LOAD32(l4, 0);
		else
			flow->ports = (__u32)LOAD16(l4, 2) | (__u32)LOAD16(l4, 0) << 16;
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		l4 = header_at(skb, l4_off, 8, buf, direct);
		if (!l4)
			break;
		flow->icmp_type = l4[0];
		// Policy matches type (and code) as a port: the type in the
		// high byte of dport, in network order.
		flow->dport = LOAD16(l4, 0);
		flow->has_port = 1;
		if (protocol == IPPROTO_ICMP ? (l4[0] == ICMP_ECHO || l4[0] == ICMP_ECHOREPLY)
					     : (l4[0] == ICMPV6_ECHO_REQUEST || l4[0] == ICMPV6_ECHO_REPLY)) {
			flow->echo_request = protocol == IPPROTO_ICMP ? l4[0] == ICMP_ECHO
								      : l4[0] == ICMPV6_ECHO_REQUEST;
			flow->ports = LOAD16(l4, 4);
			flow->tracked = 1;
		} else if (protocol == IPPROTO_ICMP
				   ? (l4[0] == ICMP_DEST_UNREACH || l4[0] == ICMP_TIME_EXCEEDED)
				   : (l4[0] == ICMPV6_DEST_UNREACH || l4[0] == ICMPV6_PKT_TOOBIG ||
				      l4[0] == ICMPV6_TIME_EXCEED)) {
			flow->icmp_error = 1;
			*quoted = l4_off + ICMP_HLEN;
		}
		break;
	}
}

// parse_quoted sets flow->ct to the connection of the packet an ICMP error
// quotes at off, and flow->tracked if it has one. The quoted packet went
// the other way: the endpoint sent it if the error comes to the endpoint.
static __always_inline void parse_quoted(struct __sk_buff *skb, __u8 direction, __u32 off, struct flow *flow)
{
	__u8 other = direction == DIRECTION_EGRESS ? DIRECTION_INGRESS : DIRECTION_EGRESS;
	__u8 buf[IPV6_HLEN] __attribute__((aligned(8)));
	const __u8 *ip;
	__u32 l4_off;
	__u32 unused;

	flow->tracked = 0;
	flow->protocol = 0;
	flow->ports = 0;
	if (flow->family == FAMILY_IPV4) {
		__u32 ihl;

		ip = header_copy(skb, off, IPV4_HLEN, buf);
		if (!ip)
			return;
		ihl = (ip[0] & 0x0f) * 4;
		if ((ip[0] >> 4) != 4 || ihl < IPV4_HLEN)
			return;
		set_ct_addrs4(&flow->ct, other, ip);
		flow->protocol = ip[IPV4_OFF_PROTO];
		l4_off = off + ihl;
	} else {
		ip = header_copy(skb, off, IPV6_HLEN, buf);
		if (!ip)
			return;
		if ((ip[0] >> 4) != 6)
			return;
		set_ct_addrs6(&flow->ct, other, ip);
		flow->protocol = ip[IPV6_OFF_NEXTHDR];
		l4_off = off + IPV6_HLEN;
	}
	read_l4(skb, other, l4_off, flow, &unused, 1, 0);
	set_ct_tail(flow);
}

static __always_inline enum parse_result parse_ipv4(struct __sk_buff *skb, __u8 direction, struct flow *flow,
						     __u32 *quoted)
{
	__u8 buf[IPV4_HLEN] __attribute__((aligned(8)));
	const __u8 *ip;
	__u32 ihl, total;
	__u16 frag;

	ip = header(skb, ETH_HLEN, IPV4_HLEN, buf);
	if (!ip)
		return PARSE_MALFORMED;
	ihl = (ip[0] & 0x0f) * 4;
	total = bpf_ntohs(LOAD16(ip, IPV4_OFF_TOTLEN));
	if ((ip[0] >> 4) != 4 || ihl < IPV4_HLEN)
		return PARSE_MALFORMED;

	set_ct_addrs4(&flow->ct, direction, ip);
	flow->protocol = ip[IPV4_OFF_PROTO];
	flow->family = FAMILY_IPV4;
	frag = bpf_ntohs(LOAD16(ip, IPV4_OFF_FRAG));
	if (frag & (IPV4_FRAG_OFFSET_MASK | IPV4_FRAG_MORE)) {
		flow->fragment = 1;
		flow->frag_offset = (frag & IPV4_FRAG_OFFSET_MASK) * 8;
		flow->first_fragment = flow->frag_offset == 0;
		flow->more_fragments = !!(frag & IPV4_FRAG_MORE);
		// The total length is only read for fragments: a GSO packet of
		// BIG TCP may carry 0 there, but is never a fragment.
		flow->frag_len = total > ihl ? total - ihl : 0;
		flow->frag_id = LOAD16(ip, IPV4_OFF_ID);
	}
	// A non-first fragment has no L4 header.
	if (!flow->fragment || flow->first_fragment)
		read_l4(skb, direction, ETH_HLEN + ihl, flow, quoted, 0, 1);
	set_ct_tail(flow);
	return PARSE_OK;
}

// is_ipv6_ext says whether nexthdr is an extension header the program
// walks past.
static __always_inline int is_ipv6_ext(__u8 nexthdr)
{
	return nexthdr == IPPROTO_HOPOPTS || nexthdr == IPPROTO_ROUTING || nexthdr == IPPROTO_DSTOPTS ||
	       nexthdr == IPPROTO_FRAGMENT || nexthdr == IPPROTO_AH;
}

static __always_inline __u64 now_ns(void);

// source_on_device says whether the source of a packet the endpoint sends
// belongs behind the device it came from, as a strict reverse-path filter
// decides: the host's route to that address leaves by this device. Only
// when the FIB can tell (a route the device forwards by); a link-local
// source, or a device that does not forward, is not checked. A second
// workload cannot then speak with the first's address.
static __always_inline int source_on_device(struct __sk_buff *skb, const struct flow *flow)
{
	struct bpf_fib_lookup fib = {};
	const __u32 *endpoint = (const __u32 *)flow->ct.endpoint_addr;
	const __u64 *addr = (const __u64 *)flow->ct.endpoint_addr;
	__u32 zero = 0;
	struct src_check *last = bpf_map_lookup_elem(&src_check, &zero);
	__u64 now = now_ns();
	long ret;
	int on_device;

	if (last && last->ifindex == skb->ifindex && last->family == flow->family && now < last->until &&
	    ((const __u64 *)last->addr)[0] == addr[0] && ((const __u64 *)last->addr)[1] == addr[1])
		return last->on_device;
	fib.ifindex = skb->ifindex;
	if (flow->family == FAMILY_IPV4) {
		fib.family = AF_INET;
		fib.ipv6_dst[0] = endpoint[0];
	} else {
		fib.family = AF_INET6;
		for (int i = 0; i < 4; i++)
			fib.ipv6_dst[i] = endpoint[i];
	}
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH);
	on_device = ret != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex == skb->ifindex;
	if (last) {
		// Per CPU: nobody else writes it while the program runs here.
		last->until = now + SRC_CHECK_NS;
		last->ifindex = skb->ifindex;
		last->family = flow->family;
		last->on_device = on_device;
		((__u64 *)last->addr)[0] = addr[0];
		((__u64 *)last->addr)[1] = addr[1];
	}
	return on_device;
}

// ndp_on_link says whether a neighbour discovery message stays on the
// link: its remote address (the destination of what the endpoint sends,
// the source of what it receives) is one the host does not forward to:
// link-local, link-scope multicast, or one of the host's own addresses.
// The kernel's FIB tells (bpf_fib_lookup: BPF_FIB_LKUP_RET_NOT_FWDED for
// all three; BPF_FIB_LKUP_RET_FWD_DISABLED when the device does not
// forward). The unspecified source of duplicate address detection is on
// the link too. Only ICMPv6 133-137 with hop limit 255 get here, so the
// lookup costs nothing on other traffic.
static __always_inline int ndp_on_link(struct __sk_buff *skb, const struct flow *flow)
{
	struct bpf_fib_lookup fib = {};
	const __u32 *remote = (const __u32 *)flow->ct.remote_addr;
	const __u32 *endpoint = (const __u32 *)flow->ct.endpoint_addr;
	long ret;

	if (!(remote[0] | remote[1] | remote[2] | remote[3]))
		return 1;
	// The FIB says "not forwarded" of every multicast address: only
	// interface- and link-scope groups stay on the link (a host that
	// routes multicast forwards the others).
	if (flow->ct.remote_addr[0] == 0xff)
		return (flow->ct.remote_addr[1] & 0x0f) <= 2;
	fib.family = AF_INET6;
	fib.ifindex = skb->ifindex;
	fib.l4_protocol = IPPROTO_ICMPV6;
	for (int i = 0; i < 4; i++) {
		fib.ipv6_src[i] = endpoint[i];
		fib.ipv6_dst[i] = remote[i];
	}
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	return ret == BPF_FIB_LKUP_RET_NOT_FWDED || ret == BPF_FIB_LKUP_RET_FWD_DISABLED;
}

static __always_inline enum parse_result parse_ipv6(struct __sk_buff *skb, __u8 direction, struct flow *flow,
						     __u32 *quoted)
{
	__u8 buf[IPV6_HLEN] __attribute__((aligned(8)));
	const __u8 *ip;
	__u32 off = ETH_HLEN + IPV6_HLEN;
	__u32 payload_end;
	__u8 nexthdr, hoplimit;

	ip = header(skb, ETH_HLEN, IPV6_HLEN, buf);
	if (!ip)
		return PARSE_MALFORMED;
	if ((ip[0] >> 4) != 6)
		return PARSE_MALFORMED;

	set_ct_addrs6(&flow->ct, direction, ip);
	flow->family = FAMILY_IPV6;
	nexthdr = ip[IPV6_OFF_NEXTHDR];
	hoplimit = ip[IPV6_OFF_HOPLIMIT];
	payload_end = ETH_HLEN + IPV6_HLEN + bpf_ntohs(LOAD16(ip, IPV6_OFF_PAYLOAD_LEN));

	if (!is_ipv6_ext(nexthdr)) {
		// The common case: the transport header right after the IPv6
		// one.
		flow->protocol = nexthdr;
		if (nexthdr == IPPROTO_ICMPV6 && hoplimit == 255) {
			__u8 type_buf[8] __attribute__((aligned(8)));
			const __u8 *type = header(skb, off, 1, type_buf);

			// 133 router solicitation .. 137 redirect.
			if (type && *type >= 133 && *type <= 137 && ndp_on_link(skb, flow))
				return PARSE_NDP;
		}
		read_l4(skb, direction, off, flow, quoted, 0, 1);
		set_ct_tail(flow);
		return PARSE_OK;
	}

#pragma unroll
	for (int i = 0; i < MAX_IPV6_EXT_HDRS; i++) {
		__u8 ext_buf[8] __attribute__((aligned(8)));
		const __u8 *ext;

		if (!is_ipv6_ext(nexthdr))
			break;
		ext = header_copy(skb, off, 8, ext_buf);
		if (!ext)
			return PARSE_MALFORMED;
		if (nexthdr == IPPROTO_FRAGMENT) {
			__u16 frag = bpf_ntohs(LOAD16(ext, 2));

			off += 8;
			nexthdr = ext[0];
			// An atomic fragment (offset 0, no more) is a whole datagram.
			if (frag & (IPV6_FRAG_OFFSET_MASK | IPV6_FRAG_MORE)) {
				flow->fragment = 1;
				flow->frag_offset = frag & IPV6_FRAG_OFFSET_MASK;
				flow->first_fragment = flow->frag_offset == 0;
				flow->more_fragments = frag & IPV6_FRAG_MORE;
				flow->frag_id = LOAD32(ext, 4);
				flow->frag_len = payload_end > off ? payload_end - off : 0;
				// What follows a later fragment's header is the
				// datagram's data, not headers.
				if (!flow->first_fragment)
					break;
			}
			continue;
		}
		if (nexthdr == IPPROTO_AH)
			off += ((__u32)ext[1] + 2) * 4;
		else
			off += ((__u32)ext[1] + 1) * 8;
		nexthdr = ext[0];
	}
	if (flow->fragment && !flow->first_fragment) {
		set_ct_tail(flow);
		return PARSE_OK;
	}
	// A chain longer than the program walks: Linux walks it all, so the
	// protocol and port it would deliver to are not known here.
	if (is_ipv6_ext(nexthdr))
		return PARSE_EXT_HEADERS;
	// Neighbour discovery behind extension headers is not exempt: policy
	// decides on it.
	flow->protocol = nexthdr;
	read_l4(skb, direction, off, flow, quoted, 0, 0);
	set_ct_tail(flow);
	return PARSE_OK;
}

// parse reads the packet's IP header (IPv6 when ipv6 is set) into flow:
// a function the verifier checks once, on its own. Inlined, each outcome
// of the parse (protocol, fragment, ICMP error, flags, ...) reached the
// rest of enforce as a state of its own, and the rest was verified again
// for each: its callers see flow as what any parse could have written.
__attribute__((noinline)) int parse(struct __sk_buff *skb, __u32 direction, __u32 ipv6, struct flow *flow,
				    __u32 *quoted)
{
	if (!flow || !quoted)
		return PARSE_MALFORMED;
	if (ipv6)
		return parse_ipv6(skb, direction, flow, quoted);
	return parse_ipv4(skb, direction, flow, quoted);
}

// set_remote_key sets key to the ipcache key of the flow's remote address.
// The trie reads the key's data in words that straddle the stores that
// write it, so the key is written well before the lookup: such a load waits
// until the stores have retired.
static __always_inline void set_remote_key(struct ipcache_key *key, const struct flow *flow)
{
	const __u64 *remote = (const __u64 *)flow->ct.remote_addr;
	__u64 *words = (__u64 *)key;

	// prefixlen, cluster_id 0, pad 0 and family.
	words[0] = (__u64)(IPCACHE_STATIC_PREFIX_BITS + (flow->family == FAMILY_IPV4 ? 32 : 128)) |
		   (__u64)flow->family << 56;
	words[1] = remote[0];
	words[2] = remote[1];
}

// remote_identity is the identity of a remote address (its ipcache key):
// the longest-prefix match in ipcache, world when nothing matches.
static __always_inline __u32 remote_identity(const struct ipcache_key *key)
{
	struct remote_endpoint_info *info = bpf_map_lookup_elem(&ipcache, key);

	return info ? info->sec_identity : IDENTITY_WORLD;
}

// policy_verdict looks the packet up in its subject's policy map for the
// remote identity and for identity 0 (entries for any identity): VERDICT_DENY if either finds a
// deny, else VERDICT_DNS_PROXY if either finds one (a DNS rule on the
// port applies whatever other rule allows the peer: an allow must not
// carry the DNS past the proxy's name check), else VERDICT_ALLOW if
// either finds one, else 0 (policy.Resolve decides the same). Each lookup
// finds the longest matching prefix, so inside one identity an allow
// narrower than a deny would win; the agent never writes such an allow
// (docs/CONTRACT.md).
static __always_inline __u32 policy_verdict(__u32 identity, __u8 direction, const struct flow *flow)
{
	// Both keys are written whole, in word stores, before either lookup
	// (see set_remote_key).
	__u64 keys[4] __attribute__((aligned(8)));
	__u64 prefixlen = flow->has_port ? POLICY_PREFIX_PORT : POLICY_PREFIX_PROTOCOL;
	__u64 tail = (__u64)direction | (__u64)flow->protocol << 8 |
		     (__u64)(flow->has_port ? flow->dport : 0) << 16;
	__u32 subject = flow->subject;
	struct policy_value *remote, *any;
	void *entries;

	keys[0] = prefixlen | (__u64)identity << 32;
	keys[1] = tail;
	keys[2] = prefixlen;
	keys[3] = tail;
	entries = bpf_map_lookup_elem(&policy, &subject);
	if (!entries)
		return 0; // a subject without a map has no entries
	remote = bpf_map_lookup_elem(entries, &keys[0]);
	if (remote && remote->verdict == VERDICT_DENY)
		return VERDICT_DENY;
	// The agent sets the flag only while the default's map holds no
	// identity-0 entry (and clears it before it writes one): the lookup
	// could find nothing then. It says nothing of other subjects' maps.
	any = (!subject && (policy_flags & POLICY_NO_ANY_IDENTITY)) ? 0 : bpf_map_lookup_elem(entries, &keys[2]);
	if (any && any->verdict == VERDICT_DENY)
		return VERDICT_DENY;
	if ((remote && remote->verdict == VERDICT_DNS_PROXY) || (any && any->verdict == VERDICT_DNS_PROXY))
		return VERDICT_DNS_PROXY;
	if ((remote && remote->verdict == VERDICT_ALLOW) || (any && any->verdict == VERDICT_ALLOW))
		return VERDICT_ALLOW;
	return 0;
}

// decide sets *identity and *verdict to the flow's remote identity and
// policy verdict, from `decision` when it holds them at revision checked
// (not 0), else from the lookups, which it then keeps there.
static __always_inline void decide(const struct flow *flow, const struct ipcache_key *remote, __u8 direction,
				   __u64 checked, __u32 *identity, __u32 *verdict)
{
	const __u64 *addr = (const __u64 *)flow->ct.remote_addr;
	__u64 what = (__u64)flow->subject << 32 | (__u64)(flow->has_port ? flow->dport : 0) << 16 |
		     (__u64)direction << 8 | flow->protocol;
	// policy_flags decide whether identity 0 is looked up: the agent
	// moves no revision when it sets them.
	__u32 how = (__u32)(policy_flags & POLICY_NO_ANY_IDENTITY) << 16 | (__u32)flow->family << 8 | flow->has_port;
	__u32 zero = 0;
	struct decision_cache *last = checked ? bpf_map_lookup_elem(&decision, &zero) : 0;

	if (last && last->revision == checked && last->what == what && last->how == how &&
	    last->remote[0] == addr[0] && last->remote[1] == addr[1]) {
		*identity = last->identity;
		*verdict = last->verdict;
		return;
	}
	*identity = remote_identity(remote);
	*verdict = policy_verdict(*identity, direction, flow);
	if (last) {
		// Per CPU: nobody else writes it while the program runs here.
		last->revision = checked;
		last->remote[0] = addr[0];
		last->remote[1] = addr[1];
		last->what = what;
		last->how = how;
		last->identity = *identity;
		last->verdict = *verdict;
	}
}

// now_ns is bpf_ktime_get_coarse_ns, read once per jiffy and CPU. The
// coarse clock moves only at a tick, as jiffies does, so the value read at
// the first packet of a jiffy holds for the rest of it. The helper call
// was a noticeable part of a reply's cost (docs/SCALE.md), while
// bpf_jiffies64 is inlined by the verifier on 64-bit JITs.
//
// At a tick jiffies moves first and the coarse clock a moment later. A
// value read in between is the previous tick's: it is returned (it is the
// clock's value at that moment) but kept only if the clock has moved since
// the last one kept, so a busy CPU does not keep the previous tick's value
// for a whole tick. A CPU whose last packet was ticks ago can still keep
// it: expiries set during that jiffy are then one tick early, nothing for
// timeouts in seconds. Per CPU, so no other CPU writes the pair while it
// is read.
static __always_inline __u64 now_ns(void)
{
	__u32 zero = 0;
	struct clock_cache *cache = bpf_map_lookup_elem(&clock, &zero);
	__u64 jiffies = bpf_jiffies64();
	__u64 ns;

	if (!cache)
		return bpf_ktime_get_coarse_ns();
	if (cache->jiffies == jiffies)
		return cache->ns;
	ns = bpf_ktime_get_coarse_ns();
	if (ns != cache->ns) {
		cache->ns = ns;
		cache->jiffies = jiffies;
	}
	return ns;
}

// ct_update sets what a packet of flow tells about its connection (TCP
// state, reply seen) and refreshes the expiry. reply says whether the
// packet goes against the entry's origin.
static __always_inline void ct_update(struct ct_value *ct, const struct flow *flow, int reply, __u64 now)
{
	__u8 flags = ct->flags;
	__u64 timeout = ct_timeout_other;
	__u64 expires;

	if (reply)
		flags |= CT_REPLY_SEEN;
	if (flow->protocol == IPPROTO_TCP) {
		__u8 tcp = flow->tcp_flags;

		if (!reply && (tcp & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN &&
		    (flags & (CT_RST | CT_FIN_ORIGIN | CT_FIN_REPLY)))
			flags = 0; // a new connection on the same ports
		if (!(tcp & TCP_FLAG_SYN))
			flags |= CT_ESTABLISHED;
		if (tcp & TCP_FLAG_FIN)
			flags |= reply ? CT_FIN_REPLY : CT_FIN_ORIGIN;
		if (tcp & TCP_FLAG_RST)
			flags |= CT_RST;

		if ((flags & CT_RST) || (flags & (CT_FIN_ORIGIN | CT_FIN_REPLY)) == (CT_FIN_ORIGIN | CT_FIN_REPLY))
			timeout = ct_timeout_tcp_closing;
		else if (flags & CT_ESTABLISHED)
			timeout = ct_timeout_tcp_established;
		else
			timeout = ct_timeout_tcp_opening;
	}
	if (flags != ct->flags)
		ct->flags = flags;
	expires = now + timeout;
	if (expires < ct->expires || expires - ct->expires > CT_REFRESH_NS)
		ct->expires = expires;
}

// ct_word is an entry's second word: origin, flags and checked.
static __always_inline __u64 *ct_word(struct ct_value *ct)
{
	return (__u64 *)&ct->origin;
}

// current_revision reads `revision` for a full check, before its lookups:
// an atomic read-and-add of 0 is a full barrier, so the lookups that
// follow cannot see the maps as they were before a write that the value
// read already counts (a plain load may be reordered after them on
// weakly ordered architectures such as arm64). 0 when the map cannot be
// read.
static __always_inline __u64 current_revision(void)
{
	__u32 zero = 0;
	__u64 *rev = bpf_map_lookup_elem(&revision, &zero);

	return rev ? __sync_fetch_and_add(rev, 0) & REVISION_MASK : 0;
}

// allowed_at says whether policy allowed this entry's direction at the
// current revision (plain_revision), so that nothing that could change
// the verdict has been written since.
static __always_inline int allowed_at(struct ct_value *ct, __u64 current)
{
	return current != 0 && (*(volatile __u64 *)ct_word(ct) >> 16) == current;
}

// plain_revision reads `revision` with a plain load, for a comparison with
// a revision stored before (allowed_at, flow_kept): nothing read after it
// depends on it. 0 when the map cannot be read.
static __always_inline __u64 plain_revision(void)
{
	__u32 zero = 0;
	__u64 *rev = bpf_map_lookup_elem(&revision, &zero);

	return rev ? *(volatile __u64 *)rev & REVISION_MASK : 0;
}

// ct_promote moves an entry of `ct_opening` whose origin spoke after a
// reply to `conntrack`; a full `conntrack` leaves it where it is, counted.
static __always_inline void ct_promote(struct ct_value *ct, const struct flow *flow)
{
	struct ct_value copy = *ct;
	long ret = bpf_map_update_elem(&conntrack, &flow->ct, &copy, BPF_NOEXIST);

	// -EEXIST: a packet of the connection on another CPU moved it first.
	if (ret == 0 || ret == -EEXIST) {
		bpf_map_delete_elem(&ct_opening, &flow->ct);
	} else {
		__u32 zero = CT_STAT_FULL;
		__u64 *full = bpf_map_lookup_elem(&ct_stats, &zero);

		if (full)
			*full += 1;
	}
}

// ct_refresh updates an entry with a forward packet, and moves it to
// `conntrack` when it is in `ct_opening` (opening) and has seen a reply.
static __always_inline void ct_refresh(struct ct_value *ct, const struct flow *flow, int opening, __u64 now)
{
	ct_update(ct, flow, 0, now);
	if (opening && (ct->flags & CT_REPLY_SEEN))
		ct_promote(ct, flow);
}

// ct_forward creates the entry of an allowed forward packet (in
// `ct_opening`), or refreshes the one it has. checked is the revision read
// before policy allowed the packet, or 0 when policy was not looked up (a
// direction not enforced): it is stored with the entry, or left as it is
// when 0. A packet that passes forward clears the entry's CT_REVOKED.
static __always_inline void ct_forward(struct ct_value *ct, const struct flow *flow, __u8 direction,
				       __u64 checked, int opening)
{
	__u64 now = now_ns();
	struct ct_value created = {.origin = direction};

	if (ct) {
		ct_update(ct, flow, 0, now);
		if ((checked && (*(volatile __u64 *)ct_word(ct) >> 16) != checked) || (ct->flags & CT_REVOKED))
			*(volatile __u64 *)ct_word(ct) =
				(__u64)ct->origin | (__u64)(ct->flags & ~CT_REVOKED) << 8 | checked << 16;
		if (opening && (ct->flags & CT_REPLY_SEEN))
			ct_promote(ct, flow);
		return;
	}
	ct_update(&created, flow, 0, now);
	*ct_word(&created) |= checked << 16;
	// An LRU map makes room by evicting; should the insertion fail anyway,
	// the packet still passes (see the top of the file).
	bpf_map_update_elem(&ct_opening, &flow->ct, &created, BPF_ANY);
}

// ct_lookup finds a connection's entry in `conntrack`, else in
// `ct_opening` (and says so in *opening).
static __always_inline struct ct_value *ct_lookup(struct ct_key *key, int *opening)
{
	struct ct_value *ct = bpf_map_lookup_elem(&conntrack, key);

	*opening = 0;
	if (ct)
		return ct;
	ct = bpf_map_lookup_elem(&ct_opening, key);
	*opening = ct != 0;
	return ct;
}

// ct_revoke marks the entry of a connection whose forward packet policy
// dropped: its packets the other way are no longer replies, and the
// entry is kept (not deleted) so that they cannot create an entry of
// their own, of the other origin, in a direction that is not enforced.
// Its stored revision goes with it.
static __always_inline void ct_revoke(struct ct_value *ct)
{
	if (!(ct->flags & CT_REVOKED) || (*(volatile __u64 *)ct_word(ct) >> 16))
		*(volatile __u64 *)ct_word(ct) = (__u64)ct->origin | (__u64)(ct->flags | CT_REVOKED) << 8;
}

// flow_keepable says whether a packet leaves its connection's entry as it
// found it but for the expiry, once an earlier packet of the same kind
// updated it: not a TCP SYN, FIN or RST (they move the TCP state), not an
// echo request (never a reply), not to or from a remote port 53 (the
// endpoint's query must be steered, an answer may be recorded:
// dns_answer); the high half of flow->ports is the remote's port.
static __always_inline int flow_keepable(const struct flow *flow)
{
	if (flow->protocol == IPPROTO_TCP && (flow->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)))
		return 0;
	return !flow->echo_request && (flow->ports >> 16) != bpf_htons(DNS_PORT);
}

// ct_key_equal compares two connection keys (44 bytes) as five 64-bit
// words and a 32-bit one, without a branch per word.
static __always_inline int ct_key_equal(const struct ct_key *x, const struct ct_key *y)
{
	const __u64 *a = (const __u64 *)x, *b = (const __u64 *)y;

	return !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) |
		 (__u64)(((const __u32 *)a)[10] ^ ((const __u32 *)b)[10]));
}

// flow_kept returns the reason a tracked packet passes with in direction
// when its connection is the one `flows` keeps on this CPU for that
// direction, at the current revision, before FLOW_KEEP_NS are up; else 0.
// The packet then skips its entry's lookup and update: keep_flow kept
// only an entry of `conntrack` that such packets change nothing of but
// the expiry, which thus lags by at most FLOW_KEEP_NS more (expiries are
// in seconds and more). The entry is still there: `conntrack` does not
// evict, the agent deletes an expired entry (keep_flow keeps one only
// while it is far from expiring) or bumps the revision after a flush, and
// only a forward packet that policy drops revokes one (see keep_reply).
static __always_inline __u8 flow_kept(const struct flow *flow, __u8 direction)
{
	__u32 zero = 0;
	struct flow_cache *kept;
	__u8 reason;

	if (!flow_keepable(flow))
		return 0;
	kept = bpf_map_lookup_elem(&flows, &zero);
	if (!kept)
		return 0;
	reason = kept->reason[direction & 1];
	if (!reason || !ct_key_equal(&flow->ct, &kept->key))
		return 0;
	if (kept->revision != plain_revision() || now_ns() >= kept->until)
		return 0;
	return reason;
}

// keep_flow keeps in `flows` that a packet of flow passed in direction with
// reason at revision (not 0), its entry ct (of `conntrack`) updated with
// it. The same connection at the same revision keeps what it kept for the
// other direction; anything else starts over.
static __always_inline void keep_flow(const struct flow *flow, __u8 direction, __u8 reason,
				      const struct ct_value *ct, __u64 revision)
{
	__u32 zero = 0;
	struct flow_cache *kept;
	__u64 now;

	if (!revision || !flow_keepable(flow))
		return;
	kept = bpf_map_lookup_elem(&flows, &zero);
	if (!kept)
		return;
	now = now_ns();
	// The agent deletes an entry once it expired: none kept that may
	// expire while kept.
	if (ct->expires <= now + FLOW_KEEP_NS)
		return;
	// Per CPU: nobody else writes it while the program runs here.
	if (!ct_key_equal(&flow->ct, &kept->key) || kept->revision != revision || now >= kept->until) {
		kept->key = flow->ct;
		kept->reason[0] = 0;
		kept->reason[1] = 0;
		kept->revision = revision;
		kept->until = now + FLOW_KEEP_NS;
	}
	kept->reason[direction & 1] = reason;
}

// keep_reply keeps a reply that passed (its entry ct updated, not revoked,
// of `conntrack` unless opening) when no packet can revoke its entry at
// the current revision: revoking takes a forward packet that policy drops
// in the connection's enforced direction, and a forward packet that reads
// a revision at which policy allowed it (the entry's checked) takes
// allowed_at's path instead. index is the reply's `enforcement` slot.
static __always_inline void keep_reply(const struct flow *flow, __u8 direction, struct ct_value *ct, int opening,
				       __u32 index)
{
	__u32 origin = index ^ 1;
	__u64 current;
	__u32 *mode;

	if (opening || (ct->flags & CT_REVOKED) || !flow_keepable(flow))
		return;
	current = plain_revision();
	if (!allowed_at(ct, current)) {
		mode = bpf_map_lookup_elem(&enforcement, &origin);
		if (mode && *mode != ENFORCE_NONE)
			return;
	}
	keep_flow(flow, direction, REASON_REPLY, ct, current);
}

// ct_opens says whether a packet opens a connection, so that it may
// create an entry in a direction that is not enforced: a TCP SYN without
// ACK, an ICMP echo request, any UDP or SCTP packet (the first of a flow
// has nothing to tell it from the others).
static __always_inline int ct_opens(const struct flow *flow)
{
	if (flow->protocol == IPPROTO_TCP)
		return (flow->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	if (flow->protocol == IPPROTO_ICMP || flow->protocol == IPPROTO_ICMPV6)
		return flow->echo_request;
	return 1;
}

// quotes_own_flow says whether an ICMP error (flow) is consistent with
// the packet it quotes (about, whose key is the quoted connection's): the
// error goes to the quoted packet's source, and an error the endpoint
// sends comes from the quoted packet's destination, the endpoint itself.
// A router on the path may send an error about a packet of the
// endpoint's, so the source of one the endpoint receives is not checked
// (netfilter does the same); deny rules still apply to it.
static __always_inline int quotes_own_flow(const struct flow *flow, const struct flow *about, __u8 direction)
{
	const __u64 *oe = (const __u64 *)flow->ct.endpoint_addr, *qe = (const __u64 *)about->ct.endpoint_addr;
	const __u64 *or = (const __u64 *)flow->ct.remote_addr, *qr = (const __u64 *)about->ct.remote_addr;

	if (oe[0] != qe[0] || oe[1] != qe[1])
		return 0;
	return direction != DIRECTION_EGRESS || (or[0] == qr[0] && or[1] == qr[1]);
}

// set_frag_key sets key to the fragment key of the flow's datagram.
static __always_inline void set_frag_key(struct frag_key *key, const struct flow *flow, __u8 direction)
{
	__builtin_memcpy(key->endpoint_addr, flow->ct.endpoint_addr, 16);
	__builtin_memcpy(key->remote_addr, flow->ct.remote_addr, 16);
	key->id = flow->frag_id;
	key->family = flow->family;
	key->direction = direction;
	// Every IPv4 fragment carries the protocol, and Linux reassembles by
	// it too; IPv6's later fragments do not.
	key->protocol = flow->family == FAMILY_IPV4 ? flow->protocol : 0;
	key->pad = 0;
	key->ifindex = flow->ct.ifindex;
}

// emit writes an event of the packet, within the rate limit. identity 0
// with a parsed flow is looked up (an allow that did not need it).
static __always_inline void emit(struct __sk_buff *skb, const struct flow *flow, __u8 direction, __u8 verdict,
				 __u8 reason, __u32 identity)
{
	__u32 zero = 0;
	struct event_state *state = bpf_map_lookup_elem(&event_state, &zero);
	struct event *e;
	__u64 now;

	if (!state)
		return;
	now = now_ns();
	if (now - state->window_ns >= NSEC_PER_SEC) {
		state->window_ns = now;
		state->sent = 0;
	}
	if (state->sent >= EVENTS_PER_SEC_PER_CPU) {
		state->lost_rate++;
		return;
	}
	state->sent++;
	if (!identity && flow->family) {
		struct ipcache_key key;

		set_remote_key(&key, flow);
		identity = remote_identity(&key);
	}
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		state->lost_full++;
		return;
	}
	e->time_ns = now;
	e->ifindex = skb->ifindex;
	e->identity = identity;
	e->direction = direction;
	e->verdict = verdict;
	e->reason = reason;
	e->family = flow->family;
	e->protocol = flow->protocol;
	e->icmp_type = flow->icmp_type;
	e->pad = 0;
	e->ports = flow->ports;
	e->subject = flow->subject;
	__builtin_memcpy(e->endpoint_addr, flow->ct.endpoint_addr, 16);
	__builtin_memcpy(e->remote_addr, flow->ct.remote_addr, 16);
	bpf_ringbuf_submit(e, 0);
}

// allow counts an allowed packet of an enforced direction, with an event
// when verdict events are on. The first fragment of a datagram that
// passes lets the rest of it pass (fragments).
static __always_inline int allow(struct __sk_buff *skb, const struct flow *flow, __u8 direction, __u8 reason,
				 __u32 identity)
{
	if (flow->fragment) {
		struct frag_key key;
		struct frag_value value = {
			.ports = flow->ports,
			.dport = flow->dport,
			.protocol = flow->protocol,
			.has_port = flow->has_port,
			.next = flow->frag_len,
			.identity = identity,
		};

		set_frag_key(&key, flow, direction);
		bpf_map_update_elem(&fragments, &key, &value, BPF_ANY);
	}
	count(skb, direction, COUNT_ALLOWED);
	if (events_mask & EVENTS_VERDICTS)
		emit(skb, flow, direction, EVENT_ALLOW, reason, identity);
	return TCX_NEXT;
}

// drop counts a dropped packet, with an event when drop events are on.
// A dropped fragment ends its datagram: the rest of it is dropped too.
static __always_inline int drop(struct __sk_buff *skb, const struct flow *flow, __u8 direction, __u8 reason,
				__u32 identity)
{
	if (flow->fragment) {
		struct frag_key key;

		set_frag_key(&key, flow, direction);
		bpf_map_delete_elem(&fragments, &key);
	}
	count(skb, direction, reason);
	if (events_mask & EVENTS_DROPS)
		emit(skb, flow, direction, EVENT_DROP, reason, identity);
	return TCX_DROP;
}

// later_fragment decides on a fragment after the first: it passes when
// its datagram's first fragment passed and it starts where the fragments
// before it ended (so none overlaps or leaves a gap); the last one ends
// the datagram's entry. Anything else is dropped (REASON_FRAGMENT) and
// ends the datagram.
static __always_inline int later_fragment(struct __sk_buff *skb, struct flow *flow, __u8 direction)
{
	struct frag_key key;
	struct frag_value *value;
	__u32 identity;

	set_frag_key(&key, flow, direction);
	value = bpf_map_lookup_elem(&fragments, &key);
	if (!value || value->next != flow->frag_offset)
		return drop(skb, flow, direction, REASON_FRAGMENT, 0);
	flow->protocol = value->protocol;
	flow->ports = value->ports;
	flow->dport = value->dport;
	flow->has_port = value->has_port;
	identity = value->identity;
	if (flow->more_fragments)
		value->next += flow->frag_len;
	else
		bpf_map_delete_elem(&fragments, &key);
	count(skb, direction, COUNT_ALLOWED);
	if (events_mask & EVENTS_VERDICTS)
		emit(skb, flow, direction, EVENT_ALLOW, REASON_FRAGMENT_OF_ALLOWED, identity);
	return TCX_NEXT;
}

// endpoint_slot is an address's slot in endpoint_absent: a multiplicative
// hash of its 32-bit words (an IPv6 address's folded by xor), as the
// agent computes it (datapathcell, endpointSlot). folded is the words as
// loaded, in host order.
static __always_inline __u32 endpoint_slot(__u32 folded)
{
	return (folded * ENDPOINT_SLOT_MUL) >> (32 - ENDPOINT_SLOT_BITS);
}

// local is what `endpoints` says of a packet's endpoint address.
struct local {
	__u32 identity;
	__u32 ifindex; // the device it is bound to, 0 any
};

// local_endpoint finds the local endpoint of a packet in `endpoints`: the
// source address of what the device sends (direction egress), the
// destination of what it receives, and says whether there is one. Read
// from the IP header before it is parsed, for the subject decides whether
// it is; a packet too short for the address has none (the parse then
// finds it malformed), nor one whose slot the agent says holds no address
// (endpoint_absent). An IPv4 address's entry is read from its slot's word
// when that word is the address's (endpoint_words).
static __always_inline int local_endpoint(struct __sk_buff *skb, __be16 ethertype, __u8 direction,
					  struct local *local)
{
	// Written in whole words, as the other keys (see set_remote_key).
	__u64 key[3] __attribute__((aligned(8)));
	__u8 buf[16] __attribute__((aligned(8)));
	const __u8 *addr;
	struct endpoint_info *info;
	__u32 slot;

	if (ethertype == bpf_htons(ETH_P_IP)) {
		__u64 word;

		addr = header(skb, ETH_HLEN + (direction == DIRECTION_EGRESS ? IPV4_OFF_SADDR : IPV4_OFF_DADDR), 4,
			      buf);
		if (!addr)
			return 0;
		slot = endpoint_slot(LOAD32(addr, 0));
		word = endpoint_words[slot];
		if ((word & ENDPOINT_WORD_ADDR) == LOAD32(addr, 0) && ((word >> 32) & 0xffff)) {
			local->identity = (word >> 32) & 0xffff;
			local->ifindex = word >> 48;
			return 1;
		}
		key[0] = FAMILY_IPV4 | (__u64)LOAD32(addr, 0) << 32;
		key[1] = 0;
		key[2] = 0;
	} else {
		addr = header(skb, ETH_HLEN + (direction == DIRECTION_EGRESS ? IPV6_OFF_SADDR : IPV6_OFF_DADDR), 16,
			      buf);
		if (!addr)
			return 0;
		slot = endpoint_slot(LOAD32(addr, 0) ^ LOAD32(addr, 4) ^ LOAD32(addr, 8) ^ LOAD32(addr, 12));
		// family, pad, then the address from byte 4: words that
		// straddle the address's.
		key[0] = FAMILY_IPV6 | (__u64)LOAD32(addr, 0) << 32;
		key[1] = (__u64)LOAD32(addr, 4) | (__u64)LOAD32(addr, 8) << 32;
		key[2] = LOAD32(addr, 12);
	}
	if ((endpoint_absent[slot / 64] >> (slot % 64)) & 1)
		return 0;
	info = bpf_map_lookup_elem(&endpoints, key);
	if (!info)
		return 0;
	local->identity = info->identity;
	local->ifindex = info->ifindex;
	return 1;
}

// device_has_endpoints reports whether `endpoints` says endpoints are
// bound to the device (a FAMILY_DEVICE key, whose slot is that of its
// ifindex, the key's word where an IPv4 key has the address).
static __always_inline int device_has_endpoints(__u32 ifindex)
{
	__u64 key[3] __attribute__((aligned(8)));

	__u32 slot = endpoint_slot(ifindex);

	if ((endpoint_absent[slot / 64] >> (slot % 64)) & 1)
		return 0;
	key[0] = FAMILY_DEVICE | (__u64)ifindex << 32;
	key[1] = 0;
	key[2] = 0;
	return bpf_map_lookup_elem(&endpoints, key) != 0;
}

static __always_inline void mark_to_proxy(struct __sk_buff *skb)
{
	skb->mark = (skb->mark & ~MARK_TO_PROXY_MASK) | MARK_TO_PROXY;
}

// to_dns_proxy steers a packet the endpoint sends to port 53, which policy
// allowed with verdict, to the DNS proxy (rules at the top of the file):
// a TCP segment of a connection the proxy holds is marked; with verdict
// VERDICT_DNS_PROXY, a UDP packet or a TCP SYN is assigned to the proxy's
// socket and marked. Without a socket it passes unchanged.
static __always_inline void to_dns_proxy(struct __sk_buff *skb, const struct flow *flow, __u32 verdict)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 zero = 0, size, *port;
	__be16 *dport;

	if (flow->fragment || (flow->protocol != IPPROTO_TCP && flow->protocol != IPPROTO_UDP))
		return;
	if (flow->protocol == IPPROTO_UDP && verdict != VERDICT_DNS_PROXY)
		return;
	// What the endpoint sends: its address is the source, and flow->ports
	// the source and destination ports as in the packet.
	if (flow->family == FAMILY_IPV4) {
		t.ipv4.saddr = LOAD32(flow->ct.endpoint_addr, 0);
		t.ipv4.daddr = LOAD32(flow->ct.remote_addr, 0);
		*(__u32 *)&t.ipv4.sport = flow->ports;
		size = sizeof(t.ipv4);
		dport = &t.ipv4.dport;
	} else {
		__builtin_memcpy(t.ipv6.saddr, flow->ct.endpoint_addr, 16);
		__builtin_memcpy(t.ipv6.daddr, flow->ct.remote_addr, 16);
		*(__u32 *)&t.ipv6.sport = flow->ports;
		size = sizeof(t.ipv6);
		dport = &t.ipv6.dport;
	}
	if (flow->protocol == IPPROTO_TCP) {
		__u32 state;

		// Its flags were not read (a short header): nothing to tell.
		if (!flow->tracked)
			return;
		sk = bpf_skc_lookup_tcp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			state = sk->state;
			bpf_sk_release(sk);
			if (state != BPF_TCP_LISTEN) {
				mark_to_proxy(skb);
				return;
			}
		}
		if (verdict != VERDICT_DNS_PROXY || (flow->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
			return;
	}
	port = bpf_map_lookup_elem(&dns_proxy, &zero);
	if (!port || !*port || *port > 0xffff)
		return;
	*dport = bpf_htons((__u16)*port);
	if (flow->protocol == IPPROTO_TCP)
		sk = bpf_sk_lookup_tcp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return;
	// Only the proxy's own sockets (they carry its mark): the port stays
	// pinned while the agent is down, and another process's socket bound
	// to it then must not get the endpoints' DNS.
	if (sk->mark == MARK_PROXY_ANSWER && bpf_sk_assign(skb, sk, 0) == 0)
		mark_to_proxy(skb);
	bpf_sk_release(sk);
}

// record_dns_answer copies a DNS answer (a UDP reply from port 53 that
// passes at TCX egress) into `dns_answers`, unless no proxy is configured
// or it is the proxy's own (rules at the top of the file).
static __always_inline void record_dns_answer(struct __sk_buff *skb, const struct flow *flow)
{
	__u8 buf[8] __attribute__((aligned(8)));
	struct dns_answer *a;
	const __u8 *udp;
	__u32 zero = 0, *port, off, len, n;
	__u64 *lost;

	if ((skb->mark & MARK_TO_PROXY_MASK) == MARK_PROXY_ANSWER)
		return;
	port = bpf_map_lookup_elem(&dns_proxy, &zero);
	if (!port || !*port || *port > 0xffff)
		return;
	off = flow->l4_off;
	if (off > 0xffff)
		return;
	udp = header_copy(skb, off, 8, buf);
	if (!udp)
		return;
	off += 8;
	len = bpf_ntohs(LOAD16(udp, 4));
	if (len < 8 || skb->len < off)
		return;
	len -= 8;
	// No more than the packet holds.
	if (len > skb->len - off)
		len = skb->len - off;
	a = bpf_ringbuf_reserve(&dns_answers, sizeof(*a), 0);
	if (!a) {
		lost = bpf_map_lookup_elem(&dns_answers_lost, &zero);
		if (lost)
			*lost += 1;
		return;
	}
	a->family = flow->family;
	a->pad[0] = 0;
	a->pad[1] = 0;
	a->pad[2] = 0;
	a->length = len;
	a->ifindex = skb->ifindex;
	a->pad2 = 0;
	__builtin_memcpy(a->endpoint_addr, flow->ct.endpoint_addr, 16);
	__builtin_memcpy(a->server_addr, flow->ct.remote_addr, 16);
	n = len < DNS_ANSWER_PAYLOAD_MAX ? len : DNS_ANSWER_PAYLOAD_MAX;
	if (n > 0 && n <= DNS_ANSWER_PAYLOAD_MAX && bpf_skb_load_bytes(skb, off, a->payload, n) < 0) {
		bpf_ringbuf_discard(a, 0);
		return;
	}
	bpf_ringbuf_submit(a, 0);
}

// dns_answer records a reply that passes to the endpoint if it is a DNS
// answer over UDP (record_dns_answer); any other costs a compare or two.
static __always_inline void dns_answer(struct __sk_buff *skb, const struct flow *flow, __u8 direction)
{
	// flow->ports holds the remote's (the source) port in its high half.
	if (direction == DIRECTION_INGRESS && flow->protocol == IPPROTO_UDP &&
	    (flow->ports >> 16) == bpf_htons(DNS_PORT) && !flow->fragment)
		record_dns_answer(skb, flow);
}

// UNDECIDED is what icmp_error_verdict returns when the error is not
// decided by the connection it quotes: no TCX verdict is 0x100.
#define UNDECIDED 0x100

// icmp_error_verdict decides on an ICMP error that quotes a packet (at
// quoted) by the connection it is about, if that is tracked and the error
// is consistent with it; deny rules for the error's own remote address
// still apply. Else it returns UNDECIDED: policy decides, as on any
// packet. A function of its own, which the verifier checks once: inlined,
// the quoted packet's parse was checked again for each way the packet's
// own had been parsed, and its copy of the flow took stack in enforce's
// frame beside parse's.
__attribute__((noinline)) int icmp_error_verdict(struct __sk_buff *skb, __u32 direction, __u32 quoted,
						 const struct flow *flow, const struct ipcache_key *remote)
{
	struct flow about;
	struct ct_value *related;
	__u32 identity;
	int unused;

	if (!flow || !remote)
		return UNDECIDED;
	about = *flow;
	parse_quoted(skb, direction, quoted, &about);
	if (!about.tracked || !quotes_own_flow(flow, &about, direction))
		return UNDECIDED;
	related = ct_lookup(&about.ct, &unused);
	if (!related || (related->flags & CT_REVOKED))
		return UNDECIDED;
	identity = remote_identity(remote);
	if (policy_verdict(identity, direction, flow) == VERDICT_DENY)
		return drop(skb, flow, direction, REASON_POLICY_DENY, identity);
	return allow(skb, flow, direction, REASON_RELATED, identity);
}

static __always_inline int enforce(struct __sk_buff *skb, __u8 direction)
{
	struct flow flow = {};
	struct ipcache_key remote;
	enum parse_result parsed;
	struct ct_value *ct = 0;
	__u32 index, other;
	struct local endpoint = {};
	int local = 0;
	int spoofed = 0;
	__u32 quoted = 0;
	__u64 checked;
	__u32 identity, verdict;
	__u32 *value;
	__u32 mode;
	int enforced, other_enforced = 0, vlan, opening = 0;
	__u8 eth_buf[8] __attribute__((aligned(8)));
	const __u8 *eth;
	__be16 ethertype;

	eth = header(skb, 12, sizeof(ethertype), eth_buf);
	if (!eth)
		return TCX_NEXT;
	ethertype = LOAD16(eth, 0);
	vlan = ethertype == bpf_htons(ETH_P_8021Q) || ethertype == bpf_htons(ETH_P_8021AD);
	if (ethertype != bpf_htons(ETH_P_IP) && ethertype != bpf_htons(ETH_P_IPV6) && !vlan)
		return TCX_NEXT;

	if (!vlan)
		local = local_endpoint(skb, ethertype, direction, &endpoint);
	if (local && endpoint.ifindex && endpoint.ifindex != skb->ifindex) {
		// Bound to another device: a packet sent from here with its
		// address is spoofed; one sent to it here is not for it.
		spoofed = direction == DIRECTION_EGRESS;
		if (!spoofed)
			local = 0;
	}
	if (!local && !vlan && direction == DIRECTION_EGRESS && device_has_endpoints(skb->ifindex)) {
		// Sent by a device of endpoints from an address that is none
		// of theirs: its endpoint's policy would not apply to it.
		// Neighbour discovery (from link-local or unspecified
		// addresses) is how the endpoint gets on the link at all.
		spoofed = 1;
	}
	flow.subject = local ? endpoint.identity : 0;
	if (spoofed) {
		flow.ct.ifindex = skb->ifindex;
		parsed = parse(skb, direction, ethertype != bpf_htons(ETH_P_IP), &flow, &quoted);
		if (parsed == PARSE_NDP && !local) {
			count(skb, direction, COUNT_ALLOWED);
			return TCX_NEXT;
		}
		return drop(skb, &flow, direction, REASON_SPOOFED_SOURCE, 0);
	}

	// Default deny and deny-only are tracked and checked alike; they
	// differ only in what a packet that matches nothing gets.
	// A subject past the array (none is) has no entry: not enforced.
	index = flow.subject * 2 + direction;
	value = bpf_map_lookup_elem(&enforcement, &index);
	mode = value ? *value : ENFORCE_NONE;
	enforced = mode != ENFORCE_NONE;
	if (vlan) {
		// A tag still in the frame (the kernel moved the outer one to
		// metadata): the kernel may strip a priority tag and route what
		// is inside without running this program again. The tag hides
		// whose traffic it is, so any subject's enforcement counts.
		if (!enforced) {
			index = ENFORCE_TAGGED_SUBJECT * 2 + direction;
			value = bpf_map_lookup_elem(&enforcement, &index);
			enforced = value && *value != ENFORCE_NONE;
		}
		if (!enforced) {
			count(skb, direction, COUNT_ALLOWED);
			return TCX_NEXT;
		}
		return drop(skb, &flow, direction, REASON_VLAN_TAGGED, 0);
	}
	if (!enforced) {
		other = index ^ 1;
		value = bpf_map_lookup_elem(&enforcement, &other);
		other_enforced = value && *value != ENFORCE_NONE;
	}
	if (!enforced && !other_enforced) {
		// Nothing to enforce, and no reply to track for.
		count(skb, direction, COUNT_ALLOWED);
		return TCX_NEXT;
	}

	flow.ct.ifindex = skb->ifindex;
	parsed = parse(skb, direction, ethertype != bpf_htons(ETH_P_IP), &flow, &quoted);
	if (parsed == PARSE_NDP || (parsed != PARSE_OK && !enforced)) {
		count(skb, direction, COUNT_ALLOWED);
		return TCX_NEXT;
	}
	if (parsed == PARSE_MALFORMED)
		return drop(skb, &flow, direction, REASON_MALFORMED, 0);
	if (parsed == PARSE_EXT_HEADERS)
		return drop(skb, &flow, direction, REASON_EXT_HEADERS, 0);
	if (flow.fragment && !flow.first_fragment) {
		if (!enforced) {
			count(skb, direction, COUNT_ALLOWED);
			return TCX_NEXT;
		}
		return later_fragment(skb, &flow, direction);
	}
	if (mode == ENFORCE_DROP_ALL)
		return drop(skb, &flow, direction, REASON_POLICY_DENY, 0);

	if (flow.tracked) {
		__u8 kept = flow_kept(&flow, direction);

		if (kept) {
			// What the lookup below would decide (flow_kept).
			if (!enforced) {
				count(skb, direction, COUNT_ALLOWED);
				return TCX_NEXT;
			}
			return allow(skb, &flow, direction, kept, 0);
		}
		ct = ct_lookup(&flow.ct, &opening);
		if (ct && ct->origin != direction && !flow.echo_request) {
			ct_update(ct, &flow, 1, now_ns());
			if (!enforced) {
				dns_answer(skb, &flow, direction);
				keep_reply(&flow, direction, ct, opening, index);
				count(skb, direction, COUNT_ALLOWED);
				return TCX_NEXT;
			}
			// A revoked connection's packets this way are no replies:
			// policy decides on them (below).
			if (!(ct->flags & CT_REVOKED)) {
				dns_answer(skb, &flow, direction);
				keep_reply(&flow, direction, ct, opening, index);
				return allow(skb, &flow, direction, REASON_REPLY, 0);
			}
		}
		// An echo request against an entry of the other direction is a
		// connection of its own that cannot have an entry (same key):
		// policy alone decides on it, as on a revoked connection's
		// packets against its origin.
		if (ct && ct->origin != direction) {
			flow.tracked = 0;
			ct = 0;
		}
	}
	if (!enforced) {
		if (flow.tracked && (ct || ct_opens(&flow)))
			ct_forward(ct, &flow, direction, 0, opening);
		count(skb, direction, COUNT_ALLOWED);
		return TCX_NEXT;
	}
	// A forward packet of a connection that policy allowed at the current
	// revision: nothing that could change the verdict was written since.
	// Not DNS the endpoint sends: its verdict says whether it goes to the
	// DNS proxy (to_dns_proxy).
	if (ct && !(direction == DIRECTION_EGRESS && flow.dport == bpf_htons(DNS_PORT))) {
		__u64 current = plain_revision();

		if (allowed_at(ct, current)) {
			ct_refresh(ct, &flow, opening, now_ns());
			if (!opening)
				keep_flow(&flow, direction, REASON_ESTABLISHED, ct, current);
			return allow(skb, &flow, direction, REASON_ESTABLISHED, 0);
		}
	}
	// Only here, off the path of established connections and replies.
	set_remote_key(&remote, &flow);
	if (flow.icmp_error && quoted) {
		int ret = icmp_error_verdict(skb, direction, quoted, &flow, &remote);

		if (ret != UNDECIDED)
			return ret;
	}

	// Only here, off the path of established connections: a packet with
	// another device's address finds no entry on this device (the device
	// is in the key), so it gets here.
	if (direction == DIRECTION_EGRESS && !source_on_device(skb, &flow))
		return drop(skb, &flow, direction, REASON_SPOOFED_SOURCE, 0);

	// Read only for an entry to store it in: the atomic read writes a
	// cache line that every CPU shares.
	checked = flow.tracked ? current_revision() : 0;
	decide(&flow, &remote, direction, checked, &identity, &verdict);
	if (verdict == VERDICT_ALLOW || verdict == VERDICT_DNS_PROXY || (!verdict && mode == ENFORCE_DENY_ONLY)) {
		if (flow.tracked)
			ct_forward(ct, &flow, direction, checked, opening);
		if (direction == DIRECTION_EGRESS && flow.dport == bpf_htons(DNS_PORT))
			to_dns_proxy(skb, &flow, verdict);
		return allow(skb, &flow, direction, verdict ? REASON_POLICY : REASON_NOT_DENIED, identity);
	}
	if (ct)
		ct_revoke(ct);
	return drop(skb, &flow, direction, verdict ? REASON_POLICY_DENY : REASON_NO_POLICY, identity);
}

SEC("tcx/ingress")
int enforce_from_endpoint(struct __sk_buff *skb)
{
	return enforce(skb, DIRECTION_EGRESS);
}

SEC("tcx/egress")
int enforce_to_endpoint(struct __sk_buff *skb)
{
	return enforce(skb, DIRECTION_INGRESS);
}

char __license[] SEC("license") = "Dual MIT/GPL";
