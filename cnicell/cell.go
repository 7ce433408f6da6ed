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

// DefaultSockName is the endpoint socket's name in the state directory
// when --cni-sock-path does not say: with the default --state-dir it is
// endpointapi.DefaultSockPath, where the plugin looks by default.
const DefaultSockName = "cni.sock"

// Config is the cell's configuration.
type Config struct {
	// CNISockPath is the endpoint socket; empty is DefaultSockName in the
	// state directory (none without a state directory). Agents of
	// different state directories thus serve different sockets unless
	// told otherwise.
	CNISockPath string
}

// DefaultConfig is the configuration on the defaults.
var DefaultConfig = Config{}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("cni-sock-path", def.CNISockPath,
		"Socket the CNI plugin registers endpoints on, root only (default <state-dir>/"+DefaultSockName+", which is "+endpointapi.DefaultSockPath+" on the default --state-dir)")
}

// sockPath is the socket the configuration names, empty for none.
func sockPath(cfg Config, dir statedir.Config) string {
	if cfg.CNISockPath != "" {
		return cfg.CNISockPath
	}
	if dir.StateDir == "" {
		return ""
	}
	return filepath.Join(dir.StateDir, DefaultSockName)
}

type serverParams struct {
	cell.In

	Config   Config
	StateDir statedir.Config
	Registry endpoint.Registry
	Log      *slog.Logger
}

func newServer(p serverParams) *server {
	path := sockPath(p.Config, p.StateDir)
	if path == "" {
		return nil
	}
	s := &server{
		sockPath: path,
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
// (as it is unless --cni-sock-path puts it elsewhere), so that `cleanup`
// removes both.
func stateFiles(cfg Config, dir statedir.Config) stateFilesOut {
	files := []statedir.File{{Name: StateFileName, Description: "endpoints the CNI plugin registered"}}
	if path := sockPath(cfg, dir); path != "" && filepath.Dir(filepath.Clean(path)) == filepath.Clean(dir.StateDir) {
		files = append(files, statedir.File{Name: filepath.Base(path), Description: "CNI endpoint socket"})
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
