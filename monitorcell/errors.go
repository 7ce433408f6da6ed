// SPDX-License-Identifier: Apache-2.0

package monitorcell

import "errors"

var (
	// ErrEventType is the error of a monitor --type other than drop,
	// verdict, dns or all.
	ErrEventType = errors.New("want drop, verdict, dns or all")

	// ErrFilter is the error of a monitor filter flag's invalid value.
	ErrFilter = errors.New("invalid filter")
)
