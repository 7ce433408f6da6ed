// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

// Cell provides the [Tracker] of the conntrack maps the datapath opens:
// their flags, their collection and the conntrack shell commands.
var Cell = cell.Module(
	"conntrack",
	"Connection tracking maps and their collection",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(
		func(jobs job.Registry, health cell.Health, log *slog.Logger) job.Group {
			return jobs.NewGroup(health, job.WithLogger(log))
		},
	),
	cell.Provide(newTracker, Config.datapathConfig, scriptCommands, newMetrics),
	cell.Invoke(registerGC),
)

// Config is the conntrack maps' configuration. ConntrackGCInterval and
// ConntrackTestTimeout are hidden flags, for tests.
type Config struct {
	ConntrackMapMaxEntries        uint32
	ConntrackOpeningMapMaxEntries uint32
	ConntrackGCInterval           time.Duration
	ConntrackTestTimeout          time.Duration
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{
	ConntrackMapMaxEntries:        bpfmaps.DefaultConntrackMaxEntries,
	ConntrackOpeningMapMaxEntries: bpfmaps.DefaultConntrackOpeningMaxEntries,
	ConntrackGCInterval:           10 * time.Second,
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint32("conntrack-map-max-entries", def.ConntrackMapMaxEntries,
		"Maximum entries of the conntrack map of established connections (never evicted: when it is full, new connections stay in ct_opening, counted)")
	flags.Uint32("conntrack-opening-map-max-entries", def.ConntrackOpeningMapMaxEntries,
		"Maximum entries of the ct_opening map of connections not yet established (LRU: the least recently used are evicted when it is full)")
	flags.Duration("conntrack-gc-interval", def.ConntrackGCInterval, "Interval of the rounds that delete expired conntrack entries")
	flags.Duration("conntrack-test-timeout", def.ConntrackTestTimeout, "If set, every conntrack timeout is this (tests only)")
	// Hidden: for tests, not for users.
	_ = flags.MarkHidden("conntrack-gc-interval")
	_ = flags.MarkHidden("conntrack-test-timeout")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: a zero --conntrack-map-max-entries or
// --conntrack-opening-map-max-entries, a --conntrack-gc-interval that is
// not positive, a negative --conntrack-test-timeout.
func (c Config) Validate() error {
	switch {
	case c.ConntrackMapMaxEntries == 0:
		return fmt.Errorf("--conntrack-map-max-entries must be positive")
	case c.ConntrackOpeningMapMaxEntries == 0:
		return fmt.Errorf("--conntrack-opening-map-max-entries must be positive")
	case c.ConntrackGCInterval <= 0:
		return fmt.Errorf("--conntrack-gc-interval must be positive")
	case c.ConntrackTestTimeout < 0:
		return fmt.Errorf("--conntrack-test-timeout must not be negative")
	}
	return nil
}

// datapathConfig is what the datapath takes of the configuration: the
// maps' sizes, and the program's timeouts, zero (its defaults) unless the
// test flag is set.
func (c Config) datapathConfig() bpfmaps.ConntrackConfig {
	out := bpfmaps.ConntrackConfig{MapMaxEntries: c.ConntrackMapMaxEntries, OpeningMapMaxEntries: c.ConntrackOpeningMapMaxEntries}
	if d := c.ConntrackTestTimeout; d != 0 {
		out.Timeouts = bpfmaps.ConntrackTimeouts{TCPOpening: d, TCPEstablished: d, TCPClosing: d, Other: d}
	}
	return out
}
