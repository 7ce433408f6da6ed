// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"net/netip"
	"testing"
)

// netipPrefix returns a distinct /32 for a number, so tests can build
// distinct label sets from numbers.
func netipPrefix(tb testing.TB, n NumericIdentity) netip.Prefix {
	tb.Helper()
	return netip.MustParsePrefix(fmt.Sprintf("%d.%d.%d.%d/32", byte(n>>24), byte(n>>16), byte(n>>8), byte(n)))
}
