// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// There is an identity per CIDR prefix: at a million prefixes each byte of
// the row is a megabyte. The number, the labels and the word holding the
// count and the withheld flag take 24 bytes, a size class of its own; a
// field more would take 32.
func TestRowSize(t *testing.T) {
	require.EqualValues(t, 24, unsafe.Sizeof(Identity{}))
}
