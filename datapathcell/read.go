package datapathcell

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// ReadPinnedIPCache reads the ipcache map pinned under bpfRoot: prefix ->
// identity. It is for tools and tests that inspect what the datapath
// enforces; entries whose key is not in canonical form are skipped.
//
// Possible errors: no map pinned there, or no permission.
func ReadPinnedIPCache(bpfRoot string) (map[netip.Prefix]uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir(bpfRoot), IPCacheMapName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned ipcache map: %w", err)
	}
	defer m.Close()
	return dumpIPCache(m, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// ReadPinnedPolicy reads the policy map pinned under bpfRoot: key ->
// verdict.
//
// Possible errors: no map pinned there, or no permission.
func ReadPinnedPolicy(bpfRoot string) (map[PolicyKey]uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir(bpfRoot), PolicyMapName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned policy map: %w", err)
	}
	defer m.Close()
	out := map[PolicyKey]uint32{}
	var (
		k PolicyKey
		v PolicyValue
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v.Verdict()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read pinned policy map: %w", err)
	}
	return out, nil
}
