// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"net/netip"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
)

// DatapathMaps reads the maps the enforcement program looks up, so that
// policy/explain can say what the datapath does with a packet, not only
// what the tables want: they differ while entries cannot be written (a
// full policy map) or are held (make before break). The datapath cell
// provides it; it is optional, and without it policy/explain shows the
// desired state and the reconciliation statuses alone. (policycell cannot
// import the datapath, which imports it.)
type DatapathMaps interface {
	// LookupIdentity returns the identity the ipcache map gives addr, as
	// the program looks it up (longest prefix); found is false if no
	// entry covers it (the program then uses world).
	//
	// Possible errors: the maps are not open (before start, after stop),
	// or the lookup failed.
	LookupIdentity(addr netip.Addr) (id identitycell.NumericIdentity, found bool, err error)
	// LookupPolicy returns the policy map's verdict for key; found is
	// false if the map has no such key.
	//
	// Possible errors: as LookupIdentity.
	LookupPolicy(key PolicyKey) (verdict Verdict, found bool, err error)
	// Enforced reports whether the enforcement map enforces dir.
	//
	// Possible errors: as LookupIdentity.
	Enforced(dir Direction) (bool, error)
}
