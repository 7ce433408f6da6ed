package identitycell

import (
	"fmt"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/labels"
)

// NumericIdentity is the number of a security identity, as the datapath sees
// it in the ipcache and policy maps.
type NumericIdentity uint32

const (
	// IdentityUnknown is no identity.
	IdentityUnknown NumericIdentity = 0

	// IdentityWorld is the identity of any address that is in no ipcache
	// entry.
	IdentityWorld NumericIdentity = 2

	// LocalScope marks the identities allocated on this node (CIDR
	// identities), as in Cilium: local numbers are LocalScope|n for n in
	// 1..0xFFFFFF.
	LocalScope NumericIdentity = 1 << 24

	// MinLocalIdentity and MaxLocalIdentity bound the local scope.
	MinLocalIdentity = LocalScope | 1
	MaxLocalIdentity = LocalScope | 0xFFFFFF
)

// IsLocal reports whether the number is in the local scope.
func (id NumericIdentity) IsLocal() bool {
	return id >= MinLocalIdentity && id <= MaxLocalIdentity
}

// String returns the number in decimal.
func (id NumericIdentity) String() string { return strconv.FormatUint(uint64(id), 10) }

// Identity is a row of the `identities` table: an allocated local identity.
// Rows are immutable once inserted.
//
// The two numbers come first, side by side: the row is then 24 bytes, not
// 32 (one row per prefix at a million prefixes).
type Identity struct {
	ID         NumericIdentity `json:"id" yaml:"id"`
	References uint32          `json:"references" yaml:"references"`
	Labels     labels.Labels   `json:"labels" yaml:"labels"`
}

// TableHeader implements statedb.TableWritable.
func (*Identity) TableHeader() []string { return []string{"ID", "Labels", "References"} }

// TableRow implements statedb.TableWritable.
func (i *Identity) TableRow() []string {
	return []string{i.ID.String(), i.Labels.String(), strconv.FormatUint(uint64(i.References), 10)}
}

var _ statedb.TableWritable = &Identity{}

// IdentitiesTableName is the name of the `identities` table.
const IdentitiesTableName = "identities"

// IdentityIndex is the primary index of the `identities` table, ordered by
// number.
var IdentityIndex = statedb.Index[*Identity, NumericIdentity]{
	Name: "id",
	FromObject: func(i *Identity) index.KeySet {
		return index.NewKeySet(index.Uint32(uint32(i.ID)))
	},
	FromKey: func(id NumericIdentity) index.Key { return index.Uint32(uint32(id)) },
	FromString: func(s string) (index.Key, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("identity %q: %w", s, err)
		}
		return index.Uint32(uint32(n)), nil
	},
	Unique: true,
}

// LabelsIndex finds the identity of a label set. It is unique: a label set
// has at most one identity.
var LabelsIndex = statedb.Index[*Identity, labels.Labels]{
	Name: "labels",
	FromObject: func(i *Identity) index.KeySet {
		return index.NewKeySet(index.String(i.Labels.String()))
	},
	FromKey: func(l labels.Labels) index.Key { return index.String(l.String()) },
	FromString: func(s string) (index.Key, error) {
		l, err := labels.Parse(s)
		if err != nil {
			return nil, err
		}
		return index.String(l.String()), nil
	},
	Unique: true,
}

// NewIdentitiesTable creates and registers the `identities` table. Only the
// allocator writes it.
func NewIdentitiesTable(db *statedb.DB) (statedb.RWTable[*Identity], error) {
	return statedb.NewTable(db, IdentitiesTableName, IdentityIndex, LabelsIndex)
}
