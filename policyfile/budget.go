// SPDX-License-Identifier: Apache-2.0

package policyfile

// MaxSize is the cap of a policy file: the agent rejects a larger one
// without reading it further (the policy cell's directory reader and its
// saved files in force), so that what one file can make the agent read and
// parse stays bounded. 4 MiB holds some 200,000 CIDRs. Parse itself takes
// content of any size; its memory is bounded below.
const MaxSize = 4 << 20

// The reader keeps the tree of one document in memory, and a node of it
// costs the same whatever its size in the file: a file of many tiny
// nodes ("[1,1,1,..." or "-\n-\n-\n...") would cost many times its size.
// So a document may have at most one node per nodeBytes bytes of the
// file's size, plus nodeAllowance for small files; the reader counts as
// it reads and stops at the first node over. Policies as they are written
// take more bytes per node (TestNodeBudgetPolicies); documents are read
// one at a time, so a file of many small policies is not limited by their
// total.
const (
	nodeBytes     = 4
	nodeAllowance = 4096
)

// nodeBudget is the most nodes a document of a file of size bytes may have.
func nodeBudget(size int) int { return size/nodeBytes + nodeAllowance }
