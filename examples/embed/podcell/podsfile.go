// SPDX-License-Identifier: Apache-2.0

package podcell

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

// Pod identities are cluster-wide identities allocated outside this agent:
// not Cilium's reserved numbers (below MinPodIdentity) and not the local
// scope, whose numbers this agent's identity cell allocates for CIDRs.
const (
	MinPodIdentity = identity.Number(256)
	MaxPodIdentity = identity.LocalScope - 1
)

// LineError is an error on a line of a pods file.
type LineError struct {
	File string
	Line int
	Err  error
}

// Error returns "file:line: invalid pods file: reason".
func (e *LineError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, ErrInvalidPodsFile, e.Err)
}

// Unwrap returns ErrInvalidPodsFile and the cause.
func (e *LineError) Unwrap() []error { return []error{ErrInvalidPodsFile, e.Err} }

// ParseFile reads a pods file: one pod per line, "address identity", e.g.
// "10.244.1.5 1000" or "fd00::5 1000"; blank lines and text from '#' to the
// end of a line are ignored. The file is valid as a whole or not at all. An
// empty file is no pods; a missing file is an error.
//
// Possible errors: *LineError (wrapping ErrInvalidPodsFile) for a line that
// is not exactly two fields, an address that does not parse, has a zone, is
// IPv4-mapped IPv6 or unspecified, an identity outside MinPodIdentity ..
// MaxPodIdentity, or an address already on an earlier line; the error of
// reading the file.
func ParseFile(path string) (map[netip.Addr]identity.Number, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read pods file: %w", err)
	}
	return Parse(path, string(data))
}

// Parse parses the contents of a pods file; name is used in errors. See
// ParseFile.
//
// Possible errors: a *LineError, wrapping ErrInvalidPodsFile, for the
// first line that is not valid.
func Parse(name, contents string) (map[netip.Addr]identity.Number, error) {
	pods := map[netip.Addr]identity.Number{}
	lineOf := map[netip.Addr]int{}
	n := 0
	for line := range strings.Lines(contents) {
		n++
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		fail := func(format string, args ...any) error {
			return &LineError{File: name, Line: n, Err: fmt.Errorf(format, args...)}
		}
		if len(fields) != 2 {
			return nil, fail("want 'address identity', got %d fields", len(fields))
		}
		addr, err := netip.ParseAddr(fields[0])
		switch {
		case err != nil:
			return nil, fail("address: %w", err)
		case addr.Zone() != "":
			return nil, fail("address %s: zones are not allowed", addr)
		case addr.Is4In6():
			return nil, fail("address %s: IPv4-mapped IPv6, write %s", addr, addr.Unmap())
		case addr.IsUnspecified():
			return nil, fail("address %s: unspecified address", addr)
		}
		id, err := strconv.ParseUint(fields[1], 10, 32)
		if err != nil || id < uint64(MinPodIdentity) || id > uint64(MaxPodIdentity) {
			return nil, fail("identity %q: want a number in %d..%d (reserved identities are below, local ones above)",
				fields[1], MinPodIdentity, MaxPodIdentity)
		}
		if first, dup := lineOf[addr]; dup {
			return nil, fail("address %s is already on line %d", addr, first)
		}
		lineOf[addr] = n
		pods[addr] = identity.Number(id)
	}
	return pods, nil
}
