// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"crypto/sha256"
	"encoding/hex"
)

// ObjectSHA256 returns the hex SHA-256 of the embedded object file, which
// names the build of the program without loading it.
func ObjectSHA256() string {
	sum := sha256.Sum256(_EnforceBytes)
	return hex.EncodeToString(sum[:])
}
