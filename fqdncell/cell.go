// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/miekg/dns"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Cell provides the DNS proxy of toFQDNs policies and the names it
// learns: the `fqdn` ipcache resource (one shared identity per set of name
// selectors), the checkpoint of the learned names, and the fqdn/cache-list
// shell command. It takes a dnsproxy.Datapath from the hive (the datapath
// cell provides one).
var Cell = cell.Module(
	"fqdn",
	"DNS proxy and the names learned from DNS for toFQDNs",

	cell.Config(DefaultConfig()),
	cell.Invoke(Config.Validate),
	cell.ProvidePrivate(
		func(jobs job.Registry, health cell.Health, log *slog.Logger) job.Group {
			return jobs.NewGroup(health, job.WithLogger(log))
		},
	),
	cell.ProvidePrivate(newMetrics),
	cell.Provide(newNames, stateFile, scriptCommands, metricsOut, enforcer),
	cell.Invoke(registerNames),
)

// Config is the DNS proxy's configuration: Cilium's flags, names and
// defaults.
type Config struct {
	ToFQDNsProxyPort                    uint16
	ToFQDNsMinTTL                       int
	ToFQDNsIdleConnectionGracePeriod    time.Duration
	ToFQDNsEndpointMaxIPPerHostname     int
	ToFQDNsMaxDeferredConnectionDeletes int
	ToFQDNsProxyResponseMaxDelay        time.Duration
	ToFQDNsDNSRejectResponseCode        string
	// ToFQDNsGCInterval is how often expired names are collected and the
	// checkpoint written when it changed. Hidden: for tests.
	ToFQDNsGCInterval time.Duration
}

// DefaultConfig returns the configuration on the defaults.
func DefaultConfig() Config {
	cache := fqdn.DefaultConfig()
	return Config{
		ToFQDNsEndpointMaxIPPerHostname:     cache.MaxAddressesPerName,
		ToFQDNsMaxDeferredConnectionDeletes: cache.MaxDeferred,
		ToFQDNsProxyResponseMaxDelay:        100 * time.Millisecond,
		ToFQDNsDNSRejectResponseCode:        rejectRefused,
		ToFQDNsGCInterval:                   time.Second,
	}
}

const (
	rejectRefused   = "refused"
	rejectNameError = "nameError"
)

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint16("tofqdns-proxy-port", def.ToFQDNsProxyPort,
		"Port of the DNS proxy's UDP and TCP sockets (0: any free port)")
	flags.Int("tofqdns-min-ttl", def.ToFQDNsMinTTL,
		"Least time in seconds an address learned from DNS is allowed, whatever the answer's TTL")
	flags.Duration("tofqdns-idle-connection-grace-period", def.ToFQDNsIdleConnectionGracePeriod,
		"Time an expired address stays allowed after its last tracked connection ended")
	flags.Int("tofqdns-endpoint-max-ip-per-hostname", def.ToFQDNsEndpointMaxIPPerHostname,
		"Most live addresses of one DNS name: a new one makes the soonest to expire give way")
	flags.Int("tofqdns-max-deferred-connection-deletes", def.ToFQDNsMaxDeferredConnectionDeletes,
		"Most expired addresses kept while connections use them")
	flags.Duration("tofqdns-proxy-response-max-delay", def.ToFQDNsProxyResponseMaxDelay,
		"Longest time an answer is held until its addresses are allowed in the kernel; past it the answer is released, counted and logged")
	flags.String("tofqdns-dns-reject-response-code", def.ToFQDNsDNSRejectResponseCode,
		"Response code of a query for a name the DNS rules do not allow: refused or nameError")
	flags.Duration("tofqdns-gc-interval", def.ToFQDNsGCInterval,
		"Interval of the collection of expired names and of the checkpoint (tests only)")
	_ = flags.MarkHidden("tofqdns-gc-interval")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.ToFQDNsMinTTL < 0:
		return fmt.Errorf("%w: --tofqdns-min-ttl must not be negative", ErrInvalidConfig)
	case c.ToFQDNsIdleConnectionGracePeriod < 0:
		return fmt.Errorf("%w: --tofqdns-idle-connection-grace-period must not be negative", ErrInvalidConfig)
	case c.ToFQDNsEndpointMaxIPPerHostname <= 0:
		return fmt.Errorf("%w: --tofqdns-endpoint-max-ip-per-hostname must be positive", ErrInvalidConfig)
	case c.ToFQDNsMaxDeferredConnectionDeletes <= 0:
		return fmt.Errorf("%w: --tofqdns-max-deferred-connection-deletes must be positive", ErrInvalidConfig)
	case c.ToFQDNsProxyResponseMaxDelay <= 0:
		return fmt.Errorf("%w: --tofqdns-proxy-response-max-delay must be positive", ErrInvalidConfig)
	case c.ToFQDNsGCInterval <= 0:
		return fmt.Errorf("%w: --tofqdns-gc-interval must be positive", ErrInvalidConfig)
	}
	if _, err := c.rejectRcode(); err != nil {
		return err
	}
	return nil
}

// rejectRcode is the DNS response code of --tofqdns-dns-reject-response-code.
func (c Config) rejectRcode() (int, error) {
	switch c.ToFQDNsDNSRejectResponseCode {
	case rejectRefused:
		return dns.RcodeRefused, nil
	case rejectNameError:
		return dns.RcodeNameError, nil
	}
	return 0, fmt.Errorf("%w: --tofqdns-dns-reject-response-code %q: want %s or %s",
		ErrInvalidConfig, c.ToFQDNsDNSRejectResponseCode, rejectRefused, rejectNameError)
}

// cacheConfig is the learned names' retention.
func (c Config) cacheConfig() fqdn.Config {
	cfg := fqdn.DefaultConfig()
	cfg.MinTTL = time.Duration(c.ToFQDNsMinTTL) * time.Second
	cfg.IdleGrace = c.ToFQDNsIdleConnectionGracePeriod
	cfg.MaxAddressesPerName = c.ToFQDNsEndpointMaxIPPerHostname
	cfg.MaxDeferred = c.ToFQDNsMaxDeferredConnectionDeletes
	return cfg
}

func stateFile() statedir.FileOut {
	return statedir.FileOut{File: statedir.File{Name: fqdn.CheckpointFileName, Description: "names learned from DNS"}}
}
