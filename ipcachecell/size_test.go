// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// There is a metadata row and an entry per prefix: at a million prefixes,
// each byte of them is a megabyte (cmd/bench-scale, heap per prefix).
// A field added in the wrong place grows them by a whole size class.
func TestRowSizes(t *testing.T) {
	require.EqualValues(t, 32, unsafe.Sizeof(Entry{}), "Entry")
	require.EqualValues(t, 48, unsafe.Sizeof(PrefixMetadata{}), "PrefixMetadata")
}

// The entry reads in JSON and YAML (the shell's db/show -format) with its
// fields and no status (the datapath's writer keeps it).
func TestEntryEncodings(t *testing.T) {
	e := NewEntry(netip.MustParsePrefix("10.0.0.0/8"), 16777217, source.Local)
	out, err := json.Marshal(e)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, "10.0.0.0/8", back["prefix"])
	require.EqualValues(t, 16777217, back["identity"])
	require.Equal(t, "local", back["source"])
	require.NotContains(t, back, "status")

	y, err := yaml.Marshal(e)
	require.NoError(t, err)
	require.Contains(t, string(y), "source: local")
	require.NotContains(t, string(y), "status")
}

// A metadata row reads in JSON and YAML as it did when it held its
// resource and source itself (they are its owner's now): the fields, their
// names and order, and what is left out when unset. YAML leaves the labels
// out, as it did before (yaml sees no exported field in labels.Labels).
func TestPrefixMetadataEncodings(t *testing.T) {
	appLabels, err := labels.New("app:x")
	require.NoError(t, err)
	for _, tc := range []struct {
		row        *PrefixMetadata
		json, yaml string
		table      []string
	}{{
		row: newPrefixMetadata(netip.MustParsePrefix("10.0.0.0/8"),
			&owner{resource: "policy/a", source: source.Directory, id: 3}, &appLabels, 16777217, 5),
		json: `{"prefix":"10.0.0.0/8","resource":"policy/a","source":"directory","labels":"app:x",` +
			`"requestedIdentity":16777217,"explicitIdentity":5}`,
		yaml:  "prefix: 10.0.0.0/8\nresource: policy/a\nsource: directory\nlabels: app:x\nrequestedIdentity: 16777217\nexplicitIdentity: 5\n",
		table: []string{"10.0.0.0/8", "policy/a", "directory", "app:x", "16777217", "5"},
	}, {
		row:   newPrefixMetadata(netip.MustParsePrefix("2001:db8::/32"), &owner{resource: "r", source: source.Local}, nil, 0, 0),
		json:  `{"prefix":"2001:db8::/32","resource":"r","source":"local","labels":""}`,
		yaml:  "prefix: 2001:db8::/32\nresource: r\nsource: local\n",
		table: []string{"2001:db8::/32", "r", "local", "", "", ""},
	}} {
		out, err := json.Marshal(tc.row)
		require.NoError(t, err)
		require.Equal(t, tc.json, string(out))
		out, err = json.Marshal([]PrefixMetadata{*tc.row}) // not through a pointer
		require.NoError(t, err)
		require.Equal(t, "["+tc.json+"]", string(out))

		out, err = yaml.Marshal(tc.row)
		require.NoError(t, err)
		require.Equal(t, tc.yaml, string(out))
		out, err = yaml.Marshal([]any{tc.row})
		require.NoError(t, err)
		require.Equal(t, "- "+strings.ReplaceAll(strings.TrimSuffix(tc.yaml, "\n"), "\n", "\n  ")+"\n", string(out))

		require.Equal(t, []string{"Prefix", "Resource", "Source", "Labels", "Requested", "Explicit"}, tc.row.TableHeader())
		require.Equal(t, tc.table, tc.row.TableRow())

		// Decoding what was shown gives no row: a row without its handle's
		// owner would have no key (db/insert must fail, not panic).
		var back PrefixMetadata
		require.ErrorIs(t, json.Unmarshal([]byte(tc.json), &back), ErrRowNotDecodable)
		require.ErrorIs(t, yaml.Unmarshal([]byte(tc.yaml), &back), ErrRowNotDecodable)
	}
}

// An entry reads in JSON and YAML as it did when its prefix was a field
// of its own, and decodes back to the same row; the zero entry's prefix is
// the invalid prefix, as netip.Prefix's zero value is.
func TestEntryEncodingsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		entry      *Entry
		json, yaml string
	}{{
		entry: NewEntry(netip.MustParsePrefix("10.0.0.0/8"), 16777217, source.Local),
		json:  `{"prefix":"10.0.0.0/8","identity":16777217,"source":"local"}`,
		yaml:  "prefix: 10.0.0.0/8\nidentity: 16777217\nsource: local\n",
	}, {
		entry: func() *Entry {
			e := NewEntry(netip.MustParsePrefix("2001:db8::/32"), 300, source.Directory)
			e.Explicit = true
			return e
		}(),
		json: `{"prefix":"2001:db8::/32","identity":300,"source":"directory","explicit":true}`,
		yaml: "prefix: 2001:db8::/32\nidentity: 300\nsource: directory\nexplicit: true\n",
	}, {
		entry: NewEntry(netip.MustParsePrefix("::ffff:10.0.0.0/104"), 7, source.Local),
		json:  `{"prefix":"::ffff:10.0.0.0/104","identity":7,"source":"local"}`,
		yaml:  "prefix: ::ffff:10.0.0.0/104\nidentity: 7\nsource: local\n",
	}} {
		out, err := json.Marshal(tc.entry)
		require.NoError(t, err)
		require.Equal(t, tc.json, string(out))
		out, err = yaml.Marshal(tc.entry)
		require.NoError(t, err)
		require.Equal(t, tc.yaml, string(out))

		var fromJSON, fromYAML Entry
		require.NoError(t, json.Unmarshal([]byte(tc.json), &fromJSON))
		require.Equal(t, *tc.entry, fromJSON)
		require.NoError(t, yaml.Unmarshal([]byte(tc.yaml), &fromYAML))
		require.Equal(t, *tc.entry, fromYAML)
		require.Equal(t, tc.entry.Prefix(), fromJSON.Prefix())
	}
	require.False(t, (&Entry{}).Prefix().IsValid())
	require.Equal(t, netip.MustParsePrefix("192.0.2.1/32"), NewEntry(netip.MustParsePrefix("192.0.2.1/32"), 1, 0).Prefix())
}

// The rows of a batch with equal labels share one label set, and rows
// without labels hold none, which is what keeps the row in its size
// class; what each row says is still its own.
func TestBatchRowsShareLabels(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	app, err := labels.New("app:x")
	require.NoError(t, err)
	var batch []PrefixUpsert
	want := map[netip.Prefix]Metadata{}
	// More distinct label sets than are shared: those past the bound get
	// a label set of their own per row, which must read the same.
	for i := range 4 * maxSharedLabels {
		md := Metadata{RequestedIdentity: identity.MinLocal + identity.Number(i)}
		switch i % 3 {
		case 1:
			md.Labels = app
		case 2:
			md.Labels, err = labels.New(fmt.Sprintf("n:%d", i))
			require.NoError(t, err)
		}
		prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24)
		batch = append(batch, PrefixUpsert{Prefix: prefix, Metadata: md})
		want[prefix] = md
	}
	require.NoError(t, h.UpsertBatch(batch))

	var appRow *labels.Labels
	txn := f.db.ReadTxn()
	require.Equal(t, len(want), f.metadata.NumObjects(txn))
	for row := range f.metadata.All(txn) {
		require.Equal(t, want[row.Prefix()], row.Metadata(), "prefix %s", row.Prefix())
		md := row.Metadata()
		switch {
		case md.Labels.IsEmpty():
			require.Nil(t, row.labels, "prefix %s", row.Prefix())
		case md.Labels == app:
			if appRow == nil {
				appRow = row.labels
			}
			require.Same(t, appRow, row.labels, "prefix %s", row.Prefix())
		}
	}
	require.NotNil(t, appRow)
}

// A resource's id takes at most maxResourceIDLen bytes of a row's key:
// the last id there is still makes rows that are found by their prefix,
// and once every id is live, a new handle is refused until one is
// released.
func TestResourceIDsBounded(t *testing.T) {
	f := newFixture(t)
	f.ipcache.nextID = maxResourceIDs - 1
	last, err := f.ipcache.NewHandle("last", source.Local)
	require.NoError(t, err)
	require.EqualValues(t, maxResourceIDs-1, last.owner.id)
	prefix := netip.MustParsePrefix("2001:db8::/128")
	require.NoError(t, last.Upsert(prefix, Metadata{ExplicitIdentity: 300}))
	rows := appendPrefixRows(nil, f.db.ReadTxn(), f.metadata, prefix)
	require.Len(t, rows, 1)
	require.Equal(t, prefix, rows[0].Prefix())
	require.Len(t, rows[0].rowKey(), maxMetadataKeyLen)
	require.Equal(t, Metadata{ExplicitIdentity: 300}, rows[0].Metadata())

	_, err = f.ipcache.NewHandle("one-too-many", source.Local)
	require.ErrorIs(t, err, ErrTooManyHandles)
	require.NoError(t, last.Release())
	again, err := f.ipcache.NewHandle("one-too-many", source.Local)
	require.NoError(t, err)
	require.EqualValues(t, maxResourceIDs-1, again.owner.id)
}

// A prefix new to the table gets an identity whose cidr label holds the
// entry's own key bytes (cidrLabels): no allocation of its own, and
// nothing kept that the table does not keep anyway. A prefix whose entry
// is replaced gets a label of its own: the replacement is not what the
// table keeps.
func TestNewPrefixLabelSharesItsEntry(t *testing.T) {
	f := newFixture(t)
	h, err := f.ipcache.NewHandle("test", source.Local)
	require.NoError(t, err)
	prefix := netip.MustParsePrefix("10.1.0.0/16")
	require.NoError(t, h.Upsert(prefix, Metadata{}))
	f.round(t)
	entry, _, ok := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(prefix))
	require.True(t, ok)
	l, ok := f.allocator.LabelsTxn(f.db.ReadTxn(), entry.Identity)
	require.True(t, ok)
	require.Equal(t, labels.ForPrefix(prefix), l)
	require.Same(t, &entry.prefix[0], unsafe.StringData(l.PrefixKey()), "the label is the entry's bytes")

	// Labels from another owner change the identity: its labels are not
	// the cidr label alone. Then they go, and the cidr label alone is
	// allocated again, for an entry that replaces one.
	other, err := f.ipcache.NewHandle("other", source.Local)
	require.NoError(t, err)
	app, err := labels.New("app:x")
	require.NoError(t, err)
	require.NoError(t, other.Upsert(prefix, Metadata{Labels: app}))
	f.round(t)
	require.NoError(t, other.Remove(prefix))
	f.round(t)
	replaced, _, ok := f.entries.Get(f.db.ReadTxn(), EntryIndex.Query(prefix))
	require.True(t, ok)
	require.NotEqual(t, entry.Identity, replaced.Identity)
	l, ok = f.allocator.LabelsTxn(f.db.ReadTxn(), replaced.Identity)
	require.True(t, ok)
	require.Equal(t, labels.ForPrefix(prefix), l)
	require.NotSame(t, &replaced.prefix[0], unsafe.StringData(l.PrefixKey()), "a replacement's label is its own")
}
