// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipcache-agent/ipcache-agent/dnsproxy"
	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/metrics"
)

// proxyMetrics are the proxy's and the learned names' measures.
type proxyMetrics struct {
	// latency is what the proxy adds to a query: its time in the proxy
	// less its server's.
	latency prometheus.Histogram
	// hold is how long answers whose addresses a selector selects were
	// held until the ipcache map allowed them.
	hold         prometheus.Histogram
	holdTimeouts prometheus.Counter
	expired      prometheus.Counter
	skipped      prometheus.Counter
	// recorded* count the answers the program recorded because they did
	// not pass through the proxy (the agent was down).
	recordedLearned prometheus.Counter
	recordedSkipped prometheus.Counter
}

// latencyBuckets span 50µs to about 1.6s.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 16)

func newMetrics() *proxyMetrics {
	return &proxyMetrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metrics.Prefix + "fqdn_proxy_added_latency_seconds",
			Help:    "Time a DNS answer spent in the proxy beyond its server's: forwarding and the hold",
			Buckets: latencyBuckets,
		}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metrics.Prefix + "fqdn_proxy_hold_seconds",
			Help:    "Time an answer with selected addresses was held until the ipcache map allowed them",
			Buckets: latencyBuckets,
		}),
		holdTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.Prefix + "fqdn_proxy_hold_timeouts_total",
			Help: "Answers released after --tofqdns-proxy-response-max-delay before their addresses were allowed",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.Prefix + "fqdn_expired_total",
			Help: "Name-address pairs removed once expired and no longer in use",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.Prefix + "fqdn_answer_records_skipped_total",
			Help: "Answer records not learned: over the limits, unrelated to the question, loops",
		}),
		recordedLearned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.Prefix + "fqdn_recorded_answers_learned_total",
			Help: "DNS answers that reached an endpoint without the proxy (the agent down), recorded by the program and learned",
		}),
		recordedSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.Prefix + "fqdn_recorded_answers_skipped_total",
			Help: "Recorded DNS answers not learned: malformed, truncated, not a success, or a name the client's DNS rules do not allow",
		}),
	}
}

func (m *proxyMetrics) observe(total, server time.Duration) {
	m.latency.Observe(max(total-server, 0).Seconds())
}

// metricsOut contributes the measures and the cache's and proxy's counts.
func metricsOut(m *proxyMetrics, n *Names) metrics.Out {
	gauge := func(name, help string, f func(fqdn.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metrics.Prefix + name, Help: help},
			func() float64 { return float64(f(n.Stats())) })
	}
	counter := func(name, help string, f func(dnsproxy.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metrics.Prefix + name, Help: help},
			func() float64 { return float64(f(n.ProxyStats())) })
	}
	return metrics.Out{Collectors: []prometheus.Collector{
		m.latency, m.hold, m.holdTimeouts, m.expired, m.skipped, m.recordedLearned, m.recordedSkipped,
		gauge("fqdn_names", "Names learned from DNS", func(s fqdn.Stats) int { return s.Names }),
		gauge("fqdn_addresses", "Distinct addresses learned from DNS", func(s fqdn.Stats) int { return s.Addresses }),
		gauge("fqdn_live_pairs", "Name-address pairs within their TTL", func(s fqdn.Stats) int { return s.Live }),
		gauge("fqdn_deferred_pairs", "Expired name-address pairs kept while in use", func(s fqdn.Stats) int { return s.Deferred }),
		counter("fqdn_proxy_forwarded_total", "DNS answers forwarded to their clients", func(s dnsproxy.Stats) uint64 { return s.Forwarded }),
		counter("fqdn_proxy_refused_total", "DNS queries refused: a name the DNS rules do not allow", func(s dnsproxy.Stats) uint64 { return s.Refused }),
		counter("fqdn_proxy_dropped_total", "DNS queries dropped: over the concurrency bound or not steered", func(s dnsproxy.Stats) uint64 { return s.Dropped }),
		counter("fqdn_proxy_forward_failures_total", "DNS queries whose server did not answer in time", func(s dnsproxy.Stats) uint64 { return s.ForwardFails }),
		counter("fqdn_proxy_send_failures_total", "DNS answers that could not be sent from their server's address (a DNS server in the agent's namespace without SO_REUSEADDR)", func(s dnsproxy.Stats) uint64 { return s.SendFails }),
	}}
}
