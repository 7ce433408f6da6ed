// SPDX-License-Identifier: Apache-2.0

package bpfmaps

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeDNSAnswer(t *testing.T) {
	raw := make([]byte, DNSAnswerRecordSize)
	raw[0] = familyIPv4
	raw[4] = 2 // length 2, native endian on the little-endian targets
	copy(raw[16:], []byte{10, 0, 0, 1})
	copy(raw[32:], []byte{10, 0, 0, 53})
	raw[48], raw[49], raw[50] = 0xab, 0xcd, 0xef
	got, err := DecodeDNSAnswer(raw)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("10.0.0.1"), got.Endpoint)
	require.Equal(t, netip.MustParseAddr("10.0.0.53"), got.Server)
	require.Equal(t, []byte{0xab, 0xcd}, got.Payload, "length bytes only")
	require.False(t, got.Truncated())
	got.Payload[0] = 0
	require.Equal(t, byte(0xab), raw[48], "a copy")

	_, err = DecodeDNSAnswer(raw[:DNSAnswerRecordSize-1])
	require.ErrorIs(t, err, ErrBadDNSAnswer)
	raw[0] = 3
	_, err = DecodeDNSAnswer(raw)
	require.ErrorIs(t, err, ErrBadDNSAnswer)
}
