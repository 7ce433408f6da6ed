// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"encoding/binary"
	"encoding/json"
	"iter"
	"net/netip"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

const (
	MetadataTableName = "ipcache-metadata"
	EntriesTableName  = "ipcache"
)

// Metadata is what one owner says about a prefix.
type Metadata struct {
	// Labels are merged with the other owners' labels and the prefix's own
	// cidr label into the label set that determines the prefix's identity.
	Labels labels.Labels `json:"labels,omitempty" yaml:"labels,omitempty"`

	// RequestedIdentity is the number wanted if an identity has to be
	// allocated (a producer keeping numbers across restarts asks for the old
	// one). Zero: no preference.
	RequestedIdentity identity.Number `json:"requestedIdentity,omitempty" yaml:"requestedIdentity,omitempty"`

	// ExplicitIdentity is an identity allocated elsewhere; if set, the
	// prefix maps to it and the ipcache takes no reference. Zero: none.
	ExplicitIdentity identity.Number `json:"explicitIdentity,omitempty" yaml:"explicitIdentity,omitempty"`
}

// PrefixMetadata is a row of the `ipcache-metadata` table: the metadata of
// one resource for one prefix. Rows are written by handles only.
//
// There is a row per prefix and owner, so its size counts (TestRowSizes
// keeps it): what all rows of one handle share (the resource, its source)
// is one pointer to the handle's owner, not a copy in every row. The row
// holds its prefix as its key in the table (metadataKey), which the
// table's index shares instead of a copy per row; Prefix returns it. Its
// labels are a pointer that the rows of one batch with equal labels share
// (nil for none): most owners give all their prefixes the same labels,
// often none, and a label set held in every row would take the row to the
// next size class. The identity numbers are held in the row: restore's
// rows each request their own.
type PrefixMetadata struct {
	owner     *owner
	labels    *labels.Labels
	requested identity.Number
	explicit  identity.Number
	key       [maxMetadataKeyLen]byte
}

// maxResourceIDLen is the length of the longest resource id in a row's key
// (a uvarint of at most 35 bits): what bounds the live handles of an
// IPCache (see maxResourceIDs), and keeps the row in its size class.
const maxResourceIDLen = 5

// maxResourceIDs is the number of resource ids there are. Ids are reused
// (IPCache.freeIDs), so running out of them means that many live handles.
const maxResourceIDs = 1 << (7 * maxResourceIDLen)

// maxMetadataKeyLen is the length of the longest metadataKey.
const maxMetadataKeyLen = prefixkey.MaxLen + maxResourceIDLen

// newPrefixMetadata returns the row of owner's metadata for prefix, which
// must be valid and masked; lbls is nil for no labels, and must not change
// once the row is written.
func newPrefixMetadata(prefix netip.Prefix, owner *owner, lbls *labels.Labels, requested, explicit identity.Number) *PrefixMetadata {
	m := &PrefixMetadata{owner: owner, labels: lbls, requested: requested, explicit: explicit}
	metadataKey(m.key[:0], prefix, owner.id)
	return m
}

// Prefix returns the prefix the metadata is for.
func (m *PrefixMetadata) Prefix() netip.Prefix {
	prefix, _ := prefixkey.Parse(m.key[:prefixkey.LenOf(m.key[0])])
	return prefix
}

// Metadata returns what the resource says of the prefix.
func (m *PrefixMetadata) Metadata() Metadata {
	return Metadata{Labels: m.rowLabels(), RequestedIdentity: m.requested, ExplicitIdentity: m.explicit}
}

// rowLabels returns the row's labels.
func (m *PrefixMetadata) rowLabels() labels.Labels {
	if m.labels == nil {
		return labels.Labels{}
	}
	return *m.labels
}

// rowKey returns the row's key in the table: its own bytes, which the
// table keeps as long as the row, and the row never changes once
// inserted.
func (m *PrefixMetadata) rowKey() index.Key {
	n := prefixkey.LenOf(m.key[0])
	_, idLen := binary.Uvarint(m.key[n:])
	return m.key[:n+idLen]
}

// sharedLabels hands out the label pointers of a batch's rows: one per
// distinct label set, up to maxSharedLabels of them (a batch of as many
// label sets as prefixes gets a pointer per row, as it would without),
// and nil for the empty set. It lives as long as the batch: nothing is
// kept between batches.
type sharedLabels map[labels.Labels]*labels.Labels

// maxSharedLabels bounds the label sets a sharedLabels keeps.
const maxSharedLabels = 64

func (s *sharedLabels) of(l labels.Labels) *labels.Labels {
	if l.IsEmpty() {
		return nil
	}
	if p, ok := (*s)[l]; ok {
		return p
	}
	p := &l
	if *s == nil {
		*s = sharedLabels{}
	}
	if len(*s) < maxSharedLabels {
		(*s)[l] = p
	}
	return p
}

// owner is what every row of one handle shares. It does not change: a
// resource's next handle with another source gets an owner of its own.
type owner struct {
	resource string
	source   source.Source
	// id is the resource's number in its IPCache, which the rows' keys
	// hold instead of the name (see metadataKey).
	id uint64
	// shared is the handle's SharedIdentity option.
	shared bool
}

// Resource returns the name of the resource whose metadata this is.
func (m *PrefixMetadata) Resource() string { return m.owner.resource }

// Source returns the source of the resource's metadata.
func (m *PrefixMetadata) Source() source.Source { return m.owner.source }

// prefixMetadataEncoding is a row as JSON and YAML show it: the owner's
// fields are the row's, as they were when every row held them.
type prefixMetadataEncoding struct {
	Prefix   netip.Prefix  `json:"prefix" yaml:"prefix"`
	Resource string        `json:"resource" yaml:"resource"`
	Source   source.Source `json:"source" yaml:"source"`
	Metadata `yaml:",inline"`
}

func (m PrefixMetadata) encoding() prefixMetadataEncoding {
	return prefixMetadataEncoding{Prefix: m.Prefix(), Resource: m.Resource(), Source: m.Source(), Metadata: m.Metadata()}
}

// MarshalJSON implements json.Marshaler (the shell's db/show -format json).
func (m PrefixMetadata) MarshalJSON() ([]byte, error) { return json.Marshal(m.encoding()) }

// MarshalYAML implements yaml.Marshaler (db/show -format yaml).
func (m PrefixMetadata) MarshalYAML() (any, error) { return m.encoding(), nil }

// UnmarshalJSON implements json.Unmarshaler: it refuses, since a row
// decoded would have no owner.
//
// Possible errors: ErrRowNotDecodable.
func (m *PrefixMetadata) UnmarshalJSON([]byte) error { return ErrRowNotDecodable }

// UnmarshalYAML implements yaml.v3's obsolete, still supported
// Unmarshaler (statedb's db/insert decodes with it): it refuses, as
// UnmarshalJSON does.
//
// Possible errors: ErrRowNotDecodable.
func (m *PrefixMetadata) UnmarshalYAML(func(any) error) error { return ErrRowNotDecodable }

// TableHeader implements statedb.TableWritable.
func (*PrefixMetadata) TableHeader() []string {
	return []string{"Prefix", "Resource", "Source", "Labels", "Requested", "Explicit"}
}

// TableRow implements statedb.TableWritable.
func (m *PrefixMetadata) TableRow() []string {
	return []string{m.Prefix().String(), m.Resource(), m.Source().String(), m.rowLabels().String(),
		optionalIdentity(m.requested), optionalIdentity(m.explicit)}
}

func optionalIdentity(id identity.Number) string {
	if id == identity.Unknown {
		return ""
	}
	return id.String()
}

// Entry is a row of the desired `ipcache` table: the identity a prefix
// resolved to. The identity's labels are in the `identities` table.
//
// There is an entry per prefix, so its size counts (TestRowSizes keeps
// it): no copy of the identity's labels, and no reconciliation status.
// The datapath's writer keeps whether an entry is in the BPF map by the
// entry's table revision (datapathcell's Datapath.IPCacheStatus), so that
// writing an entry to the map does not rewrite its row. Its prefix is
// held packed (Prefix returns it): a netip.Prefix alone takes 32 bytes,
// the whole row's size class.
//
// Its JSON and YAML are {prefix, identity, source, explicit (when set)}.
type Entry struct {
	prefix packedPrefix

	Source source.Source

	// Explicit is set when the identity was allocated elsewhere and the
	// ipcache holds no reference to it.
	Explicit bool

	Identity identity.Number

	// unchangedSince is, when this entry replaced one with the same
	// identity (only the source changed), that entry's revision; zero
	// otherwise. See IdentityUnchangedSince.
	unchangedSince statedb.Revision
}

// NewEntry returns the entry mapping prefix to id, from src. The prefix
// must be masked, as the table's keys are (a write with another is
// refused by nothing, but no query finds it).
func NewEntry(prefix netip.Prefix, id identity.Number, src source.Source) *Entry {
	return &Entry{prefix: pack(prefix), Identity: id, Source: src}
}

// Prefix returns the entry's prefix; the zero Entry's is invalid.
func (e *Entry) Prefix() netip.Prefix { return e.prefix.unpack() }

// entryEncoding is the JSON and YAML form of an entry, as it was when the
// prefix was a field: `db/show` and anything that decodes its output see
// the same rows.
type entryEncoding struct {
	Prefix   netip.Prefix    `json:"prefix" yaml:"prefix"`
	Identity identity.Number `json:"identity" yaml:"identity"`
	Source   source.Source   `json:"source" yaml:"source"`
	Explicit bool            `json:"explicit,omitempty" yaml:"explicit,omitempty"`
}

func (e Entry) encoding() entryEncoding {
	return entryEncoding{Prefix: e.prefix.unpack(), Identity: e.Identity, Source: e.Source, Explicit: e.Explicit}
}

func (e *Entry) decode(enc entryEncoding) {
	*e = Entry{prefix: pack(enc.Prefix), Identity: enc.Identity, Source: enc.Source, Explicit: enc.Explicit}
}

// MarshalJSON implements json.Marshaler.
func (e Entry) MarshalJSON() ([]byte, error) { return json.Marshal(e.encoding()) }

// UnmarshalJSON implements json.Unmarshaler.
//
// Possible errors: those of encoding/json.
func (e *Entry) UnmarshalJSON(data []byte) error {
	var enc entryEncoding
	if err := json.Unmarshal(data, &enc); err != nil {
		return err
	}
	e.decode(enc)
	return nil
}

// MarshalYAML implements yaml.Marshaler (go.yaml.in/yaml/v3).
func (e Entry) MarshalYAML() (any, error) { return e.encoding(), nil }

// UnmarshalYAML implements yaml.v3's obsolete, still supported
// Unmarshaler, which needs no import of the YAML package here.
//
// Possible errors: those of the YAML decoder.
func (e *Entry) UnmarshalYAML(unmarshal func(any) error) error {
	var enc entryEncoding
	if err := unmarshal(&enc); err != nil {
		return err
	}
	e.decode(enc)
	return nil
}

// TableHeader implements statedb.TableWritable.
func (*Entry) TableHeader() []string {
	return []string{"Prefix", "Identity", "Source", "Explicit"}
}

// TableRow implements statedb.TableWritable.
func (e *Entry) TableRow() []string {
	return []string{e.Prefix().String(), e.Identity.String(), e.Source.String(), strconv.FormatBool(e.Explicit)}
}

// IdentityUnchangedSince returns, if this entry replaced one with the
// same identity (an owner re-asserting a restored prefix changes only its
// source), the replaced entry's table revision; zero otherwise. The
// datapath maps a prefix to its identity alone: its writer need not write
// this entry if it wrote that revision.
func (e *Entry) IdentityUnchangedSince() statedb.Revision { return e.unchangedSince }

// sameMapping reports whether two entries say the same thing of their
// prefix.
func (e *Entry) sameMapping(other *Entry) bool {
	return e.prefix == other.prefix && e.Identity == other.Identity && e.Source == other.Source &&
		e.Explicit == other.Explicit
}

// ReconcilerTable is the `ipcache` table for the datapath's writer, which
// follows its changes (a change iterator needs a write transaction on the
// table to start). Nothing writes entries through it: they are the
// resolver's.
type ReconcilerTable struct {
	statedb.RWTable[*Entry]
}

var (
	_ statedb.TableWritable = &PrefixMetadata{}
	_ statedb.TableWritable = &Entry{}
)

// metadataKey appends the key of a row: the prefix key followed by the
// resource's id (a uvarint of at most maxResourceIDLen bytes;
// an IPv4 row's key fits in 8 bytes while fewer than 16384 resources have
// handles at once: ids are reused, see IPCache.freeIDs): the rows of one
// prefix are adjacent, and a prefix query on the prefix key finds them.
// Within a prefix, rows are in the order of their keys, not of resource
// names: what depends on an order among a prefix's rows (the merge's
// ties, the shell's owners) orders by name itself.
func metadataKey(dst []byte, prefix netip.Prefix, resourceID uint64) []byte {
	return binary.AppendUvarint(prefixkey.Append(dst, prefix), resourceID)
}

// MetadataIndex is the primary index of `ipcache-metadata`: (prefix,
// resource).
var MetadataIndex = statedb.Index[*PrefixMetadata, netip.Prefix]{
	Name: "prefix-resource",
	FromObject: func(m *PrefixMetadata) index.KeySet {
		return index.NewKeySet(m.rowKey())
	},
	// Querying by a prefix alone is a prefix search: every resource's row.
	FromKey:    prefixKey,
	FromString: prefixKeyFromString,
	Unique:     true,
}

// EntryIndex is the primary index of `ipcache`: the prefix.
var EntryIndex = statedb.Index[*Entry, netip.Prefix]{
	Name: "prefix",
	FromObject: func(e *Entry) index.KeySet {
		// The entry's own bytes (packedPrefix): the table keeps the key as
		// long as the row, which never changes once inserted.
		return index.NewKeySet(e.prefix.key())
	},
	FromKey:    prefixKey,
	FromString: prefixKeyFromString,
	Unique:     true,
}

// NewMetadataTable creates and registers `ipcache-metadata`.
//
// Possible errors: statedb.ErrDuplicateTable (db has a table of that
// name).
func NewMetadataTable(db *statedb.DB) (statedb.RWTable[*PrefixMetadata], error) {
	return statedb.NewTable(db, MetadataTableName, MetadataIndex)
}

// NewEntriesTable creates and registers the desired `ipcache` table.
//
// Possible errors: statedb.ErrDuplicateTable (db has a table of that
// name).
func NewEntriesTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	return statedb.NewTable(db, EntriesTableName, EntryIndex)
}

// EntriesWithin returns the entries whose prefix lies inside cidr, in
// address order.
func EntriesWithin(txn statedb.ReadTxn, entries statedb.Table[*Entry], cidr netip.Prefix) iter.Seq[*Entry] {
	return within(txn, entries, EntryIndex.QueryFromKey, (*Entry).Prefix, cidr)
}

// LookupAddress returns the entry of the longest prefix that contains addr.
func LookupAddress(txn statedb.ReadTxn, entries statedb.Table[*Entry], addr netip.Addr) (*Entry, bool) {
	addr = addr.WithZone("")
	return longestMatch(txn, entries, addr, addr.BitLen())
}

// LookupPrefix returns the entry of the longest prefix that contains all
// of prefix (prefix's own entry if it has one): the identity every
// address of prefix has, except those of narrower entries inside it
// (EntriesWithin).
func LookupPrefix(txn statedb.ReadTxn, entries statedb.Table[*Entry], prefix netip.Prefix) (*Entry, bool) {
	prefix = prefix.Masked()
	return longestMatch(txn, entries, prefix.Addr().WithZone(""), prefix.Bits())
}

// LookupCovering returns the entry of the longest prefix that strictly
// contains prefix: what a longest-prefix match of prefix's addresses finds
// once prefix's own entry is gone.
func LookupCovering(txn statedb.ReadTxn, entries statedb.Table[*Entry], prefix netip.Prefix) (*Entry, bool) {
	return longestMatch(txn, entries, prefix.Addr().WithZone(""), prefix.Bits()-1)
}

// longestMatch returns the entry of the longest prefix of at most bits
// that contains addr.
func longestMatch(txn statedb.ReadTxn, entries statedb.Table[*Entry], addr netip.Addr, bits int) (*Entry, bool) {
	for ; bits >= 0; bits-- {
		prefix, _ := addr.Prefix(bits)
		if entry, _, found := entries.Get(txn, EntryIndex.Query(prefix)); found {
			return entry, true
		}
	}
	return nil, false
}
