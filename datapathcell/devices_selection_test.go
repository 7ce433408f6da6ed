// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDeviceSelection(t *testing.T) {
	t.Parallel()
	s := newDeviceSelection([]string{"eth0", "lxc+", "veth-a+"})
	for name, want := range map[string]bool{
		"eth0": true, "eth01": false, "eth": false,
		"lxc": true, "lxc123": true, "lx": false, "alxc1": false,
		"veth-a": true, "veth-ab": true, "veth-b": false,
	} {
		require.Equal(t, want, s.selects(name), name)
	}
	require.False(t, newDeviceSelection(nil).selects("eth0"))
}

func TestConfigValidateDevices(t *testing.T) {
	t.Parallel()
	valid := func(devices ...string) error {
		c := DefaultConfig
		c.Devices = devices
		return c.Validate()
	}
	require.NoError(t, valid("eth0", "lxc+", "a+", "fifteen-chars-0", "fifteen-chars-0+"))
	for _, bad := range []string{"", "+", "sixteen-chars-00", "sixteen-chars-00+"} {
		err := valid("eth0", bad)
		require.ErrorContains(t, err, "--devices", "%q", bad)
		require.ErrorContains(t, err, "not a network device name or prefix", "%q", bad)
	}
}
