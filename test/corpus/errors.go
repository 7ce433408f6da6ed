// SPDX-License-Identifier: Apache-2.0

package main

import "errors"

var (
	// ErrManifest is a manifest line that is not a corpus row.
	ErrManifest = errors.New("invalid manifest")
	// ErrNotFound is a corpus file that no mirror directory holds.
	ErrNotFound = errors.New("corpus file not found in any mirror")
	// ErrChecksum is a materialized file whose content is not the one the
	// manifest names.
	ErrChecksum = errors.New("content differs from the manifest's sha256")
	// ErrValidate is a run of `policy validate` that gave no verdict.
	ErrValidate = errors.New("policy validate gave no verdict")
	// ErrAgent is an agent run that did not list its policy files.
	ErrAgent = errors.New("agent run failed")
)
