// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"iter"
	"net/netip"
	"strconv"
	"unsafe"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// Identity is a row of the `identities` table: an allocated local number.
// Rows are immutable once inserted.
//
// An allocated number has labels and at least one reference. Its row also
// says whether the number is withheld: handed out only to a request that
// names it. A number withheld and not allocated has no row (see
// [Allocator]).
//
// Its JSON and YAML are {id, references, labels, withheld (when set)}.
type Identity struct {
	ID identity.Number

	// refs is the reference count in its low 31 bits and the withheld
	// flag in its top bit. There is a row per CIDR prefix, so its size is
	// paid per prefix (docs/SCALE.md): a bool of its own would take the
	// row to the next size class. No number has 2^31 holders; the
	// allocator refuses the reference that would reach the flag
	// (ErrTooManyReferences). It sits beside ID so that the two fill one
	// word before the labels' aligned string.
	refs uint32

	Labels labels.Labels
}

const (
	withheldBit   = 1 << 31
	maxReferences = withheldBit - 1
)

// NewIdentity returns the row of id with the given labels, reference count
// and withheld flag, for tests and tools that build rows outside the
// allocator. references must be at most 2^31-1; more panics, as the
// allocator never counts that many ([ErrTooManyReferences]).
func NewIdentity(id identity.Number, lbls labels.Labels, references uint32, withheld bool) *Identity {
	if references > maxReferences {
		panic(fmt.Sprintf("identity %d: %d references, at most %d", id, references, maxReferences))
	}
	i := &Identity{ID: id, Labels: lbls, refs: references}
	i.setWithheld(withheld)
	return i
}

// References is the number of outstanding references to the identity: at
// least 1 in a row the allocator wrote.
func (i *Identity) References() uint32 { return i.refs & maxReferences }

// Withheld reports whether the number is handed out only to a request
// that names it.
func (i *Identity) Withheld() bool { return i.refs&withheldBit != 0 }

// Allocated reports whether the row holds references: false only for a
// row built outside the allocator with none (NewIdentity).
func (i *Identity) Allocated() bool { return i.References() > 0 }

func (i *Identity) setWithheld(withheld bool) {
	if withheld {
		i.refs |= withheldBit
	} else {
		i.refs &^= withheldBit
	}
}

// identityEncoding is the JSON and YAML form of a row, as it was when the
// count and the flag were fields of their own: `db/show` and anything that
// decodes its output see the same rows.
type identityEncoding struct {
	ID         identity.Number `json:"id" yaml:"id"`
	References uint32          `json:"references" yaml:"references"`
	Labels     labels.Labels   `json:"labels" yaml:"labels"`
	Withheld   bool            `json:"withheld,omitempty" yaml:"withheld,omitempty"`
}

func (i Identity) encoding() identityEncoding {
	return identityEncoding{ID: i.ID, References: i.References(), Labels: i.Labels, Withheld: i.Withheld()}
}

func (i *Identity) decode(e identityEncoding) error {
	if e.References > maxReferences {
		return fmt.Errorf("identity %d: %d references: %w", e.ID, e.References, ErrTooManyReferences)
	}
	*i = Identity{ID: e.ID, Labels: e.Labels, refs: e.References}
	i.setWithheld(e.Withheld)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (i Identity) MarshalJSON() ([]byte, error) { return json.Marshal(i.encoding()) }

// UnmarshalJSON implements json.Unmarshaler.
//
// Possible errors: those of encoding/json, ErrTooManyReferences (wrapped).
func (i *Identity) UnmarshalJSON(data []byte) error {
	var e identityEncoding
	if err := json.Unmarshal(data, &e); err != nil {
		return err
	}
	return i.decode(e)
}

// MarshalYAML implements yaml.Marshaler (go.yaml.in/yaml/v3).
func (i Identity) MarshalYAML() (any, error) { return i.encoding(), nil }

// UnmarshalYAML implements yaml.v3's obsolete, still supported
// Unmarshaler, which needs no import of the YAML package here.
//
// Possible errors: those of the YAML decoder, ErrTooManyReferences
// (wrapped).
func (i *Identity) UnmarshalYAML(unmarshal func(any) error) error {
	var e identityEncoding
	if err := unmarshal(&e); err != nil {
		return err
	}
	return i.decode(e)
}

// TableHeader implements statedb.TableWritable.
func (*Identity) TableHeader() []string { return []string{"ID", "Labels", "References", "Withheld"} }

// TableRow implements statedb.TableWritable.
func (i *Identity) TableRow() []string {
	withheld := ""
	if i.Withheld() {
		withheld = "withheld"
	}
	return []string{i.ID.String(), i.Labels.String(), strconv.FormatUint(uint64(i.References()), 10), withheld}
}

var _ statedb.TableWritable = &Identity{}

// IdentitiesTableName is the name of the `identities` table.
const IdentitiesTableName = "identities"

// IdentityIndex is the primary index of the `identities` table, ordered by
// number.
var IdentityIndex = statedb.Index[*Identity, identity.Number]{
	Name: "id",
	FromObject: func(i *Identity) index.KeySet {
		return index.NewKeySet(index.Uint32(uint32(i.ID)))
	},
	FromKey: numberQueryKey,
	FromString: func(s string) (index.Key, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("identity %q: %w", s, err)
		}
		return index.Uint32(uint32(n)), nil
	},
	Unique: true,
}

// LabelsIndex finds the identity of a label set, and the identities with a
// cidr prefix inside a CIDR (IdentitiesWithin). It is unique: a label set
// has at most one identity. Only rows with references are in it (the
// allocator writes no other).
//
// A label set's keys are, for each of its cidr prefixes, the prefix's key
// (package prefixkey) followed by the labels' canonical form (nothing when
// the set is that cidr label alone); a set without cidr labels has one
// key, a zero byte and the canonical form.
// Querying by labels looks up the first key. The identities whose cidr
// prefixes lie inside a CIDR are then one range of keys, so the policy
// selectors need no index of their own, which would cost much more per
// identity than the prefix in this key (docs/SCALE.md).
var LabelsIndex = statedb.Index[*Identity, labels.Labels]{
	Name: "labels",
	FromObject: func(i *Identity) index.KeySet {
		if !i.Allocated() {
			return index.EmptyKeySet
		}
		return labelsKeys(i.Labels)
	},
	FromKey: firstLabelsKey,
	FromString: func(s string) (index.Key, error) {
		l, err := labels.Parse(s)
		if err != nil {
			return nil, err
		}
		return firstLabelsKey(l), nil
	},
	Unique: true,
}

// noPrefixKey starts the key of a label set without cidr labels; prefix
// keys start with the family (4 or 6).
const noPrefixKey = 0

// labelsKey is the key of l under one of its cidr prefixes (or, invalid,
// none). A set that is the prefix's cidr label alone, a CIDR identity's,
// is the prefix key alone: the labels would repeat what the key says, and
// there is one such identity per prefix in the ipcache (docs/SCALE.md).
// Every other set's key is longer than its prefix key (the labels are
// never empty), so no two sets share a key.
func labelsKey(prefix netip.Prefix, l labels.Labels) index.Key {
	if !prefix.IsValid() {
		return append(append(make(index.Key, 0, 1+len(l.String())), noPrefixKey), l.String()...)
	}
	if key := l.PrefixKey(); key != "" {
		// The set holds its prefix's key already: the table keeps the key
		// as long as the row, which keeps the set, and never writes to it,
		// so the two share the bytes instead of an allocation per prefix.
		return unsafe.Slice(unsafe.StringData(key), len(key))
	}
	key := make(index.Key, 0, prefixkey.Len(prefix)+len(l.String()))
	return append(prefixkey.Append(key, prefix), l.String()...)
}

// numberQueryKey is index.Uint32's key in a block of its own. A query's
// key is garbage at once; in the 4 bytes it needs, the runtime's tiny
// allocator packs it into a 16-byte block with the small keys the tables
// keep (rows' number and revision keys, allocated in the same rounds), and
// a block is freed only when all it holds is: the allocator's queries
// would cost the heap about 8 bytes a row (docs/SCALE.md).
func numberQueryKey(id identity.Number) index.Key {
	return binary.BigEndian.AppendUint32(make(index.Key, 0, 16), uint32(id))
}

func firstLabelsKey(l labels.Labels) index.Key {
	for prefix := range l.Prefixes() {
		return labelsKey(prefix, l)
	}
	return labelsKey(netip.Prefix{}, l)
}

func labelsKeys(l labels.Labels) index.KeySet {
	var first index.Key
	var more []index.Key
	for prefix := range l.Prefixes() {
		if key := labelsKey(prefix, l); first == nil {
			first = key
		} else {
			more = append(more, key)
		}
	}
	if first == nil {
		first = labelsKey(netip.Prefix{}, l)
	}
	return index.NewKeySet(first, more...)
}

// IdentitiesWithin returns the identities with a cidr prefix inside cidr
// (cidr itself included); one with several such prefixes comes once per
// prefix. cidr must be masked.
func IdentitiesWithin(txn statedb.ReadTxn, identities statedb.Table[*Identity], cidr netip.Prefix) iter.Seq[*Identity] {
	return func(yield func(*Identity) bool) {
		var one [1]netip.Prefix // a prefix's own identity's, most of them
		for ident := range identities.LowerBound(txn, LabelsIndex.QueryFromKey(prefixkey.RangeStart(cidr))) {
			// The key that found the identity is one of its prefixes': if
			// none is in the CIDR's range, that key is past the range.
			inRange, inside := false, false
			for _, prefix := range ident.Labels.AppendPrefixes(one[:0]) {
				inRange = inRange || prefixkey.InRange(cidr, prefix)
				inside = inside || prefixkey.Inside(cidr, prefix)
			}
			if !inRange {
				return
			}
			if inside && !yield(ident) {
				return
			}
		}
	}
}

// NewIdentitiesTable creates and registers the `identities` table. Only the
// allocator writes it.
//
// Possible errors: those of statedb.NewTable (a table of that name is
// registered already, for one).
func NewIdentitiesTable(db *statedb.DB) (statedb.RWTable[*Identity], error) {
	return statedb.NewTable(db, IdentitiesTableName, IdentityIndex, LabelsIndex)
}
