// SPDX-License-Identifier: Apache-2.0

package source

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPrecedenceIsCiliumsOrder(t *testing.T) {
	order := []string{"kube-apiserver", "local", "kvstore", "custom-resource", "k8s", "clustermesh",
		"directory", "api", "generated", "restored", "unspec"}
	var sources []Source
	for _, name := range order {
		s, err := Parse(name)
		require.NoError(t, err)
		require.Equal(t, name, s.String())
		sources = append(sources, s)
	}
	for i := range len(sources) - 1 {
		higher, lower := sources[i], sources[i+1]
		require.True(t, higher.Overrides(lower), "%s over %s", higher, lower)
		require.False(t, lower.Overrides(higher), "%s over %s", lower, higher)
	}
	require.True(t, KubeAPIServer.Overrides(Unspec))
	require.True(t, Directory.Overrides(Restored))
	require.False(t, Directory.Overrides(Directory))
	require.True(t, Unspec.Overrides(0), "no source is below every source")
	require.False(t, Source(0).Overrides(Unspec))
	require.False(t, Source(200).Overrides(0))
}

func TestParse(t *testing.T) {
	s, err := Parse("directory")
	require.NoError(t, err)
	require.Equal(t, Directory, s)
	_, err = Parse("nowhere")
	require.ErrorIs(t, err, ErrUnknownSource)
	require.ErrorContains(t, err, "restored")
	_, err = Parse("")
	require.ErrorIs(t, err, ErrUnknownSource)
	require.False(t, Source(0).Valid())
	require.Equal(t, "source(0)", Source(0).String())
}

func TestTextForm(t *testing.T) {
	out, err := json.Marshal(map[string]Source{"source": Restored})
	require.NoError(t, err)
	require.JSONEq(t, `{"source":"restored"}`, string(out))
	var back map[string]Source
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, Restored, back["source"])
	require.ErrorIs(t, json.Unmarshal([]byte(`{"source":"nowhere"}`), &back), ErrUnknownSource)
	_, err = json.Marshal(Source(0))
	require.ErrorIs(t, err, ErrUnknownSource)
}
