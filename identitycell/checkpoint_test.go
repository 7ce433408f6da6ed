// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

func testCheckpoint(n int) Checkpoint {
	c := map[identity.Number]labels.Labels{}
	for i := range n {
		c[identity.MinLocal+identity.Number(i)] = cidr(i)
	}
	return checkpointOf(c)
}

// checkpointOf is the checkpoint of the given identities.
func checkpointOf(identities map[identity.Number]labels.Labels) Checkpoint {
	b := newCheckpointBuilder("test", len(identities))
	for id, lbls := range identities {
		if err := b.add(id, lbls); err != nil {
			panic(err)
		}
	}
	c, err := b.checkpoint()
	if err != nil {
		panic(err)
	}
	return c
}

// TestCheckpointLabels: a number is found wherever it is in the array,
// and a number not saved is not, whether the saved numbers are dense
// (each at the place its number gives) or sparse.
func TestCheckpointLabels(t *testing.T) {
	for name, ids := range map[string][]identity.Number{
		"dense":  {identity.MinLocal, identity.MinLocal + 1, identity.MinLocal + 2, identity.MinLocal + 3},
		"sparse": {identity.MinLocal + 1, identity.MinLocal + 5, identity.MinLocal + 6, identity.MinLocal + 900, identity.MinLocal + 901},
		"one":    {identity.MinLocal + 7},
		"none":   nil,
	} {
		saved := map[identity.Number]labels.Labels{}
		for i, id := range ids {
			saved[id] = cidr(i)
		}
		c := checkpointOf(saved)
		require.Equal(t, len(ids), c.Len(), name)
		for id := identity.MinLocal - 2; id < identity.MinLocal+1000; id++ {
			got, found := c.Labels(id)
			want, saved := saved[id]
			require.Equal(t, saved, found, "%s: identity %d", name, id)
			require.Equal(t, want, got, "%s: identity %d", name, id)
		}
		var listed []identity.Number
		for id, lbls := range c.All() {
			require.Equal(t, saved[id], lbls, name)
			listed = append(listed, id)
		}
		require.Equal(t, ids, listed, "%s: in number order", name)
	}
}

// A file not in number order (not the agent's, which writes that order)
// is read all the same, and a number listed twice anywhere in it is
// corrupt.
func TestCheckpointOutOfOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFileName)
	for _, content := range []string{
		"{\"version\":1,\"identities\":[\n{\"id\":16777219,\"labels\":\"a:c\"},\n{\"id\":16777217,\"labels\":\"a:a\"},\n{\"id\":16777218,\"labels\":\"a:b\"}\n]}\n",
		`{"version":1,"identities":[{"id":16777219,"labels":"a:c"},{"id":16777217,"labels":"a:a"},{"id":16777218,"labels":"a:b"}]}`,
	} {
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		got, err := ReadCheckpoint(path)
		require.NoError(t, err)
		want := map[identity.Number]labels.Labels{}
		for i, l := range []string{"a:a", "a:b", "a:c"} {
			lbls, err := labels.New(l)
			require.NoError(t, err)
			want[16777217+identity.Number(i)] = lbls
		}
		require.Equal(t, checkpointOf(want), got)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFileName)
	want := testCheckpoint(5)
	require.NoError(t, writeCheckpoint(path, want.All()))
	got, err := ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Empty(t, tempFiles(t, filepath.Dir(path)), "a write leaves no temporary file")
}

// What the writer writes is read by the fast path, not encoding/json; the
// same checkpoint laid out otherwise is read by encoding/json, the same.
func TestCheckpointAsWrittenTakesTheFastPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFileName)
	want := testCheckpoint(100)
	require.NoError(t, writeCheckpoint(path, want.All()))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	got, ok, err := decodeCheckpointAsWritten(path, data)
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, want, got)

	indented := bytes.ReplaceAll(data, []byte("\n{"), []byte("\n  {"))
	_, ok, _ = decodeCheckpointAsWritten(path, indented)
	require.False(t, ok)
	got, err = decodeCheckpoint(path, indented)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// A checkpoint decoded in parts is the one decoded in one pass, and a
// number listed twice, or out of order, across the border between two
// parts is found as it is within one.
func TestCheckpointDecodedInParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFileName)
	want := testCheckpoint(1000)
	require.NoError(t, writeCheckpoint(path, want.All()))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, parts := range []int{1, 2, 7, 2000} {
		got, ok, err := decodeCheckpointInParts(path, data, parts)
		require.True(t, ok, "%d parts", parts)
		require.NoError(t, err, "%d parts", parts)
		require.Equal(t, want, got, "%d parts", parts)
	}

	// The middle entry's number made its predecessor's: within a part, or
	// across a border (in 2000 parts, every separator is one).
	lines := bytes.Split(data, []byte("\n"))
	i := len(lines) / 2
	id, _, _ := bytes.Cut(bytes.TrimPrefix(lines[i-1], []byte(`{"id":`)), []byte(","))
	_, rest, _ := bytes.Cut(lines[i], []byte(","))
	lines[i] = fmt.Appendf(nil, `{"id":%s,%s`, id, rest)
	repeated := bytes.Join(lines, []byte("\n"))
	_, _, oneErr := decodeCheckpointInParts(path, repeated, 1)
	require.ErrorIs(t, oneErr, ErrCorruptCheckpoint)
	for _, parts := range []int{2, 7, 2000} {
		_, ok, err := decodeCheckpointInParts(path, repeated, parts)
		require.True(t, ok)
		require.Equal(t, oneErr.Error(), fmt.Sprint(err), "%d parts", parts)
	}
}

func TestCheckpointMissingIsEmpty(t *testing.T) {
	got, err := ReadCheckpoint(filepath.Join(t.TempDir(), CheckpointFileName))
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestCheckpointCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFileName)
	for name, content := range map[string]string{
		"truncated":                   `{"version":1,"identities":[{"id":16777217,"lab`,
		"not json":                    `hello`,
		"wrong version":               `{"version":9,"identities":[]}`,
		"unknown field":               `{"version":1,"identities":[],"extra":1}`,
		"not local":                   `{"version":1,"identities":[{"id":2,"labels":"reserved:world"}]}`,
		"bad labels":                  `{"version":1,"identities":[{"id":16777217,"labels":"cidr:10.0.0.1/8"}]}`,
		"duplicate":                   `{"version":1,"identities":[{"id":16777217,"labels":"a:b"},{"id":16777217,"labels":"a:c"}]}`,
		"duplicate, apart":            `{"version":1,"identities":[{"id":16777218,"labels":"a:b"},{"id":16777217,"labels":"a:c"},{"id":16777218,"labels":"a:d"}]}`,
		"trailing data":               `{"version":1,"identities":[]} {}`,
		"duplicate, as written":       "{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"a:b\"},\n{\"id\":16777217,\"labels\":\"a:c\"}\n]}\n",
		"not local, as written":       "{\"version\":1,\"identities\":[\n{\"id\":2,\"labels\":\"reserved:world\"}\n]}\n",
		"bad labels, as written":      "{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.1/8\"}\n]}\n",
		"duplicate apart, as written": "{\"version\":1,\"identities\":[\n{\"id\":16777218,\"labels\":\"a:b\"},\n{\"id\":16777217,\"labels\":\"a:c\"},\n{\"id\":16777218,\"labels\":\"a:d\"}\n]}\n",
		"truncated, as written":       "{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"a:b\"}\n]",
	} {
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		_, err := ReadCheckpoint(path)
		require.ErrorIs(t, err, ErrCorruptCheckpoint, name)
		require.ErrorContains(t, err, path, "%s: the error names the file", name)
	}
}

func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, atomicfile.TempPattern(CheckpointFileName)))
	require.NoError(t, err)
	return matches
}

// TestCheckpointStartIgnoresHalfWrittenTemp: a crash between writing the
// temporary file and renaming it leaves a half-written temporary file and
// the previous checkpoint. Start must read the previous checkpoint, ignore
// and remove the temporary file.
func TestCheckpointStartIgnoresHalfWrittenTemp(t *testing.T) {
	dir := t.TempDir()
	want := testCheckpoint(3)
	require.NoError(t, writeCheckpoint(filepath.Join(dir, CheckpointFileName), want.All()))
	half := filepath.Join(dir, "."+CheckpointFileName+".tmp-12345")
	require.NoError(t, os.WriteFile(half, []byte(`{"version":1,"identities":[{"id":1677`), 0o600))

	c := newCheckpointer(nil, nil, hivetest.Logger(t), dir)
	require.NoError(t, c.Start(nil))
	require.Equal(t, want, previous(t, c))
	require.Empty(t, tempFiles(t, dir))
}

// What the previous run saved is kept until restore has used it, and not
// after: the file stays until the next checkpoint replaces it.
func TestCheckpointerForgetsPrevious(t *testing.T) {
	dir := t.TempDir()
	want := testCheckpoint(3)
	require.NoError(t, writeCheckpoint(filepath.Join(dir, CheckpointFileName), want.All()))
	c := newCheckpointer(nil, nil, hivetest.Logger(t), dir)
	require.NoError(t, c.Start(nil))
	require.Equal(t, want, previous(t, c))
	require.Equal(t, want, previous(t, c), "read twice, the same")

	c.ForgetPrevious()
	require.Zero(t, previous(t, c).Len())
	_, err := os.Stat(filepath.Join(dir, CheckpointFileName))
	require.NoError(t, err, "the file stays")
}

func TestCheckpointStartMovesCorruptAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFileName)
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o600))

	c := newCheckpointer(nil, nil, hivetest.Logger(t), dir)
	require.NoError(t, c.Start(nil), "a corrupt checkpoint is not fatal")
	require.Empty(t, previous(t, c))
	_, err := os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
	aside, err := os.ReadFile(path + ".corrupt")
	require.NoError(t, err)
	require.Equal(t, "garbage", string(aside))
}

func TestCheckpointStartCreatesPrivateStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	c := newCheckpointer(nil, nil, hivetest.Logger(t), dir)
	require.NoError(t, c.Start(nil))
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())
}

func TestCheckpointStartFailsOnUnusableStateDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	c := newCheckpointer(nil, nil, hivetest.Logger(t), filepath.Join(file, "state"))
	require.ErrorContains(t, c.Start(nil), "create state directory")
}

const crashWriterEnv = "IDENTITYCELL_CRASH_WRITER_DIR"

// TestCheckpointCrashWriter is not a test on its own: run by
// TestCheckpointSurvivesCrashMidWrite in a child process, it writes
// checkpoints of growing size until it is killed.
func TestCheckpointCrashWriter(t *testing.T) {
	dir := os.Getenv(crashWriterEnv)
	if dir == "" {
		t.Skip("helper process for TestCheckpointSurvivesCrashMidWrite")
	}
	path := filepath.Join(dir, CheckpointFileName)
	for n := 1; ; n++ {
		if err := writeCheckpoint(path, testCheckpoint(n%5000).All()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}
}

// TestCheckpointSurvivesCrashMidWrite kills a process that is busy writing
// checkpoints at random moments; after each kill the checkpoint must read
// back whole (one of the versions written), and the next start must remove
// any temporary file the kill left.
func TestCheckpointSurvivesCrashMidWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	sawTemp := false
	for round := range 15 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointCrashWriter$")
		cmd.Env = append(os.Environ(), crashWriterEnv+"="+dir)
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(20+round*7) * time.Millisecond)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()

		sawTemp = sawTemp || len(tempFiles(t, dir)) > 0
		c := newCheckpointer(nil, nil, hivetest.Logger(t), dir)
		require.NoError(t, c.Start(nil), "round %d", round)
		read := previous(t, c)
		if read.Len() > 0 {
			require.Equal(t, testCheckpoint(read.Len()), read, "round %d: a whole version", round)
		}
		require.Empty(t, tempFiles(t, dir), "round %d", round)
	}
	t.Logf("a kill left a temporary file behind in some round: %v", sawTemp)
}

func TestCheckpointerWritesAfterInitialization(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFileName)
	previous := testCheckpoint(2)
	require.NoError(t, writeCheckpoint(path, previous.All()))

	done := a.RegisterProducer("producer")
	c := newCheckpointer(db, table, hivetest.Logger(t), dir)
	c.interval = time.Millisecond
	require.NoError(t, c.Start(nil))

	stop := startCheckpointer(t, c)

	id, err := a.allocate(cidr(7), 0)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	got, err := ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, previous, got, "not replaced before the identities are initialized")

	txn := a.WriteTxn()
	done(txn)
	txn.Commit()
	require.Eventually(t, func() bool {
		got, err := ReadCheckpoint(path)
		return err == nil && got.Len() == 1 && labelsOf(got, id) == cidr(7)
	}, 5*time.Second, 5*time.Millisecond)

	// A change made just before stopping is in the final checkpoint.
	id2, err := a.allocate(cidr(8), 0)
	require.NoError(t, err)
	require.NoError(t, stop())
	got, err = ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, checkpointOf(map[identity.Number]labels.Labels{id: cidr(7), id2: cidr(8)}), got)
}

// A shared identity's holders may come in the transaction that creates
// it: its row is first seen with two references, and is still new.
func TestCheckpointerWritesANewRowOfSeveralReferences(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFileName)
	done := a.RegisterProducer("producer")
	c := newCheckpointer(db, table, hivetest.Logger(t), dir)
	c.interval = time.Hour
	require.NoError(t, c.Start(nil))
	txn := a.WriteTxn()
	done(txn)
	txn.Commit()

	stop := startCheckpointer(t, c)
	require.Eventually(t, func() bool {
		got, err := ReadCheckpoint(path)
		return err == nil && got.Len() == 0
	}, 5*time.Second, 5*time.Millisecond, "the first, empty checkpoint")

	txn = a.WriteTxn()
	id, err := a.AllocateTxn(txn, cidr(9), 0)
	require.NoError(t, err)
	_, err = a.AllocateTxn(txn, cidr(9), 0)
	require.NoError(t, err)
	txn.Commit()
	require.NoError(t, stop())
	got, err := ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, checkpointOf(map[identity.Number]labels.Labels{id: cidr(9)}), got)
}

// A number withheld and not allocated has no labels to keep: the
// checkpoint lists only the allocated identities.
func TestCheckpointerSkipsNumbersOnlyWithheld(t *testing.T) {
	a, db, table := newTestAllocator(t, 100)
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFileName)
	c := newCheckpointer(db, table, hivetest.Logger(t), dir)
	c.interval = time.Millisecond
	require.NoError(t, c.Start(nil))

	withheld := identity.MinLocal + 10
	require.NoError(t, a.Withhold(withheld, identity.MinLocal+11))
	id, err := a.allocate(cidr(7), withheld)
	require.NoError(t, err)
	require.Equal(t, withheld, id)
	kept, err := a.allocate(cidr(8), 0)
	require.NoError(t, err)
	_, err = a.release(id)
	require.NoError(t, err)
	require.Equal(t, 1, table.NumObjects(db.ReadTxn()), "one is allocated")
	require.Equal(t, 2, a.NumWithheld())

	stop := startCheckpointer(t, c)
	require.Eventually(t, func() bool {
		got, err := ReadCheckpoint(path)
		return err == nil && got.Len() > 0
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	got, err := ReadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, checkpointOf(map[identity.Number]labels.Labels{kept: cidr(8)}), got)
}

// startCheckpointer runs c's loop until the returned stop, which returns
// the loop's error (or, the test ended before, until the test's end).
func startCheckpointer(t *testing.T, c *Checkpointer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stopped := make(chan error, 1)
	_, health := cell.NewSimpleHealth()
	go func() { stopped <- c.run(ctx, health) }()
	return func() error {
		cancel()
		return <-stopped
	}
}

// labelsOf is the labels c saved for id, empty if none.
func labelsOf(c Checkpoint, id identity.Number) labels.Labels {
	lbls, _ := c.Labels(id)
	return lbls
}
