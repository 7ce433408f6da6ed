package source

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPrecedenceIsCiliumsOrder(t *testing.T) {
	for i := range len(byPrecedence) - 1 {
		higher, lower := byPrecedence[i], byPrecedence[i+1]
		require.True(t, higher.Overrides(lower), "%s over %s", higher, lower)
		require.False(t, lower.Overrides(higher), "%s over %s", lower, higher)
	}
	require.True(t, KubeAPIServer.Overrides(Unspec))
	require.True(t, Directory.Overrides(Restored))
	require.False(t, Directory.Overrides(Directory))
}

func TestParse(t *testing.T) {
	s, err := Parse("directory")
	require.NoError(t, err)
	require.Equal(t, Directory, s)
	_, err = Parse("nowhere")
	require.ErrorIs(t, err, ErrUnknownSource)
	require.ErrorContains(t, err, "restored")
}
