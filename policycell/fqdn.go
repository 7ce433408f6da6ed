// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"

	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
)

// notEnforced returns the error for the first rule of a file's policies
// that the policy files may hold and an agent without a DNS proxy (no
// policy.FQDNEnforcer in its hive) does not enforce: toFQDNs and DNS
// rules, which need the DNS proxy to learn the names' addresses and to
// apply the DNS rules. Taken there, such a rule would allow nothing
// (toFQDNs) or filter no query (DNS rules) while the file says
// otherwise, so the file is rejected, at the rule, as every other error
// of its content.
//
// Possible errors: *policyfile.FileError wrapping
// policyfile.ErrInvalidPolicy and ErrNotEnforced.
func notEnforced(file string, policies []*policy.Policy) error {
	for _, p := range policies {
		for _, rule := range p.Egress {
			if rule.FQDN == nil {
				continue
			}
			what := "toPorts[].rules.dns"
			if len(rule.FQDN.Selectors) > 0 {
				what = "toFQDNs"
			}
			return &policyfile.FileError{File: file, Line: rule.Line, Column: rule.Column, Err: fmt.Errorf(
				"%w: policy %q: %s: %s: %w", policyfile.ErrInvalidPolicy, p.Name, rule.Name, what, ErrNotEnforced)}
		}
	}
	return nil
}
