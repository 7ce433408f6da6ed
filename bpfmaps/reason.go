// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import "fmt"

// Reason is why the program decided as it did (bpf/enforce.c REASON_*).
type Reason uint8

// The reason codes, as the program writes them.
const (
	ReasonNoPolicy   Reason = 1
	ReasonMalformed  Reason = 2
	ReasonPolicyDeny Reason = 3
	// ReasonVLANTagged drops a frame that still carries a VLAN tag in
	// the packet (802.1Q or 802.1ad; the kernel moves only the outer
	// one to metadata), whatever it holds.
	ReasonVLANTagged Reason = 4
	// ReasonExtHeaders drops an IPv6 packet whose extension headers go
	// on past the number the program walks (8).
	ReasonExtHeaders Reason = 5
	// ReasonFragment drops a fragment the program cannot place: one
	// whose datagram's first fragment did not pass (or was not seen), or
	// one that does not start where the fragments before it ended.
	ReasonFragment Reason = 6
	// ReasonSpoofedSource drops a packet sent from a device with the
	// address of a local endpoint that the endpoints map binds to
	// another device (whatever is enforced), or one the endpoint sent
	// with a source address that the host routes to another device (a
	// strict reverse-path filter, by the kernel's FIB).
	ReasonSpoofedSource Reason = 7
	ReasonPolicy        Reason = 16
	ReasonReply         Reason = 17
	ReasonEstablished   Reason = 18
	ReasonRelated       Reason = 19
	// ReasonNotDenied allows a packet that no entry matches in a direction
	// that enforces deny rules only (no default deny).
	ReasonNotDenied Reason = 20
	// ReasonFragmentOfAllowed allows a later fragment of a datagram
	// whose first fragment passed.
	ReasonFragmentOfAllowed Reason = 21
)

// String is the reason's name in monitor's JSON (docs/CONTRACT.md).
func (r Reason) String() string {
	switch r {
	case ReasonNoPolicy:
		return "no-policy"
	case ReasonMalformed:
		return "malformed-ip-header"
	case ReasonPolicyDeny:
		return "policy-deny"
	case ReasonVLANTagged:
		return "vlan-tagged"
	case ReasonExtHeaders:
		return "ext-headers"
	case ReasonFragment:
		return "unplaced-fragment"
	case ReasonSpoofedSource:
		return "spoofed-source"
	case ReasonPolicy:
		return "policy"
	case ReasonReply:
		return "reply"
	case ReasonEstablished:
		return "established"
	case ReasonRelated:
		return "related"
	case ReasonNotDenied:
		return "not-denied"
	case ReasonFragmentOfAllowed:
		return "fragment-of-allowed"
	}
	return fmt.Sprintf("reason-%d", uint8(r))
}
