// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestRowEnumsMarshalAsNames: a policy table row's direction, protocol
// and verdict are names in JSON and YAML, and read back from the names and
// from the numbers rows had before.
func TestRowEnumsMarshalAsNames(t *testing.T) {
	e := Entry{Key: Key{Identity: 16777217, Direction: Egress, Protocol: ProtocolTCP, Port: 22}, Verdict: VerdictDeny}
	out, err := json.Marshal(e.Key)
	require.NoError(t, err)
	require.JSONEq(t, `{"identity": 16777217, "direction": "egress", "protocol": "TCP", "port": 22}`, string(out))
	out, err = json.Marshal(struct {
		Verdict  Verdict  `json:"verdict"`
		Protocol Protocol `json:"protocol"`
	}{VerdictAllow, ProtocolAny})
	require.NoError(t, err)
	require.JSONEq(t, `{"verdict": "allow", "protocol": "any"}`, string(out))

	var back Key
	require.NoError(t, json.Unmarshal([]byte(`{"identity": 16777217, "direction": "egress", "protocol": "TCP", "port": 22}`), &back))
	require.Equal(t, e.Key, back)

	y, err := yaml.Marshal(e.Key)
	require.NoError(t, err)
	require.Contains(t, string(y), "direction: egress\nprotocol: TCP\n")
	for _, doc := range []string{string(y), "identity: 16777217\ndirection: 1\nprotocol: 6\nport: 22\n"} {
		var k Key
		require.NoError(t, yaml.Unmarshal([]byte(doc), &k), doc)
		require.Equal(t, e.Key, k, doc)
	}
	var v Verdict
	require.NoError(t, yaml.Unmarshal([]byte("2"), &v))
	require.Equal(t, VerdictDeny, v)
	require.NoError(t, yaml.Unmarshal([]byte("allow"), &v))
	require.Equal(t, VerdictAllow, v)
	require.Error(t, yaml.Unmarshal([]byte("maybe"), &v))
	for _, text := range []string{"dns-proxy", "3"} {
		v = 0
		require.NoError(t, yaml.Unmarshal([]byte(text), &v), text)
		require.Equal(t, VerdictDNSProxy, v, text)
	}
	out, err = json.Marshal(VerdictDNSProxy)
	require.NoError(t, err)
	require.JSONEq(t, `"dns-proxy"`, string(out))
	var d Direction
	require.Error(t, yaml.Unmarshal([]byte("sideways"), &d))
}
