// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// TestWaitComputed: the datapath waits until the selectors have seen the
// policies and identities of its snapshot, except identities while no
// policy names a CIDR (then no identity has entries to wait for).
func TestWaitComputed(t *testing.T) {
	f := newEngineFixture(t)
	wait := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := f.engine.progress.WaitComputed(ctx, f.db.ReadTxn())
		return err
	}
	f.round(t)
	f.upsertIdentities(t, identityRow(16777217, "cidr:10.1.0.0/16"))
	require.NoError(t, wait(), "no selectors: nothing to wait for")

	f.upsertPolicies(t, cidrPolicy("p", policy.Egress, nil, "10.0.0.0/8"))
	require.ErrorIs(t, wait(), context.DeadlineExceeded, "the policy is not computed yet")
	f.round(t)
	require.NoError(t, wait())
	f.upsertIdentities(t, identityRow(16777218, "cidr:10.2.0.0/16"))
	require.ErrorIs(t, wait(), context.DeadlineExceeded, "a new identity waits for the selectors' round")
	f.round(t)
	require.NoError(t, wait())

	// Peers by entity alone: another node's address appearing waits for
	// the selectors' round too (its entries must be in before its
	// ipcache entry points at it).
	f.deletePolicy(t, cidrPolicy("p", policy.Egress, nil, "10.0.0.0/8"))
	f.upsertPolicies(t, &policy.Policy{Name: "nodes", Ingress: []policy.Rule{{Entities: []identity.Entity{identity.EntityRemoteNode}}}})
	f.round(t)
	require.NoError(t, wait())
	f.upsertIdentities(t, identityRow(16777219, "cidr:192.0.2.7/32", "reserved:remote-node"))
	require.ErrorIs(t, wait(), context.DeadlineExceeded, "a new peer identity waits for the selectors' round")
	f.round(t)
	require.NoError(t, wait())
}

// TestProgressClaimsOnlyProcessedChanges: the progress never says the
// selectors computed an `endpoints` revision whose change they have not
// processed. A snapshot shows a commit before statedb wakes the change
// iterators, which yield none of its changes until then: the revision
// of a round's snapshot is not what the round processed. An endpoint
// changes identity while rounds run; after each round, the identity the
// engine holds for it must be the row's whenever the progress covers the
// row's revision.
func TestProgressClaimsOnlyProcessedChanges(t *testing.T) {
	f := newEngineFixture(t).withEndpoints()
	f.policiesRead()
	f.ipcacheResolved()
	f.round(t)
	const changes = 30000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range changes {
			f.upsertEndpoints(t, localEndpoint(t, "e", identity.MinCluster+identity.Number(i%7), netip.MustParseAddr("172.16.0.1"),
				"app", fmt.Sprintf("a%d", i%7)))
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		f.round(t)
		computed, _ := f.engine.progress.computed.Get()
		row, rev, found := f.endpoints.Get(f.db.ReadTxn(), endpoint.NameIndex.Query("shop/e"))
		if !found || rev > computed.Endpoints {
			continue
		}
		require.Equal(t, row.Identity, f.engine.endpointIdentity["shop/e"],
			"the progress says endpoints revision %d is computed, and the row of revision %d is not processed", computed.Endpoints, rev)
	}
}
