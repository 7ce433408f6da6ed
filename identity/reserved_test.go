// SPDX-License-Identifier: Apache-2.0

package identity

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReservedEntity: every reserved number names its entity, whose
// Reserved is the number back; world is 2; 0 and other numbers are none.
func TestReservedEntity(t *testing.T) {
	for _, n := range ReservedNumbers() {
		e, ok := n.ReservedEntity()
		require.True(t, ok, "%d", n)
		if n == World {
			require.Equal(t, EntityWorld, e)
			continue
		}
		back, ok := e.Reserved()
		require.True(t, ok, "%s", e)
		require.Equal(t, n, back)
	}
	require.Len(t, ReservedNumbers(), 8)
	for _, n := range []Number{Unknown, 9, MinCluster, MinLocal} {
		_, ok := n.ReservedEntity()
		require.False(t, ok, "%d", n)
	}
}
