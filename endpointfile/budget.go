// SPDX-License-Identifier: Apache-2.0

package endpointfile

// MaxSize is the cap of an endpoint file: the agent rejects a larger one
// without reading it further, so that what one file can make the agent
// read and parse stays bounded. It is larger than a policy file's because
// `kubectl get pods -o yaml` prints every pod with its full spec and
// status, most of which this package skips. Parse itself takes content of
// any size; its memory is bounded below.
const MaxSize = 16 << 20

// As for policy files (policyfile/budget.go): the reader keeps the tree of
// one document in memory, a node of it costs the same whatever its size in
// the file, so a document may have at most one node per nodeBytes bytes of
// the file's size, plus nodeAllowance for small files. A `kind: List` is
// one document, as large as its file: kubectl's output takes more bytes
// per node than this (BenchmarkParsePods reads such a List).
const (
	nodeBytes     = 4
	nodeAllowance = 4096
)

// nodeBudget is the most nodes a document of a file of size bytes may have.
func nodeBudget(size int) int { return size/nodeBytes + nodeAllowance }
