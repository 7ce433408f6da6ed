// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/testutils/policygen"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/policy"
	"github.com/ipcache-agent/ipcache-agent/policyfile"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// loaderFixture is a loader on a running ipcache, driven by the test.
type loaderFixture struct {
	dir         string
	db          *statedb.DB
	policies    statedb.RWTable[*policy.Policy]
	metadata    statedb.Table[*ipcachecell.PrefixMetadata]
	loader      *loader
	initialized atomic.Int32
}

func newLoaderFixture(t *testing.T, dir string) *loaderFixture {
	f := &loaderFixture{dir: dir}
	var ipcache *ipcachecell.IPCache
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(cell.NewSimpleHealth),
		cell.Config(statedir.DefaultConfig),
		identitycell.Cell,
		ipcachecell.Cell,
		cell.Invoke(func(db *statedb.DB, c *ipcachecell.IPCache, m statedb.Table[*ipcachecell.PrefixMetadata]) (err error) {
			f.db, ipcache, f.metadata = db, c, m
			f.policies, err = newPoliciesTable(db)
			return err
		}),
	)
	hive.AddConfigOverride(h, func(c *statedir.Config) { c.StateDir = "" })
	log := hivetest.Logger(t)
	require.NoError(t, h.Start(log, context.Background()))
	t.Cleanup(func() { require.NoError(t, h.Stop(log, context.Background())) })
	f.loader = newLoader(dir, f.db, f.policies, ipcache, log, func() { f.initialized.Add(1) })
	return f
}

func (f *loaderFixture) write(t *testing.T, name, content string) {
	t.Helper()
	writeFile(t, filepath.Join(f.dir, name), content)
}

func (f *loaderFixture) load(t *testing.T) {
	t.Helper()
	_, err := f.loader.load(context.Background())
	require.NoError(t, err)
}

// inForce returns policy name -> file from the `policies` table.
func (f *loaderFixture) inForce() map[string]string {
	out := map[string]string{}
	for p := range f.policies.All(f.db.ReadTxn()) {
		out[p.Name] = p.File
	}
	return out
}

// owned returns the prefixes of a resource in the ipcache metadata.
func (f *loaderFixture) owned(resource string) []string {
	var out []string
	for m := range f.metadata.All(f.db.ReadTxn()) {
		if m.Resource() == resource {
			out = append(out, m.Prefix().String())
		}
	}
	slices.Sort(out)
	return out
}

func (f *loaderFixture) rejected() map[string]error {
	status, _ := f.loader.Status()
	out := map[string]error{}
	for _, s := range status {
		if s.Error != nil {
			out[s.File] = s.Error
		}
	}
	return out
}

// TestLoaderPolicyMovesBetweenFiles: a policy that moves from one file to
// another in one change is accepted whichever file is tried first.
func TestLoaderPolicyMovesBetweenFiles(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "b.yaml", "name: moving\negress: [{toCIDR: [10.0.0.0/8]}]\n")
	f.load(t)
	require.Equal(t, map[string]string{"moving": "b.yaml"}, f.inForce())
	require.EqualValues(t, 1, f.initialized.Load())

	// a.yaml is tried first, while b.yaml still holds the name.
	f.write(t, "a.yaml", "name: moving\negress: [{toCIDR: [10.0.0.0/8, 192.0.2.0/24]}]\n")
	f.write(t, "b.yaml", "name: other\n")
	f.load(t)
	require.Equal(t, map[string]string{"moving": "a.yaml", "other": "b.yaml"}, f.inForce())
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"10.0.0.0/8", "192.0.2.0/24"}, f.owned("policy/moving"),
		"the policy kept its handle and gained a prefix")
	require.EqualValues(t, 1, f.initialized.Load(), "initialized once")
}

// TestLoaderNameConflict: the first file (by name) wins a new name; the
// other is rejected until the name is free.
func TestLoaderNameConflict(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "a.yaml", "name: x\negress: [{toCIDR: [10.0.0.0/8]}]\n")
	f.write(t, "b.yaml", "name: y\n---\nname: x\negress: [{toCIDR: [11.0.0.0/8]}]\n")
	f.load(t)
	require.Equal(t, map[string]string{"x": "a.yaml"}, f.inForce())
	require.ErrorIs(t, f.rejected()["b.yaml"], ErrNameInUse)
	require.EqualError(t, f.rejected()["b.yaml"], `b.yaml:3: policy name already in use: policy "x" is in force from a.yaml`)

	require.NoError(t, os.Remove(filepath.Join(f.dir, "a.yaml")))
	f.load(t)
	require.Equal(t, map[string]string{"x": "b.yaml", "y": "b.yaml"}, f.inForce())
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"11.0.0.0/8"}, f.owned("policy/x"))
}

// TestLoaderBadFileKeepsPrevious: a rejected edit keeps the version in
// force, prefixes included; a later valid edit replaces it.
func TestLoaderBadFileKeepsPrevious(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/8]}]\n")
	f.load(t)
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/8, 10.0.0.300/8]}]\n")
	f.load(t)
	require.ErrorIs(t, f.rejected()["a.yaml"], policyfile.ErrInvalidPolicy)
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())
	require.Equal(t, []string{"10.0.0.0/8"}, f.owned("policy/a"))

	// Unreadable (here: a symlink out of the directory) is rejected too.
	outside := filepath.Join(t.TempDir(), "a.yaml")
	writeFile(t, outside, "name: a\n")
	require.NoError(t, os.Remove(filepath.Join(f.dir, "a.yaml")))
	require.NoError(t, os.Symlink(outside, filepath.Join(f.dir, "a.yaml")))
	f.load(t)
	require.ErrorIs(t, f.rejected()["a.yaml"], ErrOutsideDirectory)
	require.Equal(t, []string{"10.0.0.0/8"}, f.owned("policy/a"))

	require.NoError(t, os.Remove(filepath.Join(f.dir, "a.yaml")))
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [172.16.0.0/12]}]\n")
	f.load(t)
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"172.16.0.0/12"}, f.owned("policy/a"), "the edit upserts the new prefix and removes the old")

	require.NoError(t, os.Remove(filepath.Join(f.dir, "a.yaml")))
	f.load(t)
	require.Empty(t, f.inForce())
	require.Empty(t, f.owned("policy/a"), "the handle is released")
}

// TestLoaderEmptyFileKeepsPrevious: a file that has no policies any more
// keeps the version in force until it has content again or is removed.
func TestLoaderEmptyFileKeepsPrevious(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/8]}]\n")
	f.load(t)
	for _, empty := range []string{"", " \n   \n", "# later\n", "---\n---\n", "---\n# a comment\n...\n", "~\n"} {
		f.write(t, "a.yaml", empty)
		f.load(t)
		require.ErrorIs(t, f.rejected()["a.yaml"], ErrEmptyFile, "%q", empty)
		require.EqualError(t, f.rejected()["a.yaml"], "a.yaml: "+ErrEmptyFile.Error())
		require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce(), "%q", empty)
		require.Equal(t, []string{"10.0.0.0/8"}, f.owned("policy/a"), "%q", empty)
	}

	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [172.16.0.0/12]}]\n")
	f.load(t)
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"172.16.0.0/12"}, f.owned("policy/a"))

	require.NoError(t, os.Remove(filepath.Join(f.dir, "a.yaml")))
	f.load(t)
	require.Empty(t, f.inForce(), "removing the file removes its policies")
	require.Empty(t, f.owned("policy/a"))

	// Nothing to keep: a new empty file is in force with no policies.
	f.write(t, "b.yaml", "")
	f.load(t)
	require.Empty(t, f.rejected())
}

// TestLoaderFileTooLarge: a file over the cap is rejected with an error
// that names it and the cap.
func TestLoaderFileTooLarge(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "huge.yaml", "name: a\n")
	f.load(t)
	require.NoError(t, os.Truncate(filepath.Join(f.dir, "huge.yaml"), maxFileSize+1))
	f.load(t)
	require.EqualError(t, f.rejected()["huge.yaml"], "huge.yaml: policy file too large: more than the cap of 4194304 bytes (4 MiB)")
	require.Equal(t, map[string]string{"a": "huge.yaml"}, f.inForce(), "its previous version stays in force")
}

// TestLoaderUnreadableDirectory: until the directory has been read once,
// the loader is not initialized (nothing may be pruned on its account).
func TestLoaderUnreadableDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	f := newLoaderFixture(t, dir)
	_, err := f.loader.load(context.Background())
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, "read policy directory "+dir)
	require.Zero(t, f.initialized.Load())
	_, statusErr := f.loader.Status()
	require.ErrorIs(t, statusErr, os.ErrNotExist)

	f.write(t, "a.yaml", "name: a\n")
	f.load(t)
	require.EqualValues(t, 1, f.initialized.Load())
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())
}

// TestLoaderEqualPolicyNotRewritten: reading the same content again, or a
// change elsewhere in the file, leaves unchanged policies alone.
func TestLoaderEqualPolicyNotRewritten(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/8]}]\n---\nname: b\n")
	f.load(t)
	revision := f.policies.Revision(f.db.ReadTxn())
	f.load(t)
	require.Equal(t, revision, f.policies.Revision(f.db.ReadTxn()))

	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/8]}]\n---\nname: b\ningress: [{fromCIDR: [192.0.2.0/24]}]\n")
	f.load(t)
	txn := f.db.ReadTxn()
	_, aRevision, _ := f.policies.Get(txn, PolicyNameIndex.Query("a"))
	require.LessOrEqual(t, aRevision, revision, "a did not change")
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		func() []netip.Prefix { p, _, _ := f.policies.Get(txn, PolicyNameIndex.Query("b")); return p.Prefixes() }())
}

// TestWatchDirectoryAppears runs the directory job on a directory that
// does not exist yet: it is retried, read once it appears, and watched.
func TestWatchDirectoryAppears(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	f := newLoaderFixture(t, dir)
	timing := watchTiming{debounce: 10 * time.Millisecond, maxDelay: 100 * time.Millisecond,
		resync: time.Hour, minRetry: 10 * time.Millisecond, maxRetry: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	_, health := cell.NewSimpleHealth()
	go func() { stopped <- f.loader.watchDirectory(ctx, health, timing) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})

	time.Sleep(100 * time.Millisecond)
	require.Zero(t, f.initialized.Load(), "not initialized while the directory cannot be read")

	f.write(t, "a.yaml", "name: a\n")
	require.Eventually(t, func() bool { return f.initialized.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())

	// Changes are seen through the watch (the periodic read is an hour away).
	f.write(t, "b.yaml", "name: b\n")
	require.Eventually(t, func() bool { return len(f.inForce()) == 2 }, 5*time.Second, 5*time.Millisecond)
}

// TestLoaderEmptiedFileValidAgainLogged: a file that was emptied (its
// version in force kept, with a warning) and has content again says so in
// the log, once, whether it is the version in force again or a new one.
func TestLoaderEmptiedFileValidAgainLogged(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	var log bytes.Buffer
	f.loader.log = slog.New(slog.NewTextHandler(&log, nil))
	v1, v2 := "name: a\negress: [{toCIDR: [10.0.0.0/8]}]\n", "name: a\negress: [{toCIDR: [172.16.0.0/12]}]\n"
	f.write(t, "a.yaml", v1)
	f.load(t)
	for _, tc := range []struct{ content, want string }{
		{v1, `msg="Policy file valid again, its version in force is unchanged" file=a.yaml policies=[a]`},
		{v2, `msg="Policy file in force" file=a.yaml policies=[a]`},
	} {
		f.write(t, "a.yaml", "")
		f.load(t)
		require.Contains(t, log.String(), "Policy file rejected, its previous version stays in force")
		log.Reset()
		f.write(t, "a.yaml", tc.content)
		f.load(t)
		require.Empty(t, f.rejected())
		require.Equal(t, 1, strings.Count(log.String(), "\n"), "one line: %s", log.String())
		require.Contains(t, log.String(), tc.want)
		log.Reset()
		f.load(t)
		require.Empty(t, log.String(), "said once")
	}
}

// TestLoaderLogsWarnings: a file the agent reads otherwise than written
// (a CIDR with host bits set) is in force as read, and the log says so at
// its position.
func TestLoaderLogsWarnings(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	var log bytes.Buffer
	f.loader.log = slog.New(slog.NewTextHandler(&log, nil))
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.5/8]}]\n")
	f.load(t)
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"10.0.0.0/8"}, f.owned("policy/a"))
	require.Contains(t, log.String(), `level=WARN msg="Policy file read otherwise than written" file=a.yaml `+
		`warning="a.yaml:2:20: policy \"a\": egress[0].toCIDR[0]: \"10.0.0.5/8\": host bits set, read as 10.0.0.0/8"`)
}

// TestLoaderRejectsFileOverPolicyMap: a file whose policies compute more
// entries than the policy map holds is rejected when it is read (the
// version in force stays), and nothing of it is kept: neither its content
// nor its policies, so the heap after the read is what it was before.
func TestLoaderRejectsFileOverPolicyMap(t *testing.T) {
	f := newLoaderFixture(t, t.TempDir())
	f.write(t, "a.yaml", "name: a\negress: [{toCIDR: [10.0.0.0/24], toPorts: [{port: 443}]}]\n")
	f.load(t)
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f.write(t, "a.yaml", string(policygen.CIDRsTimesPorts("a", 1000, 40)))
	f.load(t)
	runtime.GC()
	runtime.ReadMemStats(&after)

	require.ErrorIs(t, f.rejected()["a.yaml"], ErrTooManyEntries)
	require.Equal(t, map[string]string{"a": "a.yaml"}, f.inForce())
	require.Equal(t, []string{"10.0.0.0/24"}, f.owned("policy/a"), "nothing of the rejected file reached the ipcache")
	content, parsed, _ := f.loader.files.Current("a.yaml")
	require.Nil(t, parsed)
	require.Nil(t, content)
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap after the rejected read: %+d bytes", retained)
	require.Less(t, retained, int64(1<<20), "the rejected file's read left %d bytes on the heap", retained)

	// Fixed, it is in force.
	f.write(t, "a.yaml", string(policygen.CIDRsTimesPorts("a", 2, 1)))
	f.load(t)
	require.Empty(t, f.rejected())
	require.Equal(t, []string{"10.0.0.0/24", "10.0.1.0/24"}, f.owned("policy/a"))
}
