// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"encoding/json"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/source"
)

// There is a metadata row and an entry per prefix: at a million prefixes,
// each byte of them is a megabyte (cmd/bench-scale, heap per prefix).
// A field added in the wrong place grows them by a whole size class.
func TestRowSizes(t *testing.T) {
	require.EqualValues(t, 48, unsafe.Sizeof(Entry{}), "Entry")
	require.EqualValues(t, 80, unsafe.Sizeof(PrefixMetadata{}), "PrefixMetadata")
}

// The entry reads in JSON and YAML (the shell's db/show -format) with its
// fields and no status (the datapath's writer keeps it).
func TestEntryEncodings(t *testing.T) {
	e := &Entry{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Identity: 16777217, Source: source.Local}
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
