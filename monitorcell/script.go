// SPDX-License-Identifier: Apache-2.0

package monitorcell

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/miekg/dns"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/events"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// Command is the shell command that streams the program's events until
// its client leaves (the shell serves it like db/watch), and the agent's
// command line that runs it on the shell's socket.
const Command = "monitor"

// monitorFlush is how often a monitor's pending lines go to its client:
// the contract promises an event within a second of its packet.
const monitorFlush = 100 * time.Millisecond

// monitorParams: the identities table is optional, so that the monitor
// runs without the identity cell (the datapath's tests); events then carry
// no labels.
type monitorParams struct {
	cell.In

	Hub        *Hub
	Source     events.Source
	DB         *statedb.DB                           `optional:"true"`
	Identities statedb.Table[*identitycell.Identity] `optional:"true"`
	// PolicyEntries name the policies of an allow by policy.
	PolicyEntries statedb.Table[*policy.Entry] `optional:"true"`
	// Endpoints name the local endpoint of an event: an identity may be
	// shared by the endpoints of one label set, an address is one
	// endpoint's.
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
}

func monitorScriptCommands(p monitorParams) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		Command: script.Command(
			script.CmdUsage{
				Summary: "Stream the enforcement program's drop and verdict events and the DNS proxy's until interrupted",
				Detail: []string{
					"--type drop (default): one event per dropped packet; verdict: one per",
					"allowed packet of an enforced direction; dns: one per query the DNS",
					"proxy handled (no program needed); all: the three (without a program,",
					"DNS events only). Rate-limited in",
					"the program per CPU; lost events are counted (ipcache_agent_events_lost_total).",
					"-o json: one object per line: time, device, direction, src, dst,",
					"protocol, sport, dport (ICMP: type), identity, endpoint (the local",
					"endpoint's identity) and endpointName (its namespace/name), labels,",
					"verdict, reason, policy and rules (the deciding entry's). A DNS event:",
					"type \"dns\", time, client, server, endpoint, endpointName, name, qtype,",
					"rcode, addresses, verdict (forwarded, refused, failed), held (a duration).",
					"Filters as hubble observe's: a flag may be repeated (or take",
					"comma-separated values) and matches any of its values; an event is",
					"shown when it matches every flag given. Addresses take an address or",
					"a CIDR. Without --type, --verdict chooses the events (allow or an",
					"allow reason: verdict events). Filters select what is shown only: the",
					"program writes, and datapath/events-lost counts, every event.",
					"On DNS events --from-ip is the client's address, --to-ip the server's;",
					"--verdict drop matches refused and failed queries, allow forwarded ones",
					"(refused or failed alone: DNS events only); --label and --endpoint the",
					"client's endpoint. A DNS event passes no port, protocol or identity filter.",
				},
				Flags: func(fs *pflag.FlagSet) {
					scriptcmd.OutputFlag(fs)
					fs.String("type", "drop", "Events: drop, verdict, dns or all")
					AddFilterFlags(fs)
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 0 {
					return nil, script.ErrUsage
				}
				asJSON, err := scriptcmd.JSONOutput(s)
				if err != nil {
					return scriptcmd.Result("", err)
				}
				typ, err := s.Flags.GetString("type")
				if err != nil {
					return nil, err
				}
				filter, err := ParseFilter(s.Flags)
				if err != nil {
					return scriptcmd.Result("", err)
				}
				kinds := filter.kinds()
				if s.Flags.Changed("type") {
					if kinds, err = EventKinds(typ); err != nil {
						return scriptcmd.Result("", err)
					}
				}
				return nil, p.stream(s, kinds, filter, asJSON)
			}),
		"datapath/events-lost": scriptcmd.Show(
			script.CmdUsage{
				Summary: "Show the monitor events the program could not write since it was loaded",
				Detail: []string{
					"Refused by the per-CPU rate limit, and by a full ring buffer, summed",
					"over CPUs (ipcache_agent_events_lost_total). Events are written only",
					"while a monitor client is connected.",
					"-o json: {\"rateLimit\": n, \"ringFull\": n}.",
				},
			},
			func(s *script.State, asJSON bool) (script.WaitFunc, error) {
				rateLimited, ringFull, err := p.Source.Lost()
				if err != nil {
					return scriptcmd.Result("", err)
				}
				if asJSON {
					return scriptcmd.JSON(eventsLostJSON{RateLimit: rateLimited, RingFull: ringFull}, nil)
				}
				return scriptcmd.Result(fmt.Sprintf("Rate limit  %d\nRing full   %d\n", rateLimited, ringFull), nil)
			}),
	})
}

// EventKinds returns the events of a monitor --type: drop, verdict, dns
// or all.
//
// Possible errors: ErrEventType (wrapped, naming the value).
func EventKinds(typ string) (events.Kinds, error) {
	switch typ {
	case "drop":
		return events.Drops, nil
	case "verdict":
		return events.Verdicts, nil
	case "dns":
		return events.DNSQueries, nil
	case "all":
		return events.Drops | events.Verdicts | events.DNSQueries, nil
	}
	return 0, fmt.Errorf("--type %s: %w", typ, ErrEventType)
}

// eventsLostJSON is datapath/events-lost -o json.
type eventsLostJSON struct {
	RateLimit uint64 `json:"rateLimit"`
	RingFull  uint64 `json:"ringFull"`
}

// stream writes the events of kinds to the client until it leaves. A
// client that wants DNS events too gets those alone when no program is
// loaded: without one there are no drops or verdicts to miss.
func (p monitorParams) stream(s *script.State, kinds events.Kinds, filter *Filter, asJSON bool) error {
	var subscribed <-chan events.Event
	if kinds&events.ProgramKinds != 0 {
		ch, cancel, err := p.Hub.Subscribe(kinds & events.ProgramKinds)
		switch {
		case err == nil:
			subscribed = ch
			defer cancel()
		case !errors.Is(err, events.ErrNoProgram) || kinds&events.DNSQueries == 0:
			return err
		}
	}
	var dnsSubscribed <-chan events.DNS
	if kinds&events.DNSQueries != 0 {
		ch, cancel := p.Hub.SubscribeDNS()
		dnsSubscribed = ch
		defer cancel()
	}
	out := s.LogWriter()
	devices := map[uint32]string{}
	flush := time.NewTicker(monitorFlush)
	defer flush.Stop()
	pending := false
	for {
		select {
		case <-s.Context().Done():
			return nil
		case <-flush.C:
			if pending {
				if err := s.FlushLog(); err != nil {
					return err
				}
				pending = false
			}
		case e := <-subscribed:
			if !filter.match(e, p) {
				continue
			}
			j := p.describe(e, devices)
			if asJSON {
				b, err := json.Marshal(j)
				if err != nil {
					return err
				}
				out.Write(append(b, '\n'))
			} else {
				writeEventText(out, j)
			}
			pending = true
		case e := <-dnsSubscribed:
			if !filter.matchDNS(e, p) {
				continue
			}
			j := p.describeDNS(e)
			if asJSON {
				b, err := json.Marshal(j)
				if err != nil {
					return err
				}
				out.Write(append(b, '\n'))
			} else {
				writeDNSText(out, j)
			}
			pending = true
		}
	}
}

// eventJSON is one line of monitor -o json (docs/CONTRACT.md).
type eventJSON struct {
	Time      string          `json:"time"`
	Device    string          `json:"device"`
	Direction string          `json:"direction"`
	Src       string          `json:"src"`
	Dst       string          `json:"dst"`
	Protocol  string          `json:"protocol"`
	SrcPort   *uint16         `json:"sport,omitempty"`
	DstPort   *uint16         `json:"dport,omitempty"`
	ICMPType  *uint8          `json:"type,omitempty"`
	Identity  identity.Number `json:"identity"`
	// Endpoint is the local endpoint's identity whose policy decided;
	// left out for the host-wide default's (0).
	Endpoint identity.Number `json:"endpoint,omitempty"`
	// EndpointName is that endpoint's namespace/name, found by the
	// packet's local address; left out when no local endpoint of that
	// identity has the address now (the default's traffic, or an endpoint
	// gone or relabelled since the packet).
	EndpointName string   `json:"endpointName,omitempty"`
	Labels       []string `json:"labels"`
	Verdict      string   `json:"verdict"`
	Reason       string   `json:"reason"`
	Policy       string   `json:"policy,omitempty"`
	// Rules are the rules of that entry, each "<policy>:<rule>" as the
	// `policy` table names them.
	Rules []string `json:"rules,omitempty"`
}

func (p monitorParams) describe(e events.Event, devices map[uint32]string) eventJSON {
	device, ok := devices[e.Ifindex]
	if !ok {
		device = strconv.FormatUint(uint64(e.Ifindex), 10)
		if iface, err := net.InterfaceByIndex(int(e.Ifindex)); err == nil {
			device = iface.Name
		}
		devices[e.Ifindex] = device
	}
	j := eventJSON{
		Time:      e.Time.UTC().Format(time.RFC3339Nano),
		Device:    device,
		Direction: e.Direction.String(),
		Protocol:  policy.Protocol(e.Protocol).PacketString(),
		Identity:  e.Identity,
		Endpoint:  e.Endpoint,
		Labels:    []string{},
		Verdict:   "drop",
		Reason:    e.Reason.String(),
	}
	if e.Src.IsValid() {
		j.Src, j.Dst = e.Src.String(), e.Dst.String()
	}
	if e.Allowed {
		j.Verdict = "allow"
	}
	switch e.Protocol {
	case 1, 58:
		t := e.ICMPType
		j.ICMPType = &t
	case 6, 17, 132:
		sp, dp := e.SrcPort, e.DstPort
		j.SrcPort, j.DstPort = &sp, &dp
	}
	if e.Endpoint != identity.Unknown {
		j.EndpointName = p.endpointName(e)
	}
	if e.Identity != identity.Unknown {
		j.Labels = append(j.Labels, p.identityLabels(e.Identity)...)
	}
	if e.Allowed && e.Reason == bpfmaps.ReasonPolicy || !e.Allowed && e.Reason == bpfmaps.ReasonPolicyDeny {
		if entry := p.decidingEntry(e); entry != nil {
			j.Policy, j.Rules = strings.Join(entry.Policies, ","), entry.Rules
		}
	}
	return j
}

// reservedEntities are the entities of one reserved identity, whose
// numbers have no row in the identities table.
var reservedEntities = []identity.Entity{identity.EntityHost, identity.EntityWorld, identity.EntityUnmanaged,
	identity.EntityHealth, identity.EntityInit, identity.EntityRemoteNode, identity.EntityKubeAPIServer, identity.EntityIngress}

// identityLabels returns the labels of identity n as the identities
// table has them, or a reserved identity's label; nil when unknown.
func (p monitorParams) identityLabels(n identity.Number) []string {
	var out []string
	if p.DB != nil && p.Identities != nil {
		if id, _, found := p.Identities.Get(p.DB.ReadTxn(), identitycell.IdentityIndex.Query(n)); found {
			for l := range id.Labels.All() {
				out = append(out, l)
			}
		}
	}
	if len(out) == 0 {
		for _, ent := range reservedEntities {
			if r, ok := ent.Reserved(); ok && r == n || ent == identity.EntityWorld && n == identity.World {
				return []string{ent.ReservedLabel()}
			}
		}
	}
	return out
}

// endpointName names the local endpoint whose packet e is: the one with
// the packet's local address (its source on egress, its destination on
// ingress, as the program looks it up in the endpoints map), if it has the
// event's subject identity still. "" when the tables say otherwise.
func (p monitorParams) endpointName(e events.Event) string {
	if p.DB == nil || p.Endpoints == nil {
		return ""
	}
	local := e.Dst
	if e.Direction == policy.Egress {
		local = e.Src
	}
	if !local.IsValid() {
		return ""
	}
	ep, _, found := p.Endpoints.Get(p.DB.ReadTxn(), endpoint.AddressIndex.Query(local))
	if !found || !ep.Local || ep.Identity != e.Endpoint {
		return ""
	}
	return ep.ID()
}

// decidingEntry returns the desired entry that decided e, resolved as
// the program does (policy.Behind: the subject's entries for the remote
// identity and for identity 0, longest prefixes, a deny wins), if its
// verdict is e's; nil when the tables changed since. The program's event
// carries the verdict and reason, not the entry: the entry's policies and
// rules are the `policy` table's now, as policy/explain reads them.
func (p monitorParams) decidingEntry(e events.Event) *policy.Entry {
	if p.DB == nil || p.PolicyEntries == nil {
		return nil
	}
	pkt := policy.Lookup{
		Subject: e.Endpoint, Identity: e.Identity, Direction: e.Direction, Protocol: policy.Protocol(e.Protocol),
	}
	switch e.Protocol {
	case 6, 17, 132:
		pkt.Port, pkt.HasPort = e.DstPort, true
	case 1, 58:
		pkt.Port, pkt.HasPort = uint16(e.ICMPType)<<8, true
	}
	entry := policy.Behind(p.DB.ReadTxn(), p.PolicyEntries, pkt)
	if entry == nil || entry.Verdict.Allows() != e.Allowed {
		return nil
	}
	return entry
}

// writeEventText writes an event as cilium-dbg monitor does, roughly:
// what happened, why, where, and the packet.
func writeEventText(w io.Writer, j eventJSON) {
	what := "drop (" + j.Reason + ")"
	if j.Verdict == "allow" {
		what = "verdict allow (" + j.Reason + ")"
	}
	pkt := j.Src + " -> " + j.Dst + " " + j.Protocol
	switch {
	case j.ICMPType != nil:
		pkt += fmt.Sprintf(" type %d", *j.ICMPType)
	case j.SrcPort != nil:
		pkt = fmt.Sprintf("%s:%d -> %s:%d %s", j.Src, *j.SrcPort, j.Dst, *j.DstPort, j.Protocol)
	}
	where := j.Device + " " + j.Direction
	switch {
	case j.EndpointName != "":
		where += fmt.Sprintf(", endpoint %s (identity %d)", j.EndpointName, j.Endpoint)
	case j.Endpoint != 0:
		where += fmt.Sprintf(", endpoint %d", j.Endpoint)
	}
	decided := ""
	switch {
	case len(j.Rules) == 1:
		decided = "; policy " + j.Policy + ", rule " + j.Rules[0]
	case len(j.Rules) > 1:
		decided = "; policy " + j.Policy + ", rules " + strings.Join(j.Rules, ",")
	case j.Policy != "":
		decided = "; policy " + j.Policy
	}
	fmt.Fprintf(w, "%s %s on %s, identity %d (%s): %s%s\n", j.Time, what, where,
		j.Identity, strings.Join(j.Labels, ","), pkt, decided)
}

// dnsJSON is one DNS event of monitor -o json (docs/CONTRACT.md).
type dnsJSON struct {
	// Type is "dns": it tells a DNS event from a program's, whose "type"
	// is absent or an ICMP type (a number).
	Type     string          `json:"type"`
	Time     string          `json:"time"`
	Client   string          `json:"client"`
	Server   string          `json:"server"`
	Endpoint identity.Number `json:"endpoint,omitempty"`
	// EndpointName is the client endpoint's namespace/name, found by the
	// client's address as for a program's egress event.
	EndpointName string `json:"endpointName,omitempty"`
	Name         string `json:"name"`
	QType        string `json:"qtype"`
	Rcode        string `json:"rcode"`
	// Addresses are the answer's, [] when none.
	Addresses []string `json:"addresses"`
	Verdict   string   `json:"verdict"`
	// Held is a duration (Go's time.Duration text, "0s" when the answer
	// was not held).
	Held string `json:"held"`
}

func (p monitorParams) describeDNS(e events.DNS) dnsJSON {
	j := dnsJSON{
		Type:      "dns",
		Time:      e.Time.UTC().Format(time.RFC3339Nano),
		Client:    unmapped(e.Client).String(),
		Server:    unmapped(e.Server).String(),
		Endpoint:  e.Endpoint,
		Name:      e.Name,
		QType:     dns.TypeToString[e.Type],
		Rcode:     dns.RcodeToString[e.Rcode],
		Addresses: make([]string, 0, len(e.Addresses)),
		Verdict:   e.Verdict.String(),
		Held:      e.Held.String(),
	}
	// Unknown codes as RFC 3597 writes unknown types.
	if j.QType == "" {
		j.QType = "TYPE" + strconv.Itoa(int(e.Type))
	}
	if j.Rcode == "" {
		j.Rcode = "RCODE" + strconv.Itoa(e.Rcode)
	}
	for _, a := range e.Addresses {
		j.Addresses = append(j.Addresses, a.String())
	}
	if e.Endpoint != identity.Unknown {
		j.EndpointName = p.endpointName(queryPacket(e))
	}
	return j
}

// unmapped is ap with an IPv4-mapped IPv6 address as its IPv4 address,
// as the filters compare it.
func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// queryPacket is a DNS event's query as the program saw it: an egress
// packet of the client's endpoint, for the lookups by a local address.
func queryPacket(e events.DNS) events.Event {
	return events.Event{Direction: policy.Egress, Endpoint: e.Endpoint, Src: e.Client.Addr().Unmap(), Dst: e.Server.Addr().Unmap()}
}

// writeDNSText writes a DNS event on one line: who asked whom, for
// what, what came back and what the proxy did.
func writeDNSText(w io.Writer, j dnsJSON) {
	who := j.Client + " -> " + j.Server
	switch {
	case j.EndpointName != "":
		who += fmt.Sprintf(", endpoint %s (identity %d)", j.EndpointName, j.Endpoint)
	case j.Endpoint != 0:
		who += fmt.Sprintf(", endpoint %d", j.Endpoint)
	}
	fmt.Fprintf(w, "%s dns %s: %s %s %s [%s] %s held %s\n", j.Time, who, j.Name, j.QType, j.Rcode,
		strings.Join(j.Addresses, ", "), j.Verdict, j.Held)
}
