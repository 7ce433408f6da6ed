// SPDX-License-Identifier: Apache-2.0

// Package cnicell serves the agent's endpoint socket (--cni-sock-path), on
// which the CNI plugin (cmd/ipcache-agent-cni) registers the workloads the
// container runtime creates: ADD upserts the endpoint through the
// endpoint.Registry's source "cni" and answers once its policy is in the
// kernel, DEL deletes it, CHECK compares it, ATTACHMENTS lists a
// network's attachments for the plugin's GC.
//
// Owns: the endpoint socket, the source "cni" of the endpoint registry,
// and the file of the endpoints the plugin registered (cni-endpoints.json
// in the state directory), which it upserts again at start.
// Reads: the endpoint.Registry (provided by the endpoint cell), the state
// directory's configuration, the host's interfaces at start (an endpoint
// whose host-side interface went while the agent was down is dropped).
// Writes: endpoints through its source; its state file.
package cnicell
