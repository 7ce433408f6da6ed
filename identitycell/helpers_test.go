// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// netipPrefix returns a distinct /32 for a number, so tests can build
// distinct label sets from numbers.
func netipPrefix(tb testing.TB, n identity.Number) netip.Prefix {
	tb.Helper()
	return netip.MustParsePrefix(fmt.Sprintf("%d.%d.%d.%d/32", byte(n>>24), byte(n>>16), byte(n>>8), byte(n)))
}

// previous returns what a started Checkpointer read, failing the test if
// its decoding does not end.
func previous(tb testing.TB, c *Checkpointer) Checkpoint {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checkpoint, err := c.Previous(ctx)
	require.NoError(tb, err)
	return checkpoint
}
