// SPDX-License-Identifier: Apache-2.0

package cnicell

import (
	"log/slog"
	"path/filepath"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// Cell serves the endpoint socket for the CNI plugin. It needs an
// endpoint.Registry in the hive.
var Cell = cell.Module(
	"cni",
	"Endpoints from the CNI plugin",

	cell.Config(DefaultConfig),
	cell.Provide(newServer, stateFiles),
	cell.Invoke(registerServer),
)

// Owner is the source the cell registers its endpoints as.
const Owner = "cni"

// StateFileName is the file in the state directory that holds the
// endpoints the plugin registered.
const StateFileName = "cni-endpoints.json"

// Config is the cell's configuration.
type Config struct {
	// CNISockPath is the endpoint socket; empty serves none.
	CNISockPath string
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{CNISockPath: endpointapi.DefaultSockPath}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cni-sock-path", def.CNISockPath,
		"Socket the CNI plugin registers endpoints on (root only; empty serves none)")
}

type serverParams struct {
	cell.In

	Config   Config
	StateDir statedir.Config
	Registry endpoint.Registry
	Log      *slog.Logger
}

func newServer(p serverParams) *server {
	if p.Config.CNISockPath == "" {
		return nil
	}
	s := &server{
		sockPath: p.Config.CNISockPath,
		registry: p.Registry,
		log:      p.Log,
		records:  make(map[string]record),
		requests: make(chan struct{}, maxRequests),
	}
	if p.StateDir.StateDir != "" {
		s.statePath = filepath.Join(p.StateDir.StateDir, StateFileName)
	}
	return s
}

type stateFilesOut struct {
	cell.Out

	Files []statedir.File `group:"state-files,flatten"`
}

// stateFiles declares the cell's files in the state directory: the
// endpoints it registered, and the socket when it is in the directory
// (as it is on the defaults), so that `cleanup` removes both.
func stateFiles(cfg Config, dir statedir.Config) stateFilesOut {
	files := []statedir.File{{Name: StateFileName, Description: "endpoints the CNI plugin registered"}}
	if cfg.CNISockPath != "" && dir.StateDir != "" && filepath.Dir(filepath.Clean(cfg.CNISockPath)) == filepath.Clean(dir.StateDir) {
		files = append(files, statedir.File{Name: filepath.Base(cfg.CNISockPath), Description: "CNI endpoint socket"})
	}
	return stateFilesOut{Files: files}
}

// registerServer registers the cell's source with the endpoint registry,
// the socket's start and stop, and the job that restores the registered
// endpoints and then serves the plugin.
func registerServer(s *server, lc cell.Lifecycle, jobs job.Registry, health cell.Health) error {
	if s == nil {
		return nil
	}
	if err := s.register(); err != nil {
		return err
	}
	lc.Append(cell.Hook{OnStart: s.listen, OnStop: s.close})
	jobs.NewGroup(health, job.WithLogger(s.log)).Add(job.OneShot("serve", s.run))
	return nil
}
