// SPDX-License-Identifier: Apache-2.0

package labels

import "errors"

// ErrInvalidLabel is returned (wrapped, naming the label) by New, Parse
// and Labels.UnmarshalText for a label that is not
// "source:value", contains a comma, white space or a control character,
// or whose value is not
// valid for its source (a CIDR label that does not parse or is not in
// canonical form).
var ErrInvalidLabel = errors.New("invalid label")
