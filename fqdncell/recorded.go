// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/miekg/dns"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// The program records in the pinned dns-answers ring the UDP DNS answers
// that reach an endpoint without passing through the proxy: while the
// agent is down or restarting (the pinned port has no socket, and the
// program lets the queries go to their servers), or before the proxy
// runs. The cell learns them as it would have: at start before the
// ipcache is initialized, then as they come. Nothing checked their names
// while they were recorded, so the client's DNS rules are applied here:
// an answer to a name they do not allow is not learned.

// drainRecorded learns every answer the ring holds now.
func (n *Names) drainRecorded(r *ringbuf.Reader) (learned int) {
	r.SetDeadline(time.Now())
	defer r.SetDeadline(time.Time{})
	var rec ringbuf.Record
	for {
		if err := r.ReadInto(&rec); err != nil {
			return learned
		}
		if n.learnRecorded(rec.RawSample) {
			learned++
		}
	}
}

// followRecorded learns the answers as the program records them, until
// ctx is done.
func (n *Names) followRecorded(ctx context.Context, r *ringbuf.Reader) {
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	var rec ringbuf.Record
	for {
		err := r.ReadInto(&rec)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case err != nil:
			return // closed
		}
		n.learnRecorded(rec.RawSample)
	}
}

// learnRecorded learns one recorded answer, if it is a well-formed
// answer to a name the client's DNS rules allow, and reports whether it
// learned anything.
func (n *Names) learnRecorded(raw []byte) bool {
	rec, err := bpfmaps.DecodeDNSAnswer(raw)
	if err != nil || uint32(len(rec.Payload)) < rec.Length {
		n.metrics.recordedSkipped.Inc() // malformed, or truncated
		return false
	}
	msg := new(dns.Msg)
	if err := msg.Unpack(rec.Payload); err != nil || !msg.Response || msg.Rcode != dns.RcodeSuccess || len(msg.Question) != 1 {
		n.metrics.recordedSkipped.Inc()
		return false
	}
	client := netip.AddrPortFrom(rec.Endpoint, 0)
	if !n.rulesAllow(client.Addr(), msg.Question[0].Name) {
		n.metrics.recordedSkipped.Inc()
		return false
	}
	answer := fqdn.ReadAnswer(msg, msg.Question[0].Name, fqdn.Limits{})
	n.metrics.skipped.Add(float64(answer.Skipped.Total()))
	if len(answer.Addresses) == 0 {
		return false
	}
	c := n.learn(client.Addr(), answer)
	if err := n.write(c); err != nil {
		n.log.Error("Cannot write the addresses of a recorded DNS answer into the ipcache", "name", answer.Question, "error", err)
		return false
	}
	n.metrics.recordedLearned.Inc()
	return true
}

// rulesAllow reports whether the DNS rules of the client's subject allow
// qname.
func (n *Names) rulesAllow(client netip.Addr, qname string) bool {
	txn := n.db.ReadTxn()
	subject, _ := n.subjectOf(txn, client)
	rules, _, found := n.dnsRules.Get(txn, policy.DNSRulesIndex.Query(subject))
	if !found {
		return false
	}
	for _, sel := range rules.Names {
		// Compiled per query: a matcher is a few label strings, and
		// rows change with the policies.
		if m, err := sel.Compile(); err == nil && m.Match(qname) {
			return true
		}
	}
	return false
}
