// SPDX-License-Identifier: Apache-2.0

package podcell

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/source"
)

const (
	// Resource is the name of the cell's ipcache resource handle.
	Resource = "pods"

	// Source is the source of the pods' metadata.
	Source = source.Kubernetes

	// ProducerName is the cell's name among the ipcache producers.
	ProducerName = "pods-file"
)

// Cell publishes the pods of --pods-file into the ipcache.
var Cell = cell.Module(
	"pods",
	"Pod IPs with explicit identities from a file",

	cell.Config(DefaultConfig),
	cell.Invoke(Config.Validate),
	cell.Invoke(registerPublisher),
)

// Config is the pods cell's configuration.
type Config struct {
	// PodsFile holds the pods, one "address identity" per line. Empty: no
	// pods, and the cell does nothing.
	PodsFile string

	// PodsFileInterval is how often the file is read again.
	PodsFileInterval time.Duration
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{PodsFile: "", PodsFileInterval: 10 * time.Second}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("pods-file", def.PodsFile,
		"File of pods, one 'address identity' line each (identity in 256..16777215); empty for no pods")
	flags.Duration("pods-file-interval", def.PodsFileInterval,
		"How often the pods file is read again; pods gone from it are removed")
}

// Validate reports configuration errors, naming the flag.
//
// Possible errors: --pods-file-interval is not positive.
func (c Config) Validate() error {
	if c.PodsFileInterval <= 0 {
		return fmt.Errorf("--pods-file-interval must be positive, got %s", c.PodsFileInterval)
	}
	return nil
}

type publisherParams struct {
	cell.In

	Config    Config
	IPCache   *ipcachecell.IPCache
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    cell.Health
	Log       *slog.Logger
}

// registerPublisher registers the cell as an ipcache producer (before the
// hive starts, as RegisterProducer requires), reads the file in a start
// hook and re-reads it in a timer job. Nothing touches the disk here: this
// also runs for `hive` and `hive dot-graph`.
func registerPublisher(p publisherParams) {
	if p.Config.PodsFile == "" {
		return
	}
	pub := &publisher{
		path:         p.Config.PodsFile,
		ipcache:      p.IPCache,
		log:          p.Log,
		producerDone: p.IPCache.RegisterProducer(ProducerName),
	}
	p.Lifecycle.Append(pub)
	group := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	// Added after the start hook, so it starts once the first read is in.
	// An error keeps the pods in force and degrades the cell's health.
	group.Add(job.Timer("pods-file", func(context.Context) error { return pub.sync() },
		p.Config.PodsFileInterval))
}
