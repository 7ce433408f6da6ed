// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import "errors"

// ErrPrivateMountNamespace is returned by EnsureBPFFS when --bpf-root is
// not a bpffs mount and the process runs in a mount namespace other than
// the host's (as under `ip netns exec`): a bpffs it mounted would be in
// that namespace only, and go, with the pins and the enforcement they
// hold, when the process ends.
var ErrPrivateMountNamespace = errors.New("the agent runs in a mount namespace of its own")

// ErrBadDNSAnswer is the error of a dns-answers record that cannot be
// decoded (DecodeDNSAnswer).
var ErrBadDNSAnswer = errors.New("not a DNS answer record")
