// SPDX-License-Identifier: Apache-2.0

//go:build race

package cells

// raceEnabled: the race detector makes each row of a large table several
// times slower to show, so the tests that measure the shell at scale use
// fewer prefixes under it.
const raceEnabled = true
