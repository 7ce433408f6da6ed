// SPDX-License-Identifier: Apache-2.0

package endpointcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/hive/cell"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointfile"
	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// InForceFileName is the file in the state directory that holds the
// endpoint files' versions in force, for a restart.
const InForceFileName = "endpoints-in-force.json"

// directory is the --endpoint-dir source: the files' versions in force
// (yamldir.Versions), saved for restarts, applied through one
// endpoint.Source. One job runs it.
type directory struct {
	log      *slog.Logger
	dir      yamldir.Dir
	read     yamldir.ReadCache // the files read, to take again those unchanged
	saved    yamldir.Saved
	versions yamldir.Versions[endpointfile.Documents]
	source   endpoint.Source
	setNS    func(name string, labels map[string]string) error
	// setNodes takes the Node documents in force; nil: they are not
	// applied (a hive without the node cell).
	setNodes func([]endpoint.Node) error

	readOnce  bool
	savedKey  [32]byte
	hasSaved  bool
	saveAgain bool
	// applied are the endpoints and namespaces as last applied, by ID
	// and name, and the file each came from.
	applied   map[string]endpoint.Endpoint
	appliedNS map[string]map[string]string
	fileOf    map[string]string
	failed    map[string]error // endpoint ID -> why its upsert failed
	unhealthy error

	// appliedNodes are the Node documents as last applied, and
	// nodesFailed why they could not be, if so.
	appliedNodes []endpoint.Node
	nodesFailed  error
}

func newDirectory(log *slog.Logger, path, stateDir string, source endpoint.Source, setNS func(string, map[string]string) error) *directory {
	d := &directory{
		log:       log,
		dir:       yamldir.Dir{Path: path, MaxSize: endpointfile.MaxSize, What: "endpoint"},
		source:    source,
		setNS:     setNS,
		applied:   map[string]endpoint.Endpoint{},
		appliedNS: map[string]map[string]string{},
		fileOf:    map[string]string{},
		failed:    map[string]error{},
	}
	if stateDir != "" {
		d.saved = yamldir.Saved{Path: filepath.Join(stateDir, InForceFileName), DirKey: "endpointDir",
			Name: "endpoints in force", MaxSize: 4 * endpointfile.MaxSize}
	}
	d.versions = yamldir.Versions[endpointfile.Documents]{
		Parse: endpointfile.Parse,
		Empty: func(docs endpointfile.Documents) bool {
			return len(docs.Endpoints)+len(docs.Namespaces)+len(docs.Nodes) == 0
		},
		EmptyError: func(file string) error { return &endpointfile.FileError{File: file, Err: ErrEmptyFile} },
		ReadError:  func(file string, err error) error { return &endpointfile.FileError{File: file, Err: err} },
		Claims:     claims,
		Conflict:   conflict,
	}
	return d
}

// claims are what a file holds alone among the files in force: its
// endpoints' names and addresses, its namespaces and nodes.
func claims(docs endpointfile.Documents) []string {
	var c []string
	for _, ep := range docs.Endpoints {
		c = append(c, "endpoint "+ep.ID())
		for _, a := range ep.Addresses {
			c = append(c, "address "+a.String())
		}
	}
	for _, ns := range docs.Namespaces {
		c = append(c, "namespace "+ns.Name)
	}
	for _, n := range docs.Nodes {
		c = append(c, "node "+n.Name)
	}
	return c
}

func conflict(file string, docs endpointfile.Documents, holder map[string]string) error {
	for _, c := range claims(docs) {
		if other, held := holder[c]; held && other != file {
			return &endpointfile.FileError{File: file, Err: fmt.Errorf("%w: %s is in force from %s", ErrClaimed, c, other)}
		}
	}
	return nil
}

// watch reads the directory at start, whenever it changes and
// periodically; the source is initialized after the first complete read.
func (d *directory) watch(ctx context.Context, health cell.Health) error {
	return d.dir.Watch(ctx, d.log, yamldir.DefaultTiming(), func(ctx context.Context) ([]string, bool, error) {
		dirs, err := d.load()
		switch {
		case err != nil:
			health.Degraded("Endpoint directory unreadable", err)
		case d.unhealthy != nil:
			health.Degraded("Endpoint files rejected", d.unhealthy)
		default:
			health.OK(fmt.Sprintf("%d endpoint files in force", d.versions.Len()))
		}
		return dirs, d.saveAgain || len(d.failed) > 0 || d.nodesFailed != nil, err
	})
}

// load reads the directory once and applies what is in force.
func (d *directory) load() ([]string, error) {
	if !d.readOnce {
		d.readOnce = true
		d.restore()
	}
	found, err := d.dir.ReadCached(&d.read)
	if err != nil {
		return nil, fmt.Errorf("read endpoint directory %s: %w", d.dir.Path, err)
	}
	for _, name := range d.versions.Update(found) {
		d.log.Info("Endpoint file removed", "file", name)
	}
	var rejected []error
	for _, c := range d.versions.Decide() {
		switch c.Kind {
		case yamldir.Accepted:
			d.log.Info("Endpoint file in force", "file", c.File, "endpoints", len(c.InForce.Endpoints))
		case yamldir.ValidAgain:
			d.log.Info("Endpoint file valid again, its version in force is unchanged", "file", c.File)
		case yamldir.Rejected:
			d.log.Warn("Endpoint file rejected, its version in force stays", "file", c.File,
				"in-force", len(c.InForce.Endpoints), "error", c.Err)
		}
	}
	for _, st := range d.versions.Status() {
		if st.Err != nil {
			rejected = append(rejected, st.Err)
		}
	}
	d.save()
	d.apply()
	for id, err := range d.failed {
		rejected = append(rejected, fmt.Errorf("%s: %w", d.fileOf[id], err))
	}
	if d.nodesFailed != nil {
		rejected = append(rejected, d.nodesFailed)
	}
	d.unhealthy = errors.Join(rejected...)
	// The Node documents' addresses are written (apply) before the
	// source says it is initialized, which lets the ipcache initialize.
	if d.source != nil {
		d.source.Initialized()
	}
	return found.WatchDirs, nil
}

// apply brings the registry to the versions in force: namespaces first
// (their labels are part of identities), then the endpoints that are new
// or changed, then those that went.
func (d *directory) apply() {
	want := map[string]endpoint.Endpoint{}
	wantNS := map[string]map[string]string{}
	var wantNodes []endpoint.Node
	fileOf := map[string]string{}
	inForce := d.versions.InForce()
	for _, file := range slices.Sorted(maps.Keys(inForce)) {
		docs := inForce[file]
		wantNodes = append(wantNodes, docs.Nodes...)
		for _, ep := range docs.Endpoints {
			want[ep.ID()], fileOf[ep.ID()] = ep, file
		}
		for _, ns := range docs.Namespaces {
			wantNS[ns.Name] = ns.Labels
			if wantNS[ns.Name] == nil {
				wantNS[ns.Name] = map[string]string{}
			}
		}
	}
	for name, lbls := range wantNS {
		if have, ok := d.appliedNS[name]; !ok || !maps.Equal(have, lbls) {
			if err := d.setNS(name, lbls); err != nil {
				d.log.Error("Endpoints of a namespace keep their identities", "namespace", name, "error", err)
			}
		}
	}
	for name := range d.appliedNS {
		if _, ok := wantNS[name]; !ok {
			if err := d.setNS(name, nil); err != nil {
				d.log.Error("Endpoints of a namespace keep their identities", "namespace", name, "error", err)
			}
		}
	}
	d.appliedNS = wantNS
	d.applyNodes(wantNodes)
	for _, id := range slices.Sorted(maps.Keys(want)) {
		ep := want[id]
		if have, ok := d.applied[id]; ok && sameEndpoint(have, ep) && d.failed[id] == nil {
			continue
		}
		if _, err := d.source.Upsert(ep); err != nil {
			if d.failed[id] == nil || d.failed[id].Error() != err.Error() {
				d.log.Error("Endpoint not registered", "file", fileOf[id], "endpoint", id, "error", err)
			}
			d.failed[id] = err
			continue
		}
		delete(d.failed, id)
		d.applied[id] = ep
	}
	for id := range d.applied {
		if _, ok := want[id]; ok {
			continue
		}
		if err := d.source.Delete(id); err != nil {
			d.log.Error("Endpoint not removed", "endpoint", id, "error", err)
			continue
		}
		delete(d.applied, id)
	}
	for id := range d.failed {
		if _, ok := want[id]; !ok {
			delete(d.failed, id)
		}
	}
	d.fileOf = fileOf
}

// applyNodes gives the node cell the Node documents in force when they
// changed, or when it could not take them the last time.
func (d *directory) applyNodes(nodes []endpoint.Node) {
	if d.setNodes == nil {
		return
	}
	if d.nodesFailed == nil && slices.EqualFunc(nodes, d.appliedNodes, func(a, b endpoint.Node) bool {
		return a.Name == b.Name && slices.Equal(a.Addresses, b.Addresses)
	}) {
		return
	}
	if err := d.setNodes(nodes); err != nil {
		if d.nodesFailed == nil {
			d.log.Error("Addresses of the Node documents not applied", "error", err)
		}
		d.nodesFailed = fmt.Errorf("node addresses: %w", err)
		return
	}
	d.nodesFailed = nil
	d.appliedNodes = nodes
}

// restore puts the versions in force that the previous run saved in
// place, before the directory is first read.
func (d *directory) restore() {
	if d.saved.Path == "" {
		return
	}
	if err := atomicfile.RemoveTemps(d.saved.Path); err != nil {
		d.log.Warn("Cannot remove stale temporary files of the saved endpoints in force", "path", d.saved.Path, "error", err)
	}
	files, otherDir, err := d.saved.Read(d.dir)
	switch {
	case errors.Is(err, yamldir.ErrCorruptSaved):
		aside, _ := statedir.SetAside(d.saved.Path)
		d.log.Error("Saved endpoints in force are corrupt; moved aside, starting from the endpoint files alone",
			"path", d.saved.Path, "moved-to", aside, "error", err)
		return
	case err != nil:
		d.log.Error("Cannot read the saved endpoints in force, starting from the endpoint files alone", "path", d.saved.Path, "error", err)
		return
	case otherDir != "":
		d.log.Info("Saved endpoints in force are of another endpoint directory, not restored", "saved-for", otherDir, "dir", d.dir.Path)
		return
	}
	holder := map[string]string{}
	for _, f := range files {
		docs, err := endpointfile.Parse(f.File, []byte(f.Content))
		if err == nil {
			err = conflict(f.File, docs, holder)
		}
		if err != nil {
			d.log.Warn("Saved version of an endpoint file not restored", "file", f.File, "error", err)
			continue
		}
		for _, c := range claims(docs) {
			holder[c] = f.File
		}
		d.versions.Restore(f.File, []byte(f.Content), docs)
	}
	if len(files) > 0 {
		d.log.Info("Restored the endpoint files in force before the restart", "files", len(files))
	}
}

// save saves the versions in force if they changed since the last save.
func (d *directory) save() {
	if d.saved.Path == "" {
		return
	}
	contents, digests := d.versions.InForceContents()
	key := yamldir.SaveKey(digests)
	if d.hasSaved && key == d.savedKey {
		return
	}
	left, err := d.saved.Write(d.dir.Path, contents)
	d.savedKey, d.hasSaved, d.saveAgain = key, err == nil, err != nil
	switch {
	case err != nil:
		d.log.Error("Cannot save the endpoints in force for a restart, retrying", "path", d.saved.Path, "error", err)
	case len(left) > 0:
		d.log.Error("Cannot save all endpoints in force: after a restart, an invalid file among those not saved has nothing in force",
			"path", d.saved.Path, "left-out", strings.Join(left, ", "))
	}
}

func sameEndpoint(a, b endpoint.Endpoint) bool {
	return a.ID() == b.ID() && a.Interface == b.Interface && a.Node == b.Node &&
		maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Addresses, b.Addresses)
}
