// SPDX-License-Identifier: (GPL-2.0-only OR MIT)

//go:build ignore

// DNS steering program of ipcache-agent's transparent DNS proxy, at TCX
// ingress of the host side of an endpoint's link (packets the endpoint
// sends).
//
// An IPv4 or IPv6 UDP or TCP packet to port 53 (IPv4: not a fragment;
// IPv6: no extension header) is assigned with
// bpf_sk_assign to the proxy's socket and marked MARK_TO_PROXY; everything
// else passes untouched (TCX_NEXT, so a program attached after it, such as
// the enforcement program, still sees every packet).
//
// The proxy's socket is found by lookup on the port the agent writes into
// proxy_port (host order; 0 turns steering off), with the packet's own
// addresses and source port, so a proxy bound to the wildcard address
// matches. For TCP the packet's own tuple is looked up first
// (bpf_skc_lookup_tcp, which also finds request and time-wait sockets): a
// segment of a connection the proxy has accepted or is accepting is only
// marked, and the stack's own lookup by the same tuple finds its socket
// (assigning the listener instead would answer the handshake's ACK with a
// reset); a listener found that way is some other local server on port 53
// and is not used. Otherwise only a SYN without ACK (a new connection) is
// assigned to the proxy's listener: a connection opened to the server
// while no proxy listened stays with the server when the proxy comes back
// rather than being reset by a listener that never saw its handshake.
//
// Fail-open: when no socket is found (the agent is down or restarting,
// the proxy closed), the packet passes unmarked and is routed to its
// server as if no proxy existed.
//
// Why the mark: bpf_sk_assign only sets the socket; the IP layer still
// routes the packet by its destination, which is not a local address, and
// a forwarded packet with a socket attached is dropped (ip_forward). The
// host needs a policy route that delivers marked packets locally, as
// TPROXY setups do:
//
//   ip rule add fwmark 0x200/0xf00 lookup 2004
//   ip route add local 0.0.0.0/0 dev lo table 2004
//   ip -6 rule add fwmark 0x200/0xf00 lookup 2004
//   ip -6 route add local ::/0 dev lo table 2004
//
// The build needs clang and libbpf's bpf_helpers.h only; the few kernel
// UAPI definitions used are below (prefixes of the UAPI structs, whose
// field offsets the verifier checks).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

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
	__s32 rx_queue_mapping;
};

// struct bpf_sock_tuple: the helpers tell its two forms by the size given.
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

#define TCX_NEXT -1
#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IP_MF_OFFSET 0x3fff
#define BPF_F_CURRENT_NETNS (-1L)
#define BPF_TCP_LISTEN 10
#define DNS_PORT 53
#define TCP_FLAGS_OFF 13
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

// MARK_TO_PROXY is the mark of a packet assigned to the proxy's socket:
// the policy route above delivers it locally (the value and mask are
// Cilium's "to proxy" mark, so that the two do not collide on one host
// is the integrator's choice).
#define MARK_TO_PROXY 0x200
#define MARK_MASK 0xf00

// proxy_port is the proxy's port in host order, written by the agent at
// run time; 0 steers nothing.
volatile __u16 proxy_port;

struct ipv6hdr_min {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

struct iphdr_min {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

static __always_inline struct bpf_sock *lookup(struct __sk_buff *skb,
		struct bpf_sock_tuple *t, __u32 size, __u8 proto)
{
	if (proto == IPPROTO_TCP)
		return bpf_sk_lookup_tcp(skb, t, size, BPF_F_CURRENT_NETNS, 0);
	return bpf_sk_lookup_udp(skb, t, size, BPF_F_CURRENT_NETNS, 0);
}

static __always_inline void mark_to_proxy(struct __sk_buff *skb)
{
	skb->mark = (skb->mark & ~MARK_MASK) | MARK_TO_PROXY;
}

// steer assigns a packet of the tuple t (size bytes: IPv4 or IPv6 form)
// to the proxy; *dport is t's destination port, which it rewrites.
static __always_inline void steer(struct __sk_buff *skb, struct bpf_sock_tuple *t,
		__u32 size, __be16 *dport, __u8 proto, __u16 port, void *l4, void *end)
{
	struct bpf_sock *sk;

	if (proto == IPPROTO_TCP) {
		sk = bpf_skc_lookup_tcp(skb, t, size, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			__u32 state = sk->state;

			bpf_sk_release(sk);
			if (state != BPF_TCP_LISTEN) {
				mark_to_proxy(skb);
				return;
			}
		}
		// Only a connection's first SYN goes to the listener: a segment
		// of a connection the proxy does not hold (opened to the server
		// while no proxy listened) keeps going to the server.
		if (l4 + TCP_FLAGS_OFF + 1 > end)
			return;
		if ((*(__u8 *)(l4 + TCP_FLAGS_OFF) & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
			return;
	}
	*dport = bpf_htons(port);
	sk = lookup(skb, t, size, proto);
	if (!sk)
		return;
	if (bpf_sk_assign(skb, sk, 0) == 0)
		mark_to_proxy(skb);
	bpf_sk_release(sk);
}

SEC("tcx/ingress")
int steer_dns(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct bpf_sock_tuple t = {};
	__be16 *ports;
	__u16 port;
	__u8 proto;

	port = proxy_port;
	if (!port)
		return TCX_NEXT;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr_min *ip = data + ETH_HLEN;
		__u32 ihl;

		if ((void *)(ip + 1) > end)
			return TCX_NEXT;
		proto = ip->protocol;
		if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
			return TCX_NEXT;
		if (ip->frag_off & bpf_htons(IP_MF_OFFSET))
			return TCX_NEXT;
		ihl = (ip->ver_ihl & 0x0f) * 4;
		if (ihl < sizeof(*ip))
			return TCX_NEXT;
		ports = (void *)ip + ihl;
		if ((void *)(ports + 2) > end)
			return TCX_NEXT;
		if (ports[1] != bpf_htons(DNS_PORT))
			return TCX_NEXT;
		t.ipv4.saddr = ip->saddr;
		t.ipv4.daddr = ip->daddr;
		t.ipv4.sport = ports[0];
		t.ipv4.dport = ports[1];
		steer(skb, &t, sizeof(t.ipv4), &t.ipv4.dport, proto, port, ports, end);
		return TCX_NEXT;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr_min *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > end)
			return TCX_NEXT;
		// Extension headers are not followed: DNS carries none.
		proto = ip6->nexthdr;
		if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
			return TCX_NEXT;
		ports = (void *)(ip6 + 1);
		if ((void *)(ports + 2) > end)
			return TCX_NEXT;
		if (ports[1] != bpf_htons(DNS_PORT))
			return TCX_NEXT;
		__builtin_memcpy(t.ipv6.saddr, ip6->saddr, sizeof(t.ipv6.saddr));
		__builtin_memcpy(t.ipv6.daddr, ip6->daddr, sizeof(t.ipv6.daddr));
		t.ipv6.sport = ports[0];
		t.ipv6.dport = ports[1];
		steer(skb, &t, sizeof(t.ipv6), &t.ipv6.dport, proto, port, ports, end);
	}
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual MIT/GPL";
