// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// There is an identity per CIDR prefix: at a million prefixes each byte of
// the row is a megabyte. Numbers side by side keep it at 24 bytes.
func TestRowSize(t *testing.T) {
	require.EqualValues(t, 24, unsafe.Sizeof(Identity{}))
}
