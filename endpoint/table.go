// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// TableName is the name of the `endpoints` table.
const TableName = "endpoints"

// State is a row of the `endpoints` table: an endpoint in force and what
// the endpoint cell resolved for it. Only the endpoint cell writes it.
type State struct {
	Endpoint

	// Identity is the endpoint's label identity; its labels are
	// IdentityLabels.
	Identity       identity.Number `json:"identity" yaml:"identity"`
	IdentityLabels labels.Labels   `json:"identityLabels" yaml:"identityLabels"`

	// Local is set for an endpoint of this node (--node-name): its
	// addresses are in the datapath's `endpoints` map and it has a policy
	// of its own.
	Local bool `json:"local" yaml:"local"`

	// Owner is who registered the endpoint: "directory:<file>", "cni",
	// or an embedder's resource name.
	Owner string `json:"owner" yaml:"owner"`
}

// TableHeader implements statedb.TableWritable.
func (*State) TableHeader() []string {
	return []string{"Name", "Identity", "Addresses", "Interface", "Node", "Local", "Owner"}
}

// TableRow implements statedb.TableWritable.
func (s *State) TableRow() []string {
	addrs := make([]string, len(s.Addresses))
	for i, a := range s.Addresses {
		addrs[i] = a.String()
	}
	local := "false"
	if s.Local {
		local = "true"
	}
	return []string{s.ID(), s.Identity.String(), strings.Join(addrs, ","), s.Interface, s.Node, local, s.Owner}
}

// NameIndex is the primary index of `endpoints`: "<namespace>/<name>".
var NameIndex = statedb.Index[*State, string]{
	Name: "name",
	FromObject: func(s *State) index.KeySet {
		return index.NewKeySet(index.String(s.ID()))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// IdentityIndex finds the endpoints of an identity.
var IdentityIndex = statedb.Index[*State, identity.Number]{
	Name: "identity",
	FromObject: func(s *State) index.KeySet {
		return index.NewKeySet(index.Uint32(uint32(s.Identity)))
	},
	FromKey: func(id identity.Number) index.Key { return index.Uint32(uint32(id)) },
	FromString: func(s string) (index.Key, error) {
		return index.Uint32String(s)
	},
	Unique: false,
}

// AddressIndex finds the endpoint of an address. The endpoint cell keeps
// addresses unique among the endpoints in force.
var AddressIndex = statedb.Index[*State, netip.Addr]{
	Name: "address",
	FromObject: func(s *State) index.KeySet {
		if len(s.Addresses) == 0 {
			return index.KeySet{}
		}
		keys := make([]index.Key, len(s.Addresses))
		for i, a := range s.Addresses {
			keys[i] = index.NetIPAddr(a)
		}
		return index.NewKeySet(keys[0], keys[1:]...)
	},
	FromKey:    index.NetIPAddr,
	FromString: index.NetIPAddrString,
	Unique:     true,
}

// NewTable creates and registers the `endpoints` table.
func NewTable(db *statedb.DB) (statedb.RWTable[*State], error) {
	return statedb.NewTable(db, TableName, NameIndex, IdentityIndex, AddressIndex)
}

// Clone returns a copy of s that shares nothing mutable with it.
func (s *State) Clone() *State {
	c := *s
	c.Labels = cloneMap(s.Labels)
	c.Addresses = slices.Clone(s.Addresses)
	return &c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

var _ statedb.TableWritable = &State{}
