// SPDX-License-Identifier: Apache-2.0

// Package endpointfile turns the content of an endpoint file (a file of
// --endpoint-dir, DESIGN.md section 10) into the endpoints, namespaces and
// nodes it describes: Parse reads its YAML documents, each a native
// `ipcache-agent.io/v1 Endpoint`, or a `v1 Pod`, `v1 Namespace`, `v1 Node`
// or `v1 List` of those as `kubectl get -o yaml` prints them, and gives
// endpoint.Endpoint, endpoint.Namespace and endpoint.Node values, or a
// *FileError at the position of the first thing that is wrong. A file is
// the unit of validity: one error rejects it as a whole.
//
// The YAML is read by the reader policy files use (internal/yamlread), one
// document at a time, with the same bound on a parse's memory; MaxSize is
// the cap of a file that the agent reads.
//
// It owns the format and nothing else: which files are read, and the rules
// across files (an endpoint or an address held by one file) belong to the
// endpoint cell. It imports no cell.
//
// Reads: the content it is given. Writes: nothing.
package endpointfile
