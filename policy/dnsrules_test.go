// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"encoding/json"
	"testing"

	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// TestCanonicalDNSNames: spellings the matcher treats as one are one
// selector; names sort by their text, a name before a pattern of the same
// text.
func TestCanonicalDNSNames(t *testing.T) {
	got := CanonicalDNSNames([]fqdn.Selector{
		{MatchPattern: "*.Example.com."}, {MatchName: "API.example.com"}, {MatchPattern: "api.example.com"},
		{MatchName: "api.example.com."}, {MatchPattern: "*"}, {MatchPattern: "*.example.com"},
	})
	require.Equal(t, []fqdn.Selector{{MatchPattern: "*"}, {MatchPattern: "*.example.com"},
		{MatchName: "api.example.com"}, {MatchPattern: "api.example.com"}}, got)
}

// TestDNSRulesTable: rows by subject, found from the subject's number
// (db/get dns-rules 300), JSON in lowerCamel.
func TestDNSRulesTable(t *testing.T) {
	db := statedb.New()
	table, err := NewDNSRulesTable(db)
	require.NoError(t, err)
	row := &DNSRules{Subject: 300, Names: []fqdn.Selector{{MatchPattern: "*.example.com"}}, Policies: []string{"web"}}
	txn := db.WriteTxn(table)
	_, _, err = table.Insert(txn, row)
	require.NoError(t, err)
	_, _, err = table.Insert(txn, &DNSRules{Names: []fqdn.Selector{{MatchPattern: "*"}}, Policies: []string{"all"}})
	require.NoError(t, err)
	txn.Commit()

	got, _, found := table.Get(db.ReadTxn(), DNSRulesIndex.Query(300))
	require.True(t, found)
	require.True(t, got.Same(row))
	key, err := DNSRulesIndex.FromString("300")
	require.NoError(t, err)
	require.Equal(t, dnsRulesKey(300), key)
	_, err = DNSRulesIndex.FromString("web")
	require.Error(t, err)

	out, err := json.Marshal(row)
	require.NoError(t, err)
	require.JSONEq(t, `{"subject": 300, "names": [{"matchPattern": "*.example.com"}], "policies": ["web"]}`, string(out))
	require.Equal(t, []string{"300", "*.example.com", "web"}, row.TableRow())
}
