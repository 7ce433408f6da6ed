// SPDX-License-Identifier: Apache-2.0

package source

import "errors"

// ErrUnknownSource is returned (wrapped) by Parse and Source.UnmarshalText
// for a name that is not a source, and by Source.MarshalText for a value
// that is not one.
var ErrUnknownSource = errors.New("unknown source")
