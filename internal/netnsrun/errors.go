// SPDX-License-Identifier: Apache-2.0

package netnsrun

import "errors"

// ErrNotReturned is returned when the thread could not be moved back to
// its own namespace after fn ran; the thread is then left locked, so the
// runtime ends it with the goroutine instead of serving others in the
// wrong namespace.
var ErrNotReturned = errors.New("thread not returned from the network namespace")
