// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig.Validate())
	for want, change := range map[string]func(*Config){
		"--conntrack-map-max-entries must be positive":         func(c *Config) { c.ConntrackMapMaxEntries = 0 },
		"--conntrack-opening-map-max-entries must be positive": func(c *Config) { c.ConntrackOpeningMapMaxEntries = 0 },
		"--conntrack-gc-interval must be positive":             func(c *Config) { c.ConntrackGCInterval = 0 },
		"--conntrack-test-timeout must not be negative":        func(c *Config) { c.ConntrackTestTimeout = -time.Second },
	} {
		c := DefaultConfig
		change(&c)
		require.EqualError(t, c.Validate(), want)
	}
}

// The flags are those the datapath had: two visible, two hidden for
// tests, on the program's default sizes.
func TestFlags(t *testing.T) {
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	DefaultConfig.Flags(flags)
	for name, hidden := range map[string]bool{"conntrack-map-max-entries": false, "conntrack-opening-map-max-entries": false,
		"conntrack-gc-interval": true, "conntrack-test-timeout": true} {
		f := flags.Lookup(name)
		require.NotNil(t, f, name)
		require.Equal(t, hidden, f.Hidden, name)
	}
	require.Equal(t, "262144", flags.Lookup("conntrack-map-max-entries").DefValue)
	require.Equal(t, "65536", flags.Lookup("conntrack-opening-map-max-entries").DefValue)
	require.Equal(t, "10s", flags.Lookup("conntrack-gc-interval").DefValue)
	require.Equal(t, bpfmaps.DefaultConntrackConfig(), DefaultConfig.datapathConfig())

	c := DefaultConfig
	c.ConntrackTestTimeout = time.Second
	require.Equal(t, bpfmaps.ConntrackTimeouts{TCPOpening: time.Second, TCPEstablished: time.Second, TCPClosing: time.Second, Other: time.Second},
		c.datapathConfig().Timeouts)
}
