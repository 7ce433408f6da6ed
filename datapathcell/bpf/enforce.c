//go:build ignore

// Enforcement program of ipcache-agent: CIDR policy by security identity on
// the host side of an endpoint's link (DESIGN.md sections 6 and 8).
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
// For an IP packet, the remote address's identity is the longest-prefix
// match in `ipcache` (world, 2, when nothing matches). When the direction is
// enforced (`enforcement`[direction] == 1) the packet passes only if
// `policy` allows the identity for (protocol, port), (protocol, any port) or
// (any protocol); otherwise it is dropped. Every verdict on IP traffic is
// counted in `counters`.
//
// What is parsed, and what is not:
//   - Only Ethernet framing is understood: the program reads the EtherType at
//     offset 12 (the loader refuses devices that are not Ethernet). The
//     kernel moves a VLAN tag into skb metadata before TCX ingress, and
//     offloaded tags at egress are metadata too, so they are invisible here.
//     A frame that still carries an in-band tag (a second, stacked one) is
//     not IP to this program and passes: the host hands it to IP only through
//     a VLAN device stacked on the interface, which is not enforced here.
//   - Non-IP traffic (ARP, LLDP, ...) passes and is not counted.
//   - IPv6 neighbour discovery (ICMPv6 types 133-137 with hop limit 255, so
//     never routed) passes and is counted as allowed: it is what ARP is to
//     IPv4, and dropping it would cut an enforced endpoint off its link.
//   - IPv4 non-first fragments and IPv6 fragments with a nonzero offset carry
//     no L4 header: they are matched with "no port", i.e. only by rules for
//     the whole protocol or for any protocol. A rule with ports therefore
//     passes the first fragment of a datagram and drops the rest
//     (fail-closed; the agent does not track fragments).
//   - IPv6 extension headers (hop-by-hop, routing, fragment, destination
//     options, AH) are walked, at most MAX_IPV6_EXT_HDRS of them. A packet
//     with more, or with another header this program does not know (ESP,
//     "no next header", ...), is matched with that next-header value as
//     protocol and no port: only any-protocol rules pass it.
//   - A packet too short for its IP header is dropped in an enforced
//     direction (counted) and passed in a non-enforced one. A TCP or UDP
//     header too short to hold the port is matched with no port.
//
// Headers are read with bpf_skb_load_bytes rather than direct packet access,
// so that headers outside the linear part of the skb are read correctly
// without pulling data.
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

// Kernel UAPI values (include/uapi/linux/bpf.h, if_ether.h, in.h, pkt_cls.h).
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_F_NO_PREALLOC 1

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

#define IPPROTO_HOPOPTS 0
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_AH 51
#define IPPROTO_ICMPV6 58
#define IPPROTO_DSTOPTS 60

// TCX verdicts. TCX_NEXT hands the packet to the next program attached to
// the hook (or, after the last one, to the rest of the stack, including any
// classic tc filters) as if this program were not there. TCX_PASS would
// instead end the TCX chain and accept the packet, silently skipping every
// program attached after this one; an allow from a policy program must not
// override what other programs decide, so allow is TCX_NEXT.
#define TCX_NEXT -1
#define TCX_DROP 2

// The map layouts are the agent's ABI (datapathcell/abi.go, DESIGN.md
// section 8); sizes and flags must match datapathcell/mapspecs.go, as the
// loader replaces these maps with the agent's pinned ones.

#define DIRECTION_INGRESS 0
#define DIRECTION_EGRESS 1

#define FAMILY_IPV4 1
#define FAMILY_IPV6 2

#define IDENTITY_WORLD 2
#define VERDICT_ALLOW 1

// Bits of ipcache_key before ip: cluster_id, pad and family.
#define IPCACHE_STATIC_PREFIX_BITS 32

#define MAX_IPV6_EXT_HDRS 4

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

struct policy_key {
	__u32 sec_identity;
	__u8 direction;
	__u8 protocol;
	__be16 dport;
};

struct policy_value {
	__u32 verdict;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct remote_endpoint_info);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ipcache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(max_entries, 16384);
} policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
} enforcement SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4);
} counters SEC(".maps");

// What the policy lookup needs from a packet.
struct flow {
	struct ipcache_key remote; // prefixlen, family and ip set
	__u8 protocol;
	__u8 has_port;
	__be16 dport;
};

// Offsets in the IPv4 header.
#define IPV4_HLEN 20
#define IPV4_OFF_FRAG 6
#define IPV4_OFF_PROTO 9
#define IPV4_OFF_SADDR 12
#define IPV4_OFF_DADDR 16
#define IPV4_FRAG_OFFSET_MASK 0x1fff

// Offsets in the IPv6 header.
#define IPV6_HLEN 40
#define IPV6_OFF_NEXTHDR 6
#define IPV6_OFF_HOPLIMIT 7
#define IPV6_OFF_SADDR 8
#define IPV6_OFF_DADDR 24
#define IPV6_FRAG_OFFSET_MASK 0xfff8

enum parse_result {
	PARSE_OK,
	PARSE_NOT_IP,    // pass, not counted
	PARSE_NDP,       // pass, counted as allowed
	PARSE_MALFORMED, // drop when enforced
};

static __always_inline void count(__u8 direction, int allowed)
{
	__u32 index = direction * 2 + (allowed ? 1 : 0);
	__u64 *value = bpf_map_lookup_elem(&counters, &index);

	// Per-CPU: no other writer on this CPU while the program runs.
	if (value)
		*value += 1;
}

// read_dport sets the flow's destination port from the TCP or UDP header at
// l4_off (both have it at offset 2), if the packet is long enough.
static __always_inline void read_dport(struct __sk_buff *skb, __u32 l4_off, struct flow *flow)
{
	__be16 dport;

	if (flow->protocol != IPPROTO_TCP && flow->protocol != IPPROTO_UDP)
		return;
	if (bpf_skb_load_bytes(skb, l4_off + 2, &dport, sizeof(dport)) < 0)
		return;
	flow->dport = dport;
	flow->has_port = 1;
}

static __always_inline enum parse_result parse_ipv4(struct __sk_buff *skb, __u8 direction, struct flow *flow)
{
	__u8 hdr[IPV4_HLEN];
	__u32 ihl;
	__be16 frag;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, hdr, sizeof(hdr)) < 0)
		return PARSE_MALFORMED;
	ihl = (hdr[0] & 0x0f) * 4;
	if ((hdr[0] >> 4) != 4 || ihl < IPV4_HLEN)
		return PARSE_MALFORMED;

	flow->remote.family = FAMILY_IPV4;
	flow->remote.prefixlen = IPCACHE_STATIC_PREFIX_BITS + 32;
	__builtin_memcpy(flow->remote.ip,
			 &hdr[direction == DIRECTION_EGRESS ? IPV4_OFF_DADDR : IPV4_OFF_SADDR], 4);
	flow->protocol = hdr[IPV4_OFF_PROTO];

	__builtin_memcpy(&frag, &hdr[IPV4_OFF_FRAG], sizeof(frag));
	if (bpf_ntohs(frag) & IPV4_FRAG_OFFSET_MASK)
		return PARSE_OK; // non-first fragment: no L4 header
	read_dport(skb, ETH_HLEN + ihl, flow);
	return PARSE_OK;
}

static __always_inline enum parse_result parse_ipv6(struct __sk_buff *skb, __u8 direction, struct flow *flow)
{
	__u8 hdr[IPV6_HLEN];
	__u32 off = ETH_HLEN + IPV6_HLEN;
	__u8 nexthdr;
	int first_fragment = 1;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, hdr, sizeof(hdr)) < 0)
		return PARSE_MALFORMED;
	if ((hdr[0] >> 4) != 6)
		return PARSE_MALFORMED;

	flow->remote.family = FAMILY_IPV6;
	flow->remote.prefixlen = IPCACHE_STATIC_PREFIX_BITS + 128;
	__builtin_memcpy(flow->remote.ip,
			 &hdr[direction == DIRECTION_EGRESS ? IPV6_OFF_DADDR : IPV6_OFF_SADDR], 16);
	nexthdr = hdr[IPV6_OFF_NEXTHDR];

#pragma unroll
	for (int i = 0; i < MAX_IPV6_EXT_HDRS; i++) {
		__u8 ext[4];

		if (nexthdr != IPPROTO_HOPOPTS && nexthdr != IPPROTO_ROUTING &&
		    nexthdr != IPPROTO_DSTOPTS && nexthdr != IPPROTO_FRAGMENT &&
		    nexthdr != IPPROTO_AH)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return PARSE_MALFORMED;
		if (nexthdr == IPPROTO_FRAGMENT) {
			__be16 frag;

			__builtin_memcpy(&frag, &ext[2], sizeof(frag));
			if (bpf_ntohs(frag) & IPV6_FRAG_OFFSET_MASK)
				first_fragment = 0;
			off += 8;
		} else if (nexthdr == IPPROTO_AH) {
			off += ((__u32)ext[1] + 2) * 4;
		} else {
			off += ((__u32)ext[1] + 1) * 8;
		}
		nexthdr = ext[0];
	}
	flow->protocol = nexthdr;

	if (nexthdr == IPPROTO_ICMPV6 && first_fragment && hdr[IPV6_OFF_HOPLIMIT] == 255) {
		__u8 type;

		// 133 router solicitation .. 137 redirect.
		if (bpf_skb_load_bytes(skb, off, &type, sizeof(type)) == 0 && type >= 133 && type <= 137)
			return PARSE_NDP;
	}
	if (first_fragment)
		read_dport(skb, off, flow);
	return PARSE_OK;
}

static __always_inline int policy_allows(__u32 identity, __u8 direction, const struct flow *flow)
{
	struct policy_key key = {
		.sec_identity = identity,
		.direction = direction,
		.protocol = flow->protocol,
		.dport = flow->dport,
	};
	struct policy_value *value;

	if (flow->has_port) {
		value = bpf_map_lookup_elem(&policy, &key);
		if (value && value->verdict == VERDICT_ALLOW)
			return 1;
		key.dport = 0;
	}
	value = bpf_map_lookup_elem(&policy, &key);
	if (value && value->verdict == VERDICT_ALLOW)
		return 1;
	key.protocol = 0;
	key.dport = 0;
	value = bpf_map_lookup_elem(&policy, &key);
	return value && value->verdict == VERDICT_ALLOW;
}

static __always_inline int enforce(struct __sk_buff *skb, __u8 direction)
{
	struct flow flow = {};
	enum parse_result parsed;
	struct remote_endpoint_info *info;
	__u32 identity = IDENTITY_WORLD;
	__u32 index = direction;
	__u32 *enforced;
	__be16 ethertype;

	if (bpf_skb_load_bytes(skb, 12, &ethertype, sizeof(ethertype)) < 0)
		return TCX_NEXT;
	if (ethertype == bpf_htons(ETH_P_IP))
		parsed = parse_ipv4(skb, direction, &flow);
	else if (ethertype == bpf_htons(ETH_P_IPV6))
		parsed = parse_ipv6(skb, direction, &flow);
	else
		return TCX_NEXT;

	enforced = bpf_map_lookup_elem(&enforcement, &index);
	if (!enforced || *enforced != 1 || parsed == PARSE_NDP) {
		count(direction, 1);
		return TCX_NEXT;
	}
	if (parsed != PARSE_OK) {
		count(direction, 0);
		return TCX_DROP;
	}

	info = bpf_map_lookup_elem(&ipcache, &flow.remote);
	if (info)
		identity = info->sec_identity;
	if (policy_allows(identity, direction, &flow)) {
		count(direction, 1);
		return TCX_NEXT;
	}
	count(direction, 0);
	return TCX_DROP;
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
