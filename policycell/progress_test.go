// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
}
