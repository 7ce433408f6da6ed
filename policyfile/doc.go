// SPDX-License-Identifier: Apache-2.0

// Package policyfile turns the content of a policy file into policies:
// Parse reads its YAML documents (docs/CONTRACT.md, "Policy file
// formats"), each a native policy, a CiliumNetworkPolicy, a
// CiliumClusterwideNetworkPolicy, a NetworkPolicy or a List of them, and
// gives the policy.Policy values they mean, or a *FileError at the
// position of the first thing the agent cannot enforce or does not know.
// A file is the unit of validity: one error rejects it as a whole.
// toFQDNs and DNS rules are read into the model (policy.FQDNRule), and
// enforcing them, or refusing a file with them, is the policy cell's.
//
// The YAML is read by the package's own reader (internal/yamlread), one
// document at a time, so that a parse's memory is a bounded multiple of
// the content's size whatever the content; MaxSize is the cap of a file
// that the agent reads.
//
// It owns the formats and nothing else: which files are read, which
// policies are in force, and the rules across files (a policy name held by
// one file, the policy map's bound) belong to the policy cell. It imports
// no cell.
//
// Reads: the content it is given. Writes: nothing.
package policyfile
