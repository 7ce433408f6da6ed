// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func gcPercent() int {
	p := debug.SetGCPercent(defaultGCPercent)
	debug.SetGCPercent(p)
	return p
}

// The start raises GOGC until its end, once; GOGC in the environment is
// left alone.
func TestStartGC(t *testing.T) {
	t.Setenv("GOGC", "")
	require.NoError(t, os.Unsetenv("GOGC"))
	defer debug.SetGCPercent(debug.SetGCPercent(defaultGCPercent))

	var g startGC
	g.raise()
	require.Equal(t, startGCPercent, gcPercent())
	g.end()
	require.Equal(t, defaultGCPercent, gcPercent())
	debug.SetGCPercent(70) // someone else's, later
	g.end()
	require.Equal(t, 70, gcPercent(), "ended once")

	t.Setenv("GOGC", "70")
	var operator startGC
	operator.raise()
	require.Equal(t, 70, gcPercent(), "GOGC set: not raised")
	operator.end()
	require.Equal(t, 70, gcPercent())
}
