// SPDX-License-Identifier: Apache-2.0

package datapathcell_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell"
)

// SetDNSProxyPort writes the pinned dns-proxy map, whose port stays there
// while the agent is stopped and after a restart, until an agent writes
// its own; the maps are not open after stop.
func TestPrivilegedDNSProxyPortAcrossRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pinnedPort := func() uint16 {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(e.pinPath(bpfmaps.DNSProxyName), nil)
		require.NoError(t, err)
		defer m.Close()
		var v bpfmaps.DNSProxyValue
		require.NoError(t, m.Lookup(uint32(0), &v))
		return v.Port()
	}

	a, _ := e.start(t, "")
	require.Zero(t, pinnedPort(), "a new map: no proxy")
	require.NoError(t, a.datapath.SetDNSProxyPort(40053))
	require.Equal(t, uint16(40053), pinnedPort())
	a.stop()
	require.ErrorIs(t, a.datapath.SetDNSProxyPort(1), datapathcell.ErrMapsNotOpen)
	require.Equal(t, uint16(40053), pinnedPort(), "kept while the agent is stopped")

	b, _ := e.start(t, "")
	require.Equal(t, uint16(40053), pinnedPort(), "kept across the restart")
	require.NoError(t, b.datapath.SetDNSProxyPort(0))
	require.Zero(t, pinnedPort())
}

// DNSAnswers and DNSAnswersLost hand out the pinned ring and its lost
// count while the maps are open; the ring stays pinned when the agent
// stops.
func TestPrivilegedDNSAnswersAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, _ := e.start(t, "")
	ring, err := a.datapath.DNSAnswers()
	require.NoError(t, err)
	require.Equal(t, ebpf.RingBuf, ring.Type())
	require.EqualValues(t, bpfmaps.DNSAnswersRingBytes, ring.MaxEntries())
	lost, err := a.datapath.DNSAnswersLost()
	require.NoError(t, err)
	require.Zero(t, lost)
	a.stop()
	_, err = a.datapath.DNSAnswers()
	require.ErrorIs(t, err, datapathcell.ErrMapsNotOpen)
	_, err = a.datapath.DNSAnswersLost()
	require.ErrorIs(t, err, datapathcell.ErrMapsNotOpen)
	for _, name := range []string{bpfmaps.DNSAnswersName, bpfmaps.DNSAnswersLostName} {
		m, err := ebpf.LoadPinnedMap(e.pinPath(name), nil)
		require.NoError(t, err, "%s kept while the agent is stopped", name)
		m.Close()
	}
}
