// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The conntrack maps are shared by two cells: the datapath opens them and
// loads the program over them; the conntrack cell owns their flags,
// collects them and lists them. What each hands the other is declared
// here, so that neither imports the other.

// ConntrackMaps is the datapath's side: the conntrack maps it opened and
// the program's count of connections that could not move to a full
// conntrack map.
type ConntrackMaps interface {
	// Conntrack and ConntrackOpening return the datapath's own handles of
	// the pinned conntrack and ct_opening maps, nil while they are not
	// open (before start, after stop). The handles stay the datapath's:
	// not to be closed, nor used past its stop.
	Conntrack() *ebpf.Map
	ConntrackOpening() *ebpf.Map
	// ConntrackFull counts the connections the program could not move to
	// the conntrack map because it was full, summed over CPUs, since the
	// program was loaded.
	//
	// Possible errors: no program is loaded (no --devices, before start,
	// after stop); the kernel's, when the program's ct_stats cannot be
	// read.
	ConntrackFull() (uint64, error)
	// ConntrackDeleted tells the program that entries that had not
	// expired were deleted: it keeps, per CPU, the last connection that
	// passed without looking its entry up again (bpf/enforce.c, `flows`)
	// until the next write that could change a verdict. Does nothing when
	// no maps are open.
	ConntrackDeleted()
}

// ConntrackTimeouts are how long an entry lives after its last packet.
type ConntrackTimeouts struct {
	TCPOpening, TCPEstablished, TCPClosing, Other time.Duration
}

// ConntrackConfig is the conntrack cell's side: what opening the maps and
// loading the program take of its configuration.
type ConntrackConfig struct {
	// MapMaxEntries and OpeningMapMaxEntries are the sizes of conntrack
	// and ct_opening.
	MapMaxEntries, OpeningMapMaxEntries uint32
	// Timeouts are set in the program; zero keeps its declared defaults.
	Timeouts ConntrackTimeouts
}

// The default sizes of conntrack and ct_opening, those the program
// declares.
const (
	DefaultConntrackMaxEntries        = 262144
	DefaultConntrackOpeningMaxEntries = 65536
)

// DefaultConntrackConfig is the configuration on the defaults: a datapath
// without the conntrack cell opens the maps with it (nothing collects them
// then).
func DefaultConntrackConfig() ConntrackConfig {
	return ConntrackConfig{MapMaxEntries: DefaultConntrackMaxEntries, OpeningMapMaxEntries: DefaultConntrackOpeningMaxEntries}
}

// MonotonicNow is CLOCK_MONOTONIC_COARSE, the program's
// bpf_ktime_get_coarse_ns: the clock of a conntrack entry's expiry and
// of an event's time.
func MonotonicNow() time.Duration {
	var ts unix.Timespec
	// CLOCK_MONOTONIC_COARSE cannot fail on Linux.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return time.Duration(ts.Nano())
}
