// SPDX-License-Identifier: Apache-2.0

// Package netnsrun runs a function on a thread inside a named network
// namespace (one made by `ip netns add`) and moves the thread back: the
// one place the tests' harness and the benchmarks' enter a namespace.
package netnsrun
