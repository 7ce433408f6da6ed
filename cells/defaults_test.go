// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/datapathcell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
)

// TestPolicyMapDefaultsAgree: the policy cell's limit without a datapath,
// and `policy validate`'s default, are the datapath's default map size.
func TestPolicyMapDefaultsAgree(t *testing.T) {
	require.EqualValues(t, datapathcell.DefaultConfig.PolicyMapMaxEntries, policycell.DefaultPolicyMapMaxEntries)
}
