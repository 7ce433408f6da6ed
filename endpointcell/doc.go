// SPDX-License-Identifier: Apache-2.0

// Package endpointcell owns the endpoints: the workloads policies pick by
// their labels (DESIGN: docs/CONTRACT.md, "Endpoints").
//
// It reads the endpoints its sources register (the endpoint directory,
// the CNI plugin's server, embedders), each through its own
// endpoint.Source, and the namespaces' labels. It writes the `endpoints`
// table, takes one reference to the label identity of each endpoint from
// identitycell's allocator (and releases only those), and maps each
// endpoint's addresses to that identity in the ipcache through one
// resource handle per source ("endpoint/<owner>", explicit identities,
// which the ipcache does not reference count). It serves the
// `endpoint/list` and `endpoint/get` shell commands.
package endpointcell
