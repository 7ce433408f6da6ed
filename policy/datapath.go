// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// Datapath reads the maps the enforcement program looks up, so that
// policy/explain can say what the datapath does with a packet, not only
// what the tables want: they differ while entries cannot be written (a
// full policy map) or are held (make before break:
// datapathcell/README.md). The datapath cell
// provides it; it is optional, and without it policy/explain shows the
// desired state and the reconciliation statuses alone.
type Datapath interface {
	// LookupIdentity returns the identity the ipcache map gives addr, as
	// the program looks it up (longest prefix); found is false if no
	// entry covers it (the program then uses world).
	//
	// Possible errors: the maps are not open (before start, after stop),
	// or the lookup failed.
	LookupIdentity(addr netip.Addr) (id identity.Number, found bool, err error)
	// LookupEndpoint returns the local endpoint the program finds for
	// addr in the endpoints map: its identity, the subject whose policy
	// and enforcement decide its traffic, and its device (ifindex 0: any
	// device). found is false if addr is no local endpoint's (the program
	// then uses the host-wide default, subject 0).
	//
	// Possible errors: as LookupIdentity.
	LookupEndpoint(addr netip.Addr) (subject identity.Number, ifindex uint32, found bool, err error)
	// LookupPolicy returns the entry the program's lookup of key finds in
	// the policy of key.Subject: the longest prefix in that subject's
	// policy map that matches key's prefix (found is false if the subject
	// has no policy map).
	//
	// Possible errors: as LookupIdentity.
	LookupPolicy(key Key) (matched Key, verdict Verdict, found bool, err error)
	// Enforcement returns the enforcement map's value for subject's dir
	// (NotEnforced also when the subject has no entry).
	//
	// Possible errors: as LookupIdentity.
	Enforcement(subject identity.Number, dir Direction) (EnforcementMode, error)
	// IPCacheStatus returns whether the `ipcache` entry of table revision
	// rev is in the ipcache map: Done, Error with why not (a failed or held
	// write), or Pending. The entries carry no status of their own.
	IPCacheStatus(rev statedb.Revision) (reconciler.StatusKind, error)
}

// EnforcementMode is what the datapath does in a subject's direction.
type EnforcementMode uint8

const (
	// NotEnforced: everything passes.
	NotEnforced EnforcementMode = iota
	// DefaultDeny: what the policy map allows passes.
	DefaultDeny
	// DenyOnly: what the policy map denies drops, the rest passes.
	DenyOnly
	// DropAll: everything drops (an endpoint's policy map without room
	// for one of its denies).
	DropAll
)
