// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"sync"
)

// syncBuffer is a bytes.Buffer that a child process's output can be copied
// into while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
