// SPDX-License-Identifier: Apache-2.0

package endpointcell

import "errors"

// ErrStarted is a source that would hold the `endpoints` table's
// initialization, created after the hive started.
var ErrStarted = errors.New("endpoint sources that hold initialization must be created before start")
