// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// There is an identity per CIDR prefix: at a million prefixes each byte of
// the row is a megabyte. The two numbers, the labels and the withheld flag
// take 32 bytes; a field more would take 40.
func TestRowSize(t *testing.T) {
	require.EqualValues(t, 32, unsafe.Sizeof(Identity{}))
}
