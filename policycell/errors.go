// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"errors"

	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
)

// The errors a policy file is rejected for, beyond its content
// (policyfile.ErrInvalidPolicy). Each comes wrapped in a
// *policyfile.FileError that names the file (and the position, where
// there is one).
var (
	// ErrNameInUse is wrapped by the error that rejects a policy file
	// because another file in force already has a policy of that name.
	ErrNameInUse = errors.New("policy name already in use")

	// ErrEmptyFile rejects a file that has no policies (it is empty, or
	// holds only white space, comments and document separators) while a
	// version of it with policies is in force, which stays in force: an
	// editor that truncates a file and then writes it again must not
	// remove its policies in between. Removing the file removes them.
	ErrEmptyFile = errors.New("no policies in the file, its policies stay in force until it has content again or is removed")

	// ErrOutsideDirectory rejects a policy file that is a symlink whose
	// resolution leaves the policy directory: a target outside it, an
	// absolute target, or a path through a symlinked directory outside
	// it. Such a file is not opened.
	ErrOutsideDirectory = yamldir.ErrOutsideDirectory

	// ErrNotRegular rejects a policy file that is neither a regular file
	// nor a symlink to one (a FIFO could block the reader).
	ErrNotRegular = yamldir.ErrNotRegular

	// ErrTooLarge rejects a policy file larger than maxFileSize.
	ErrTooLarge = yamldir.ErrTooLarge

	// ErrTooManyEntries rejects a policy file whose policies compute more
	// policy-map entries than the policy map holds
	// (--policy-map-max-entries), counted before anything is expanded
	// (CountEntries): such a file could never be enforced, and expanding
	// it would cost memory in proportion to its CIDRs times its port
	// blocks.
	ErrTooManyEntries = errors.New("more than the policy map holds")

	// ErrNotEnforced rejects a policy file with toFQDNs or DNS rules
	// (toPorts[].rules.dns) in an agent without a DNS proxy (no
	// policy.FQDNEnforcer in its hive): nothing would learn the names'
	// addresses or apply the DNS rules, so taking the file would enforce
	// something other than it says.
	ErrNotEnforced = errors.New("not enforced by this agent (it has no DNS proxy to learn the names' addresses and apply DNS rules)")
)

// ErrPolicyTableFull is wrapped by the selector job's health error when
// the policies in force compute more entries than the `policy` table may
// hold (twice the policy map's size): those beyond are not computed
// until there is room.
var ErrPolicyTableFull = errors.New("the policy table is at its bound")

// The errors of the saved policies in force (in the state directory).
var (
	// ErrCorruptInForce is wrapped by the error for a saved file of the
	// policies in force (in the state directory) that cannot be restored.
	// It is moved aside, and the policy files alone decide what is in
	// force.
	ErrCorruptInForce = yamldir.ErrCorruptSaved

	// ErrInForceTooLarge is wrapped by the error for policy files whose
	// versions in force do not fit into the saved file's cap: they are not
	// saved.
	ErrInForceTooLarge = errors.New("the saved policies in force would be over their cap")
)

// ErrBadEnablePolicy is wrapped by the configuration error for an
// --enable-policy that is none of default, always and never.
var ErrBadEnablePolicy = errors.New("want default, always or never")

// ErrNoEndpoint is wrapped by policy/explain's error for an --endpoint
// that is no local endpoint with an identity.
var ErrNoEndpoint = errors.New("no local endpoint")
