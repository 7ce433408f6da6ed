// SPDX-License-Identifier: Apache-2.0

//go:build race

package main

// raceEnabled: this test binary has the race detector, so the agents the
// tests start run as a build without it (agentBinary).
const raceEnabled = true
