// SPDX-License-Identifier: Apache-2.0

package endpointcell

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Commands of the endpoint cell, as the shell and `ipcache-agent
// endpoint` name them.
const (
	ListCommand = "endpoint/list"
	GetCommand  = "endpoint/get"
)

type scriptParams struct {
	cell.In

	DB        *statedb.DB
	Endpoints statedb.Table[*endpoint.State]
	// Enforcement is the policy cell's, if the hive has one: each
	// endpoint's enforcement per direction.
	Enforcement statedb.Table[*policy.Enforcement] `optional:"true"`
}

func scriptCommands(p scriptParams) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		ListCommand: scriptcmd.Show(
			script.CmdUsage{
				Summary: "List the endpoints",
				Detail: []string{
					"-o json: an array of objects with name, namespace, labels, identity,",
					"identityLabels, addresses, interface, node, local, owner, and",
					"enforcement per direction (enforced, deny-only or none).",
				},
			},
			func(s *script.State, asJSON bool) (script.WaitFunc, error) {
				txn := p.DB.ReadTxn()
				var out []endpointJSON
				for row := range p.Endpoints.All(txn) {
					out = append(out, p.toJSON(txn, row))
				}
				if asJSON {
					if out == nil {
						out = []endpointJSON{}
					}
					return scriptcmd.JSON(out, nil)
				}
				var b strings.Builder
				fmt.Fprintf(&b, "%-30s %-9s %-32s %-15s %s\n", "NAME", "IDENTITY", "ADDRESSES", "INTERFACE", "ENFORCEMENT")
				for _, e := range out {
					node := ""
					if !e.Local {
						node = " (node " + e.Node + ")"
					}
					fmt.Fprintf(&b, "%-30s %-9d %-32s %-15s ingress %s, egress %s%s\n", e.Namespace+"/"+e.Name, e.Identity,
						joinAddrs(e.Addresses), e.Interface, e.Enforcement.Ingress, e.Enforcement.Egress, node)
				}
				return scriptcmd.Result(b.String(), nil)
			}),
		GetCommand: script.Command(
			script.CmdUsage{
				Summary: "Show an endpoint",
				Args:    "namespace/name",
				Detail:  []string{"-o json: one object, as endpoint/list's."},
				Flags:   scriptcmd.OutputFlag,
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				asJSON, err := scriptcmd.JSONOutput(s)
				if err != nil {
					return scriptcmd.Result("", err)
				}
				id := args[0]
				if !strings.Contains(id, "/") {
					id = endpoint.DefaultNamespace + "/" + id
				}
				txn := p.DB.ReadTxn()
				row, _, found := p.Endpoints.Get(txn, endpoint.NameIndex.Query(id))
				if !found {
					return scriptcmd.Result("", fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound))
				}
				e := p.toJSON(txn, row)
				if asJSON {
					return scriptcmd.JSON(e, nil)
				}
				var b strings.Builder
				fmt.Fprintf(&b, "Name: %s/%s\nIdentity: %d\nLabels: %s\nAddresses: %s\nInterface: %s\nNode: %s\nLocal: %t\nOwner: %s\nEnforcement: ingress %s, egress %s\n",
					e.Namespace, e.Name, e.Identity, row.IdentityLabels, joinAddrs(e.Addresses), e.Interface, e.Node, e.Local, e.Owner,
					e.Enforcement.Ingress, e.Enforcement.Egress)
				return scriptcmd.Result(b.String(), nil)
			}),
	})
}

// endpointJSON is an endpoint in endpoint/list and endpoint/get -o json.
type endpointJSON struct {
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	Labels         map[string]string `json:"labels"`
	Identity       identity.Number   `json:"identity"`
	IdentityLabels []string          `json:"identityLabels"`
	Addresses      []netip.Addr      `json:"addresses"`
	Interface      string            `json:"interface"`
	Node           string            `json:"node"`
	Local          bool              `json:"local"`
	Owner          string            `json:"owner"`
	Enforcement    enforcementJSON   `json:"enforcement"`
}

// enforcementJSON is an endpoint's enforcement per direction: "enforced"
// (default deny), "deny-only" (deny rules, else allowed), "none", or
// "unknown" without a policy cell.
type enforcementJSON struct {
	Ingress string `json:"ingress"`
	Egress  string `json:"egress"`
}

func (p scriptParams) toJSON(txn statedb.ReadTxn, row *endpoint.State) endpointJSON {
	e := endpointJSON{
		Name: row.Name, Namespace: row.Namespace, Labels: row.Labels, Identity: row.Identity,
		Addresses: row.Addresses, Interface: row.Interface, Node: row.Node, Local: row.Local, Owner: row.Owner,
		IdentityLabels: []string{},
	}
	if e.Labels == nil {
		e.Labels = map[string]string{}
	}
	for l := range row.IdentityLabels.All() {
		e.IdentityLabels = append(e.IdentityLabels, l)
	}
	e.Enforcement.Ingress = p.enforcement(txn, row, policy.Ingress)
	e.Enforcement.Egress = p.enforcement(txn, row, policy.Egress)
	return e
}

func (p scriptParams) enforcement(txn statedb.ReadTxn, row *endpoint.State, dir policy.Direction) string {
	switch {
	case p.Enforcement == nil:
		return "unknown"
	case !row.Local:
		return "none"
	}
	r, _, found := p.Enforcement.Get(txn, policy.EnforcementIndex.Query(policy.EnforcementKey{Subject: row.Identity, Direction: dir}))
	switch {
	case !found:
		return "none"
	case r.Enforced:
		return "enforced"
	case r.HasDeny:
		return "deny-only"
	}
	return "none"
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}
