// SPDX-License-Identifier: Apache-2.0

// Package endpoint is the vocabulary of endpoints: the workloads (pods,
// containers, VMs) behind this node's devices, or on other nodes, that
// policies pick by their labels. An endpoint has a name, labels,
// addresses and optionally the device it sits behind; its identity is a
// label identity (identity.MinCluster..MaxCluster) of the labels
// [Endpoint.IdentityLabels] derives, in Cilium's forms.
//
// It holds what the endpoint sources (the endpoint directory, the CNI
// plugin, embedders), the endpoint cell, the policy selectors and the
// datapath share: the endpoint as its sources describe it, namespaces and
// nodes, and the label forms. It imports no cell.
package endpoint
