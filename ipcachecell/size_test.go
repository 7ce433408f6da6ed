// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/cilium/statedb/reconciler"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/source"
)

// There is a metadata row and an entry per prefix: at a million prefixes,
// each byte of them is a megabyte (cmd/bench-scale, heap per prefix).
// A field added in the wrong place grows them by a whole size class.
func TestRowSizes(t *testing.T) {
	require.EqualValues(t, 64, unsafe.Sizeof(Entry{}), "Entry")
	require.EqualValues(t, 80, unsafe.Sizeof(PrefixMetadata{}), "PrefixMetadata")
}

// The compact entry reads in JSON and YAML (the shell's db/show -format)
// with its status, as reconciler.Status reads.
func TestEntryEncodings(t *testing.T) {
	e := (&Entry{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Identity: 16777217, Source: source.Local}).
		SetStatus(reconciler.StatusError(errors.New("map full")))
	out, err := json.Marshal(e)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, "10.0.0.0/8", back["prefix"])
	require.EqualValues(t, 16777217, back["identity"])
	require.Equal(t, "local", back["source"])
	status := back["status"].(map[string]any)
	require.Equal(t, "Error", status["kind"])
	require.Equal(t, "map full", status["error"])

	y, err := yaml.Marshal(e)
	require.NoError(t, err)
	require.Contains(t, string(y), "source: local")
	require.Contains(t, string(y), "kind: Error")
	require.Equal(t, reconciler.StatusKindError, e.GetStatus().Kind)
	require.Equal(t, "map full", e.GetStatus().GetError())
}
