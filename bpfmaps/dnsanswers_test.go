// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
)

func TestDecodeDNSAnswer(t *testing.T) {
	raw := make([]byte, DNSAnswerRecordSize)
	raw[0] = familyIPv4
	raw[4] = 2 // length 2, native endian on the little-endian targets
	copy(raw[16:], []byte{10, 0, 0, 1})
	copy(raw[32:], []byte{10, 0, 0, 53})
	raw[48], raw[49], raw[50] = 0xab, 0xcd, 0xef
	got, err := DecodeDNSAnswer(raw)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("10.0.0.1"), got.Endpoint)
	require.Equal(t, netip.MustParseAddr("10.0.0.53"), got.Server)
	require.Equal(t, []byte{0xab, 0xcd}, got.Payload, "length bytes only")
	require.False(t, got.Truncated())
	got.Payload[0] = 0
	require.Equal(t, byte(0xab), raw[48], "a copy")

	_, err = DecodeDNSAnswer(raw[:DNSAnswerRecordSize-1])
	require.ErrorIs(t, err, ErrBadDNSAnswer)
	raw[0] = 3
	_, err = DecodeDNSAnswer(raw)
	require.ErrorIs(t, err, ErrBadDNSAnswer)
}

// Open creates and pins the dns-answers ring and its lost counter, a
// restart reuses the same maps (the ring's unread records with them:
// datapathcell's TestPrivilegedDNSAnswersPinnedAcrossReaders), a pinned
// ring of another size is replaced, and Cleanup removes both.
func TestPrivilegedDNSAnswersPinned(t *testing.T) {
	privileged.Test(t)
	root := t.TempDir()
	_, err := EnsureBPFFS(root)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	dir := PinDir(root)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sizes := Sizes{IPCache: 16, Policy: 16, Conntrack: 16, ConntrackOpening: 16}
	id := func(m *ebpf.Map) ebpf.MapID {
		t.Helper()
		info, err := m.Info()
		require.NoError(t, err)
		id, ok := info.ID()
		require.True(t, ok)
		return id
	}

	maps, err := Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.Equal(t, ebpf.RingBuf, maps.DNSAnswers.Type())
	require.EqualValues(t, DNSAnswersRingBytes, maps.DNSAnswers.MaxEntries())
	lost, err := ReadDNSAnswersLost(maps.DNSAnswersLost)
	require.NoError(t, err)
	require.Zero(t, lost)
	ringID, lostID := id(maps.DNSAnswers), id(maps.DNSAnswersLost)
	require.NoError(t, maps.Close())

	maps, err = Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.Equal(t, ringID, id(maps.DNSAnswers), "the same ring across a restart")
	require.Equal(t, lostID, id(maps.DNSAnswersLost))
	require.NoError(t, maps.Close())

	// A ring of another size (another version's) cannot be migrated.
	path := filepath.Join(dir, DNSAnswersName)
	require.NoError(t, os.Remove(path))
	small := DNSAnswersSpec()
	small.MaxEntries = 1 << 16
	m, err := ebpf.NewMap(small)
	require.NoError(t, err)
	require.NoError(t, m.Pin(path))
	require.NoError(t, m.Close())
	maps, err = Open(dir, sizes, nil, log)
	require.NoError(t, err)
	require.EqualValues(t, DNSAnswersRingBytes, maps.DNSAnswers.MaxEntries(), "replaced")
	require.NoError(t, maps.Close())

	removed, err := Cleanup(root)
	require.NoError(t, err)
	require.Contains(t, removed.Maps, DNSAnswersName)
	require.Contains(t, removed.Maps, DNSAnswersLostName)
	for _, name := range []string{DNSAnswersName, DNSAnswersLostName} {
		_, err = os.Stat(filepath.Join(dir, name))
		require.ErrorIs(t, err, os.ErrNotExist)
	}
}
