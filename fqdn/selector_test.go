// SPDX-License-Identifier: Apache-2.0

package fqdn_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
)

// TestMatch holds Cilium's documented examples of matchName and
// matchPattern, and the edges of "within one label".
func TestMatch(t *testing.T) {
	tests := []struct {
		sel     fqdn.Selector
		match   []string
		noMatch []string
	}{
		{
			sel:     fqdn.Selector{MatchName: "api.example.com"},
			match:   []string{"api.example.com", "api.example.com.", "API.Example.COM", "API.EXAMPLE.COM."},
			noMatch: []string{"example.com", "xapi.example.com", "a.api.example.com", "api.example.com.evil", "api.example.co", "api-example.com", "api.example.com..", ""},
		},
		{
			sel:   fqdn.Selector{MatchName: "API.Example.com."},
			match: []string{"api.example.com", "api.example.com."},
		},
		{
			// "*" alone matches every name, and the root.
			sel:     fqdn.Selector{MatchPattern: "*"},
			match:   []string{"cilium.io", "sub.cilium.io", "a.b.c.d.e", "x", ".", "UPPER.case.", "under_score.io"},
			noMatch: []string{"", "a b.io", "a..b", `a\032b.io`, "é.io"},
		},
		{
			// Cilium: subdomains of cilium.io one level down.
			sel:     fqdn.Selector{MatchPattern: "*.cilium.io"},
			match:   []string{"sub.cilium.io", "blog.cilium.io", "www.cilium.io.", "SUB.CILIUM.IO", "a-b_c.cilium.io"},
			noMatch: []string{"cilium.io", "a.b.cilium.io", "sub.cilium.io.evil", "subcilium.io", "sub.cilium.ioo", "a b.cilium.io", "."},
		},
		{
			// "*" within a label matches any run of name characters, the
			// empty one too.
			sel:     fqdn.Selector{MatchPattern: "*cilium.io"},
			match:   []string{"cilium.io", "subcilium.io", "sub-cilium.io"},
			noMatch: []string{"sub.cilium.io", "cilium.io.x", "ciliumx.io"},
		},
		{
			sel:     fqdn.Selector{MatchPattern: "sub*.cilium.io"},
			match:   []string{"sub.cilium.io", "subdomain.cilium.io", "SUBdomain.cilium.io."},
			noMatch: []string{"www.cilium.io", "blog.cilium.io", "cilium.io", "sub.sub.cilium.io", "asub.cilium.io"},
		},
		{
			sel:     fqdn.Selector{MatchPattern: "*.*.cilium.io"},
			match:   []string{"a.b.cilium.io"},
			noMatch: []string{"a.cilium.io", "a.b.c.cilium.io", "cilium.io"},
		},
		{
			sel:     fqdn.Selector{MatchPattern: "a*b*c.io"},
			match:   []string{"abc.io", "axxbyyc.io", "abbbc.io", "abcbc.io"},
			noMatch: []string{"acb.io", "ab.io", "abcd.io", "a.b.c.io"},
		},
		{
			sel:     fqdn.Selector{MatchPattern: "api.*"},
			match:   []string{"api.com", "api.io."},
			noMatch: []string{"api", "api.example.com", "www.api.com"},
		},
		{
			// A pattern without a star is a name.
			sel:     fqdn.Selector{MatchPattern: "api.example.com"},
			match:   []string{"Api.Example.Com."},
			noMatch: []string{"www.api.example.com"},
		},
	}
	for _, test := range tests {
		m, err := test.sel.Compile()
		require.NoError(t, err, "%+v", test.sel)
		for _, name := range test.match {
			require.True(t, m.Match(name), "%s should match %q", m, name)
		}
		for _, name := range test.noMatch {
			require.False(t, m.Match(name), "%s should not match %q", m, name)
		}
	}
}

func TestMatcherZeroMatchesNothing(t *testing.T) {
	var m fqdn.Matcher
	for _, name := range []string{"", ".", "a.com"} {
		require.False(t, m.Match(name))
	}
}

func TestSelectorErrors(t *testing.T) {
	tests := []struct {
		sel  fqdn.Selector
		want error
		says string
	}{
		{fqdn.Selector{}, fqdn.ErrEmptySelector, "needs matchName or matchPattern"},
		{fqdn.Selector{MatchName: "a.com", MatchPattern: "*.com"}, fqdn.ErrBothSelectors, "use one"},
		{fqdn.Selector{MatchName: "*.a.com"}, fqdn.ErrInvalidName, `"*.a.com": character '*' at 0`},
		{fqdn.Selector{MatchName: "a..com"}, fqdn.ErrInvalidName, "empty label"},
		{fqdn.Selector{MatchName: ".a.com"}, fqdn.ErrInvalidName, "empty label"},
		{fqdn.Selector{MatchName: "."}, fqdn.ErrInvalidName, "empty label"},
		{fqdn.Selector{MatchName: "a com"}, fqdn.ErrInvalidName, "character ' ' at 1"},
		{fqdn.Selector{MatchName: "ä.com"}, fqdn.ErrInvalidName, "only letters"},
		{fqdn.Selector{MatchName: strings.Repeat("a", 256)}, fqdn.ErrInvalidName, "longer than 255"},
		{fqdn.Selector{MatchPattern: "[a-z].com"}, fqdn.ErrInvalidPattern, `character '['`},
		{fqdn.Selector{MatchPattern: "a+.com"}, fqdn.ErrInvalidPattern, `character '+'`},
		{fqdn.Selector{MatchPattern: "a{1,2}.com"}, fqdn.ErrInvalidPattern, `character '{'`},
		{fqdn.Selector{MatchPattern: "**.com"}, fqdn.ErrInvalidPattern, `"**" is not supported`},
		{fqdn.Selector{MatchPattern: "*..com"}, fqdn.ErrInvalidPattern, "empty label"},
		{fqdn.Selector{MatchPattern: "?.com"}, fqdn.ErrInvalidPattern, `character '?'`},
	}
	for _, test := range tests {
		err := test.sel.Validate()
		require.ErrorIs(t, err, test.want, "%+v", test.sel)
		require.ErrorContains(t, err, test.says)
		_, err = test.sel.Compile()
		require.ErrorIs(t, err, test.want)
	}
	for _, ok := range []fqdn.Selector{
		{MatchName: "a.com."}, {MatchName: "_srv._tcp.a-b.com"}, {MatchName: strings.Repeat("a", 255)},
		{MatchPattern: "*"}, {MatchPattern: "*.*"}, {MatchPattern: "*.com."},
	} {
		require.NoError(t, ok.Validate(), "%+v", ok)
	}
}

func TestSelectorLabel(t *testing.T) {
	tests := []struct {
		sel  fqdn.Selector
		want string
	}{
		{fqdn.Selector{MatchName: "api.example.com"}, "fqdn:api.example.com"},
		{fqdn.Selector{MatchName: "API.Example.com."}, "fqdn:api.example.com"},
		{fqdn.Selector{MatchPattern: "*.Example.COM."}, "fqdn:*.example.com"},
		{fqdn.Selector{MatchPattern: "*"}, "fqdn:*"},
	}
	for _, test := range tests {
		require.Equal(t, test.want, test.sel.Label())
		m, err := test.sel.Compile()
		require.NoError(t, err)
		require.Equal(t, test.sel.String(), m.String())
	}
}

func TestCanonicalName(t *testing.T) {
	for in, want := range map[string]string{
		"A.Example.COM.": "a.example.com", "a.example.com": "a.example.com", ".": ".", "": "",
		`A\032b.`: `a\032b`,
	} {
		require.Equal(t, want, fqdn.CanonicalName(in), in)
	}
}
