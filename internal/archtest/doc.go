// SPDX-License-Identifier: Apache-2.0

// Package archtest holds tests of the module's structure rather than of
// its behaviour: layers_test.go checks every package's imports against the
// layers of docs/ARCHITECTURE.md, so that the picture there stays true as
// code moves between packages. The package has no code of its own.
package archtest
