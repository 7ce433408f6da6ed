// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReasonNames(t *testing.T) {
	for r, name := range map[Reason]string{
		ReasonNoPolicy: "no-policy", ReasonMalformed: "malformed-ip-header", ReasonPolicy: "policy",
		ReasonReply: "reply", ReasonEstablished: "established", ReasonRelated: "related", 99: "reason-99",
		ReasonPolicyDeny: "policy-deny", ReasonNotDenied: "not-denied",
	} {
		require.Equal(t, name, r.String())
	}
}
