// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
	"github.com/ipcache-agent/ipcache-agent/internal/yamldir"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// loader keeps the policies of the valid files of the policy directory in
// force: in the `policies` table, and in the ipcache through one resource
// handle per policy. A file is the unit of validity: a file that cannot be
// read or parsed, or that uses a policy name another file in force has,
// is rejected and keeps the version that was in force before (if any).
//
// Only the directory job calls load; Status may be called from
// anywhere.
type loader struct {
	dir      string
	db       *statedb.DB
	policies statedb.RWTable[*policy.Policy]
	ipcache  *ipcachecell.IPCache
	log      *slog.Logger
	// maxEntries is the policy map's size: a file whose policies compute
	// more entries is rejected (CountEntries).
	maxEntries int
	// fqdnEnforced: the hive has a DNS proxy (policy.FQDNEnforcer), so
	// files with toFQDNs and DNS rules are taken; without, they are
	// rejected (notEnforced).
	fqdnEnforced bool

	// initialized marks the first complete read applied; nil once done.
	initialized func()

	files      yamldir.Versions[[]*policy.Policy] // each file's content and version in force
	read       yamldir.ReadCache                  // the files read, to take again those unchanged
	inForce    map[string]*policy.Policy          // by policy name: what the table and the handles say
	handles    map[string]*ipcachecell.Handle     // by policy name
	handleErrs map[string]error                   // policies whose handle could not be obtained

	// saved is the versions in force saved in the state directory, which
	// the first load restores (readOnce: done).
	saved    savedInForce
	readOnce bool

	mu     sync.Mutex
	status []fileStatus // for the shell, sorted by file
	err    error        // why the directory could not be read, if it could not
}

// fileStatus is one policy file as the loader last saw it.
type fileStatus struct {
	File string
	// Policies are the names of the file's policies in force.
	Policies []string
	// Error is why the file's current content is rejected; nil if it is in
	// force.
	Error error
}

func newLoader(dir string, db *statedb.DB, policies statedb.RWTable[*policy.Policy], ipcache *ipcachecell.IPCache,
	log *slog.Logger, initialized func()) *loader {
	l := &loader{
		dir:         dir,
		db:          db,
		policies:    policies,
		ipcache:     ipcache,
		log:         log,
		maxEntries:  DefaultPolicyMapMaxEntries,
		initialized: initialized,
		inForce:     map[string]*policy.Policy{},
		handles:     map[string]*ipcachecell.Handle{},
		handleErrs:  map[string]error{},
	}
	l.files = yamldir.Versions[[]*policy.Policy]{
		Parse: l.parse,
		Empty: func(policies []*policy.Policy) bool { return len(policies) == 0 },
		// Truncated by an editor before it writes the file again, or
		// emptied by mistake: removing the file is how its policies are
		// removed.
		EmptyError: func(file string) error { return &policyfile.FileError{File: file, Err: ErrEmptyFile} },
		ReadError:  func(file string, err error) error { return &policyfile.FileError{File: file, Err: err} },
		Claims:     policyNames,
		Conflict:   conflict,
	}
	return l
}

// saveInForceIn makes the loader save the versions in force in stateDir
// and restore them at its first load. Call it before the first load.
func (l *loader) saveInForceIn(stateDir string) {
	if stateDir != "" {
		l.saved.path = filepath.Join(stateDir, InForceFileName)
	}
}

// load reads the directory and brings the policies in force, the
// `policies` table and the handles in line with it. It returns the
// directories to watch. The first load starts from the versions in force
// that the previous run saved.
//
// Possible errors: the directory cannot be read; nothing changes then.
func (l *loader) load(ctx context.Context) (watchDirs []string, err error) {
	if !l.readOnce {
		l.readOnce = true
		l.restoreInForce()
	}
	found, err := policyDir(l.dir).ReadCached(&l.read)
	if err != nil {
		err = fmt.Errorf("read policy directory %s: %w", l.dir, err)
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		return nil, err
	}
	for _, name := range l.files.Update(found) {
		l.log.Info("Policy file removed", "file", name)
	}
	l.decide()
	// Saved before the ipcache and the table change: a restart from here
	// on starts from what was just decided.
	l.saveInForce()
	// The status is published before the table changes, so that whoever
	// sees the table's new content (a script's db/cmp, then policy/list)
	// also sees the status that goes with it.
	l.report()
	l.apply(ctx)
	if l.initialized != nil {
		l.initialized()
		l.initialized = nil
		l.log.Info("Policy directory read", "dir", l.dir, "files", l.files.Len(), "policies", len(l.inForce))
	}
	return found.WatchDirs, nil
}

// parse parses a file and counts its entries. A file over the policy
// map's size, or with rules this agent does not enforce (notEnforced,
// without a DNS proxy), is rejected before anything of it is expanded, and
// nothing of it is kept: its parsed policies go with the error. The file's
// warnings are logged, each time a version of it is read.
func (l *loader) parse(name string, content []byte) ([]*policy.Policy, error) {
	parsed, err := policyfile.ParseFile(name, content)
	if err != nil {
		return nil, err
	}
	for _, w := range parsed.Warnings {
		l.log.Warn("Policy file read otherwise than written", "file", name, "warning", w.String())
	}
	policies := parsed.Policies
	if !l.fqdnEnforced {
		if err := notEnforced(name, policies); err != nil {
			return nil, err
		}
	}
	if _, err := CountEntries(name, policies, l.maxEntries); err != nil {
		return nil, err
	}
	return policies, nil
}

// decide chooses the version of each file in force (yamldir.Versions.Decide:
// a file that uses a policy name another file holds is rejected) and logs
// what changed.
func (l *loader) decide() {
	for _, c := range l.files.Decide() {
		switch c.Kind {
		case yamldir.Accepted:
			l.log.Info("Policy file in force", "file", c.File, "policies", policyNames(c.InForce))
		case yamldir.ValidAgain:
			// Rejected (emptied, say) and now back to the version in
			// force: the warning had its line, so has its end.
			l.log.Info("Policy file valid again, its version in force is unchanged",
				"file", c.File, "policies", policyNames(c.InForce))
		case yamldir.Rejected:
			what := "Policy file rejected, its previous version stays in force"
			switch {
			case len(c.InForce) == 0:
				what = "Policy file rejected, none of its policies are in force"
			case c.Restored:
				what = "Policy file rejected, its version in force before the restart stays in force"
			}
			l.log.Warn(what, "file", c.File, "in-force", policyNames(c.InForce), "error", c.Err)
		}
	}
}

// conflict returns the error for the first of a file's policies whose name
// another file holds.
func conflict(file string, policies []*policy.Policy, holder map[string]string) error {
	for _, p := range policies {
		if other, held := holder[p.Name]; held && other != file {
			return &policyfile.FileError{File: file, Line: p.Line,
				Err: fmt.Errorf("%w: policy %q is in force from %s", ErrNameInUse, p.Name, other)}
		}
	}
	return nil
}

func policyNames(policies []*policy.Policy) []string {
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	return names
}

// apply writes the policies in force to the handles and the `policies`
// table. New prefixes go to the ipcache, and are resolved into identities,
// before the table changes; prefixes are removed after. So a policy is in
// force only once its prefixes have identities (its policy entries exist
// before the datapath's enforcement of it switches on), and an edit never
// leaves a prefix without metadata while a policy still selects it.
func (l *loader) apply(ctx context.Context) {
	want := map[string]*policy.Policy{}
	for _, inForce := range l.files.InForce() {
		for _, p := range inForce {
			want[p.Name] = p
		}
	}
	type edit struct{ old, new *policy.Policy }
	var edits []edit
	for _, name := range slices.Sorted(maps.Keys(want)) {
		p, old := want[name], l.inForce[name]
		_, missingHandle := l.handleErrs[name]
		if old != nil && old.Equal(p) && !missingHandle {
			continue
		}
		edits = append(edits, edit{old, p})
	}
	var removed []*policy.Policy
	for _, name := range slices.Sorted(maps.Keys(l.inForce)) {
		if _, ok := want[name]; !ok {
			removed = append(removed, l.inForce[name])
		}
	}

	for _, e := range edits {
		l.upsertPrefixes(e.old, e.new)
	}
	if len(edits) > 0 {
		if err := l.ipcache.WaitResolved(ctx); err != nil {
			return // stopping
		}
	}
	txn := l.db.WriteTxn(l.policies)
	for _, e := range edits {
		if e.old != nil && e.old.Equal(e.new) {
			continue // only the handle is retried
		}
		if _, _, err := l.policies.Insert(txn, e.new); err != nil {
			// Only a bug can make an insert into a locked table fail.
			l.log.Error("BUG: cannot write policy", "policy", e.new.Name, "error", err)
		}
	}
	for _, p := range removed {
		if _, _, err := l.policies.Delete(txn, p); err != nil {
			l.log.Error("BUG: cannot delete policy", "policy", p.Name, "error", err)
		}
	}
	txn.Commit()
	for _, e := range edits {
		l.removePrefixes(e.old, e.new)
	}
	for _, p := range removed {
		l.release(p)
	}
	l.inForce = want
}

// upsertPrefixes puts the prefixes of p that old did not have into the
// ipcache, through p's handle (obtained if p has none).
func (l *loader) upsertPrefixes(old, p *policy.Policy) {
	h := l.handles[p.Name]
	if h == nil {
		var err error
		if h, err = l.ipcache.NewHandle(p.Resource(), source.Directory); err != nil {
			l.handleErrs[p.Name] = fmt.Errorf("policy %q from %s: %w", p.Name, p.File, err)
			l.log.Error("Cannot own the policy's prefixes in the ipcache, retrying at the next read",
				"policy", p.Name, "file", p.File, "error", err)
			return
		}
		l.handles[p.Name] = h
		delete(l.handleErrs, p.Name)
		old = nil // a new handle owns nothing yet
	}
	var had []netip.Prefix
	if old != nil {
		had = old.Prefixes()
	}
	prefixes := p.Prefixes()
	// Made at its size when all are new: a policy may have a hundred
	// thousand prefixes.
	batch := make([]ipcachecell.PrefixUpsert, 0, max(len(prefixes)-len(had), 0))
	for _, prefix := range prefixes {
		if _, found := slices.BinarySearchFunc(had, prefix, prefixkey.Compare); !found {
			batch = append(batch, ipcachecell.PrefixUpsert{Prefix: prefix,
				Metadata: ipcachecell.Metadata{Labels: labels.ForPrefix(prefix)}})
		}
	}
	if err := h.UpsertBatch(batch); err != nil {
		l.log.Error("Cannot upsert the policy's prefixes into the ipcache", "policy", p.Name, "error", err)
	}
}

// removePrefixes removes the prefixes of old that p no longer has.
func (l *loader) removePrefixes(old, p *policy.Policy) {
	h := l.handles[p.Name]
	if old == nil || h == nil {
		return
	}
	has := p.Prefixes()
	var gone []netip.Prefix
	for _, prefix := range old.Prefixes() {
		if _, found := slices.BinarySearchFunc(has, prefix, prefixkey.Compare); !found {
			gone = append(gone, prefix)
		}
	}
	if err := h.RemoveBatch(gone); err != nil {
		l.log.Error("Cannot remove the policy's old prefixes from the ipcache", "policy", p.Name, "error", err)
	}
}

// release gives up the handle of a policy that is no longer in force.
func (l *loader) release(p *policy.Policy) {
	delete(l.handleErrs, p.Name)
	h := l.handles[p.Name]
	if h == nil {
		return
	}
	delete(l.handles, p.Name)
	if err := h.Release(); err != nil {
		l.log.Error("Cannot release the policy's ipcache handle", "policy", p.Name, "error", err)
	}
	l.log.Info("Policy removed", "policy", p.Name)
}

// report publishes the files' status for Status and health.
func (l *loader) report() {
	status := make([]fileStatus, 0, l.files.Len())
	for _, f := range l.files.Status() {
		status = append(status, fileStatus{File: f.File, Policies: policyNames(f.InForce), Error: f.Err})
	}
	l.mu.Lock()
	l.status, l.err = status, nil
	l.mu.Unlock()
}

// Status returns the status of each policy file, sorted by name, and
// the error that kept the loader from reading the directory (nil if the
// last read worked).
func (l *loader) Status() ([]fileStatus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status, l.err
}

// reportHealth says how many policies are in force, or which files are
// rejected and why.
func (l *loader) reportHealth(health cell.Health) {
	status, err := l.Status()
	if err != nil {
		health.Degraded("Cannot read the policy directory, policies stay as they were", err)
		return
	}
	var errs []error
	for _, s := range status {
		if s.Error != nil {
			errs = append(errs, s.Error)
		}
	}
	rejected := len(errs)
	for _, name := range slices.Sorted(maps.Keys(l.handleErrs)) {
		errs = append(errs, l.handleErrs[name])
	}
	if l.saved.err != nil {
		errs = append(errs, l.saved.err)
	}
	if len(errs) > 0 {
		health.Degraded(fmt.Sprintf("%d policies in force from %d files; %d files rejected (their previous versions stay in force), %d policies without ipcache handle",
			len(l.inForce), len(status), rejected, len(l.handleErrs)), errors.Join(errs...))
		return
	}
	health.OK(fmt.Sprintf("%d policies in force from %d files", len(l.inForce), len(status)))
}
