// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// There is a metadata row and an entry per prefix: at a million prefixes,
// each byte of them is a megabyte (cmd/bench-scale, heap per prefix).
// A field added in the wrong place grows them by a whole size class.
func TestRowSizes(t *testing.T) {
	require.EqualValues(t, 32, unsafe.Sizeof(Entry{}), "Entry")
	require.EqualValues(t, 64, unsafe.Sizeof(PrefixMetadata{}), "PrefixMetadata")
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
			&owner{resource: "policy/a", source: source.Directory, id: 3},
			Metadata{Labels: appLabels, RequestedIdentity: 16777217, ExplicitIdentity: 5}),
		json: `{"prefix":"10.0.0.0/8","resource":"policy/a","source":"directory","labels":"app:x",` +
			`"requestedIdentity":16777217,"explicitIdentity":5}`,
		yaml:  "prefix: 10.0.0.0/8\nresource: policy/a\nsource: directory\nlabels: app:x\nrequestedIdentity: 16777217\nexplicitIdentity: 5\n",
		table: []string{"10.0.0.0/8", "policy/a", "directory", "app:x", "16777217", "5"},
	}, {
		row:   newPrefixMetadata(netip.MustParsePrefix("2001:db8::/32"), &owner{resource: "r", source: source.Local}, Metadata{}),
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
