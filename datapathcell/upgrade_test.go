// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/netnstest"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/privileged"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// hashPolicyObject is the enforcement program as it was when the policy
// map was a hash with 8-byte keys (the committed object of that time).
var hashPolicyObject = filepath.Join("testdata", "enforce_hashpolicy_bpfel.o")

// TestPrivilegedUpgradeFromHashPolicyMap: an agent of the previous layout
// left its program attached, enforcing with a pinned hash policy map that
// allows the endpoint's echo requests (egress, any protocol) and nothing
// else; the new datapath starts over the same pins while a 1 ms ping runs.
// It converts the map before its program replaces the old one, so no probe
// is lost (the datapath alone, no reconciler: the converted entries are
// all the new program has), and the old map is freed once the old program
// is gone. Five rounds, each from a fresh old agent.
func TestPrivilegedUpgradeFromHashPolicyMap(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, "10.200.0.2")
	for round := range 5 {
		linksDir := newTestLinksDir(t)
		bpfRoot := filepath.Dir(filepath.Dir(linksDir))
		pinDir := bpfmaps.PinDir(bpfRoot)
		oldMapID := startHashPolicyAgent(t, nw, pinDir, linksDir)

		pinger := netnstest.StartPinger(t, nw.ep, "10.200.0.2", time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		cfg := DefaultConfig
		cfg.BPFRoot, cfg.Devices = bpfRoot, []string{nw.hostDevice}
		cfg.IPCacheMapMaxEntries, cfg.PolicyMapMaxEntries = 1024, 512
		d := newDatapath(cfg, hivetest.Logger(t))
		d.conntrack.MapMaxEntries = 4096
		require.NoError(t, inNetns(t, nw.host, func() error { return d.Start(context.Background()) }), "round %d", round)
		time.Sleep(200 * time.Millisecond)
		sent, answered, longestLoss := pinger.Stop()
		require.NoError(t, d.Stop(context.Background()))

		require.Greater(t, sent, 100, "round %d: probes sent across the switch", round)
		require.Equal(t, sent, answered, "round %d: no probe lost (longest loss %d)", round, longestLoss)
		t.Logf("round %d: %d probes 1 ms apart across the switch, %d answered", round, sent, answered)

		outer, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpfmaps.PolicyName), nil)
		require.NoError(t, err)
		require.Equal(t, ebpf.HashOfMaps, outer.Type(), "the pin is the new layout")
		m, err := bpfmaps.PolicyOf(outer, 0)
		outer.Close()
		require.NoError(t, err)
		require.Equal(t, ebpf.LPMTrie, m.Type(), "the default's map is an LPM trie")
		got := map[policy.Key]policy.Verdict{}
		require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.PolicyKey, v bpfmaps.PolicyValue) {
			key, err := k.Key()
			require.NoError(t, err)
			got[key] = policy.Verdict(v.Verdict())
		}))
		m.Close()
		require.Equal(t, map[policy.Key]policy.Verdict{
			{Identity: identity.World, Direction: policy.Egress}:                                                      policy.VerdictAllow,
			{Identity: identity.World, Direction: policy.Ingress, Protocol: policy.ProtocolTCP, PortWildcardBits: 16}: policy.VerdictAllow,
			{Identity: identity.World, Direction: policy.Ingress, Protocol: policy.ProtocolUDP, Port: 53}:             policy.VerdictAllow,
		}, got, "converted: any protocol, a protocol's every port, one port")

		// The old map is freed once nothing holds it: the old program went
		// at the switch, and the agent closed its descriptor.
		require.Eventually(t, func() bool {
			old, err := ebpf.NewMapFromID(oldMapID)
			if err == nil {
				old.Close()
			}
			return err != nil
		}, 10*time.Second, 10*time.Millisecond, "round %d: old policy map %d still exists", round, oldMapID)
		_, err = ebpf.NewMapFromID(oldMapID)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
}

// startHashPolicyAgent does what the previous agent left behind: its maps
// pinned in pinDir, the policy map a hash, and its program attached to the
// host device with links pinned in linksDir, enforcing both directions. It
// returns the ID of the hash policy map, of which it keeps no descriptor.
func startHashPolicyAgent(t *testing.T, nw *endpointNetwork, pinDir, linksDir string) ebpf.MapID {
	t.Helper()
	pinned := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(t, err, spec.Name)
		require.NoError(t, m.Pin(filepath.Join(pinDir, spec.Name)), spec.Name)
		return m
	}
	require.NoError(t, os.MkdirAll(pinDir, 0o700))
	maps := enforcerMaps{
		IPCache:     pinned(bpfmaps.IPCacheSpec(1024)),
		Policy:      pinned(hashPolicyMapSpec()),
		Enforcement: pinned(previousEnforcementMapSpec()),
		Counters:    pinned(previousCountersMapSpec()),
		Conntrack:   pinned(previousConntrackMapSpec(4096)),
		Revision:    pinned(bpfmaps.RevisionSpec()),
	}
	defer func() {
		for _, m := range []*ebpf.Map{maps.IPCache, maps.Policy, maps.Enforcement, maps.Counters, maps.Conntrack, maps.Revision} {
			m.Close()
		}
	}()
	allow := bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	world := uint32(identity.World)
	require.NoError(t, maps.Policy.Put(hashPolicyMapKey(world, uint8(policy.Egress), 0, 0), allow))
	require.NoError(t, maps.Policy.Put(hashPolicyMapKey(world, uint8(policy.Ingress), testProtoTCP, 0), allow))
	require.NoError(t, maps.Policy.Put(hashPolicyMapKey(world, uint8(policy.Ingress), testProtoUDP, 53), allow))
	// Never looked up by that program (protocol 0 with a port): not
	// converted.
	require.NoError(t, maps.Policy.Put(hashPolicyMapKey(world, uint8(policy.Ingress), 0, 80), allow))
	info, err := maps.Policy.Info()
	require.NoError(t, err)
	id, ok := info.ID()
	require.True(t, ok)

	spec, err := ebpf.LoadCollectionSpec(hashPolicyObject)
	require.NoError(t, err)
	require.Equal(t, ebpf.Hash, spec.Maps[bpfmaps.PolicyName].Type, "the fixture is of the previous layout")
	for name, m := range map[string]*ebpf.Map{bpfmaps.IPCacheName: maps.IPCache, bpfmaps.PolicyName: maps.Policy, bpfmaps.ConntrackName: maps.Conntrack} {
		spec.Maps[name].MaxEntries = m.MaxEntries()
	}
	var objs struct {
		FromEndpoint *ebpf.Program `ebpf:"enforce_from_endpoint"`
		ToEndpoint   *ebpf.Program `ebpf:"enforce_to_endpoint"`
	}
	require.NoError(t, spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		bpfmaps.IPCacheName: maps.IPCache, bpfmaps.PolicyName: maps.Policy, bpfmaps.EnforcementName: maps.Enforcement,
		bpfmaps.CountersName: maps.Counters, bpfmaps.ConntrackName: maps.Conntrack, bpfmaps.RevisionName: maps.Revision,
	}}))
	old := &enforcer{fromEndpoint: objs.FromEndpoint, toEndpoint: objs.ToEndpoint}
	defer old.Close()
	nw.attach(t, old, linksDir)
	for _, dir := range []uint32{uint32(policy.Ingress), uint32(policy.Egress)} {
		require.NoError(t, maps.Enforcement.Put(dir, uint32(bpfmaps.EnforceDefaultDeny)))
	}
	bumpRevision(t, maps)
	require.Equal(t, 10, nw.ping(t, "10.200.0.2", 10, "0.01"), "the old program allows the ping")
	return id
}

// previousEnforcementMapSpec is the enforcement map of the previous
// layout (an array of the two directions), which the fixtures declare.
func previousEnforcementMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: bpfmaps.EnforcementName, Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 2}
}

// previousCountersMapSpec is the counters map of the previous layout (8
// entries: direction*4 + slot), which the fixture's program declares.
func previousCountersMapSpec() *ebpf.MapSpec {
	spec := bpfmaps.CountersSpec()
	spec.MaxEntries = 2 * 4 // previous layout: direction*4 + slot
	return spec
}

// previousConntrackMapSpec is the conntrack map of the previous layout
// (40-byte keys, without the device).
func previousConntrackMapSpec(maxEntries uint32) *ebpf.MapSpec {
	spec := bpfmaps.ConntrackSpec(maxEntries)
	spec.Type = ebpf.LRUHash
	spec.KeySize = previousConntrackKeySize
	return spec
}

// flatPolicyObject is the enforcement program as it was when the policy
// map was one flat LPM trie (the host-wide default's only) and the
// enforcement map an array of the two directions (the committed object
// of that time).
var flatPolicyObject = filepath.Join("testdata", "enforce_flatpolicy_bpfel.o")

// TestPrivilegedUpgradeFromFlatPolicyMap: an agent of the previous layout
// left its program attached, enforcing both directions with a flat LPM
// policy map that allows the endpoint's echo requests (egress, any
// protocol) and nothing else (the replies pass as replies); the new
// datapath starts over the same pins while a 1 ms ping runs. The flat map
// itself becomes the default's map in the new outer map and the array's
// values the default's entries of the new enforcement map, both before
// the program that reads them replaces the old one, so no probe is lost;
// the old array is freed once the old program is gone. Five rounds, each
// from a fresh old agent.
func TestPrivilegedUpgradeFromFlatPolicyMap(t *testing.T) {
	privileged.Test(t)
	t.Parallel()
	nw := newEndpointNetwork(t, "10.200.0.2")
	for round := range 5 {
		linksDir := newTestLinksDir(t)
		bpfRoot := filepath.Dir(filepath.Dir(linksDir))
		pinDir := bpfmaps.PinDir(bpfRoot)
		policyID, enforcementID := startFlatPolicyAgent(t, nw, pinDir, linksDir)

		pinger := netnstest.StartPinger(t, nw.ep, "10.200.0.2", time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		cfg := DefaultConfig
		cfg.BPFRoot, cfg.Devices = bpfRoot, []string{nw.hostDevice}
		cfg.IPCacheMapMaxEntries, cfg.PolicyMapMaxEntries = 1024, 512
		d := newDatapath(cfg, hivetest.Logger(t))
		d.conntrack.MapMaxEntries = 4096
		require.NoError(t, inNetns(t, nw.host, func() error { return d.Start(context.Background()) }), "round %d", round)
		time.Sleep(200 * time.Millisecond)
		sent, answered, longestLoss := pinger.Stop()
		require.NoError(t, d.Stop(context.Background()))

		require.Greater(t, sent, 100, "round %d: probes sent across the switch", round)
		require.Equal(t, sent, answered, "round %d: no probe lost (longest loss %d)", round, longestLoss)
		t.Logf("round %d: %d probes 1 ms apart across the switch, %d answered", round, sent, answered)

		outer, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpfmaps.PolicyName), nil)
		require.NoError(t, err)
		require.Equal(t, ebpf.HashOfMaps, outer.Type(), "round %d: the pin is the new layout", round)
		m, err := bpfmaps.PolicyOf(outer, 0)
		outer.Close()
		require.NoError(t, err)
		info, err := m.Info()
		require.NoError(t, err)
		id, _ := info.ID()
		require.Equal(t, policyID, id, "round %d: the flat map is the default's map, as it was", round)
		got := map[policy.Key]policy.Verdict{}
		require.NoError(t, bpfmaps.ReadEntries(m, func(k bpfmaps.PolicyKey, v bpfmaps.PolicyValue) {
			key, err := k.Key()
			require.NoError(t, err)
			got[key] = policy.Verdict(v.Verdict())
		}))
		m.Close()
		require.Equal(t, map[policy.Key]policy.Verdict{
			{Identity: identity.World, Direction: policy.Egress}: policy.VerdictAllow,
		}, got)

		enforced, err := bpfmaps.ReadEnforcement(bpfRoot)
		require.NoError(t, err)
		require.Equal(t, [2]bool{true, true}, enforced, "round %d: the array's values are the default's", round)
		e, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpfmaps.EnforcementName), nil)
		require.NoError(t, err)
		require.Equal(t, bpfmaps.EnforcementSpec().MaxEntries, e.MaxEntries(), "round %d: the new layout", round)
		e.Close()

		require.Eventually(t, func() bool {
			old, err := ebpf.NewMapFromID(enforcementID)
			if err == nil {
				old.Close()
			}
			return err != nil
		}, 10*time.Second, 10*time.Millisecond, "round %d: old enforcement map %d still exists", round, enforcementID)
	}
}

// startFlatPolicyAgent does what the agent of the previous layout left
// behind: its maps pinned in pinDir (policy a flat LPM trie, enforcement
// an array) and its program attached to the host device with links pinned
// in linksDir, enforcing both directions. It returns the IDs of the
// policy and enforcement maps, of which it keeps no descriptor.
func startFlatPolicyAgent(t *testing.T, nw *endpointNetwork, pinDir, linksDir string) (policyID, enforcementID ebpf.MapID) {
	t.Helper()
	pinned := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		require.NoError(t, err, spec.Name)
		require.NoError(t, m.Pin(filepath.Join(pinDir, spec.Name)), spec.Name)
		return m
	}
	require.NoError(t, os.MkdirAll(pinDir, 0o700))
	maps := enforcerMaps{
		IPCache:          pinned(bpfmaps.IPCacheSpec(1024)),
		Policy:           pinned(bpfmaps.PolicySpec(512)),
		Enforcement:      pinned(previousEnforcementMapSpec()),
		Counters:         pinned(bpfmaps.CountersSpec()),
		Conntrack:        pinned(bpfmaps.ConntrackSpec(4096)),
		ConntrackOpening: pinned(bpfmaps.ConntrackOpeningSpec(bpfmaps.DefaultConntrackConfig().OpeningMapMaxEntries)),
		Revision:         pinned(bpfmaps.RevisionSpec()),
	}
	all := []*ebpf.Map{maps.IPCache, maps.Policy, maps.Enforcement, maps.Counters, maps.Conntrack, maps.ConntrackOpening, maps.Revision}
	defer func() {
		for _, m := range all {
			m.Close()
		}
	}()
	allow := bpfmaps.NewPolicyValue(uint32(policy.VerdictAllow))
	require.NoError(t, maps.Policy.Put(bpfmaps.NewPolicyKey(policy.Key{Identity: identity.World, Direction: policy.Egress}), allow))
	id := func(m *ebpf.Map) ebpf.MapID {
		info, err := m.Info()
		require.NoError(t, err)
		id, ok := info.ID()
		require.True(t, ok)
		return id
	}

	spec, err := ebpf.LoadCollectionSpec(flatPolicyObject)
	require.NoError(t, err)
	require.Equal(t, ebpf.LPMTrie, spec.Maps[bpfmaps.PolicyName].Type, "the fixture is of the previous layout")
	require.EqualValues(t, 2, spec.Maps[bpfmaps.EnforcementName].MaxEntries, "the fixture is of the previous layout")
	replacements := map[string]*ebpf.Map{
		bpfmaps.IPCacheName: maps.IPCache, bpfmaps.PolicyName: maps.Policy, bpfmaps.EnforcementName: maps.Enforcement,
		bpfmaps.CountersName: maps.Counters, bpfmaps.ConntrackName: maps.Conntrack,
		bpfmaps.ConntrackOpeningName: maps.ConntrackOpening, bpfmaps.RevisionName: maps.Revision,
	}
	for name, m := range replacements {
		spec.Maps[name].MaxEntries = m.MaxEntries()
	}
	var objs struct {
		FromEndpoint *ebpf.Program `ebpf:"enforce_from_endpoint"`
		ToEndpoint   *ebpf.Program `ebpf:"enforce_to_endpoint"`
	}
	require.NoError(t, spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: replacements}))
	old := &enforcer{fromEndpoint: objs.FromEndpoint, toEndpoint: objs.ToEndpoint}
	defer old.Close()
	nw.attach(t, old, linksDir)
	for _, dir := range []uint32{uint32(policy.Ingress), uint32(policy.Egress)} {
		require.NoError(t, maps.Enforcement.Put(dir, uint32(bpfmaps.EnforceDefaultDeny)))
	}
	bumpRevision(t, maps)
	require.Equal(t, 10, nw.ping(t, "10.200.0.2", 10, "0.01"), "the old program allows the ping")
	return id(maps.Policy), id(maps.Enforcement)
}
