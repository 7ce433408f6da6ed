package ipcachecell

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// There is a metadata row and an entry per prefix: at a million prefixes,
// each byte of them is a megabyte (internal/benchscale, heap per prefix).
// A field added in the wrong place grows them by a whole size class.
func TestRowSizes(t *testing.T) {
	require.EqualValues(t, 64, unsafe.Sizeof(Entry{}), "Entry")
	require.EqualValues(t, 80, unsafe.Sizeof(PrefixMetadata{}), "PrefixMetadata")
}
