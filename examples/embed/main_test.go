// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHiveCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	// The hive is built from the project's cells and podcell (the hive
	// command prints to os.Stdout, so only its success is checked here).
	require.Equal(t, 0, run([]string{"hive"}, &stdout, &stderr), stderr.String())
}

func TestBadFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"--pods-file-interval=soon"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "pods-file-interval")
}
