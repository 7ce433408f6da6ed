// SPDX-License-Identifier: Apache-2.0

package podcell

import "errors"

// ErrInvalidPodsFile is wrapped by every *LineError, which Parse and
// ParseFile return for a line that is not "address identity", has an
// invalid address or identity, or repeats an address.
var ErrInvalidPodsFile = errors.New("invalid pods file")
