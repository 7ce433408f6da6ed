// SPDX-License-Identifier: Apache-2.0

package policycell

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
