// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// reads records what Watch's reads found.
type reads struct {
	mu    sync.Mutex
	found []map[string]string
}

func (r *reads) last() (int, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.found) == 0 {
		return 0, nil
	}
	return len(r.found), r.found[len(r.found)-1]
}

func testTiming() Timing {
	return Timing{Debounce: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Resync: time.Hour,
		MinRetry: 10 * time.Millisecond, MaxRetry: 50 * time.Millisecond}
}

// watch runs Watch on d until the test ends, recording each read's files;
// again, if not nil, says whether a read asks to read again.
func watch(t *testing.T, d Dir, again func() bool) *reads {
	r := &reads{}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() {
		stopped <- d.Watch(ctx, slog.New(slog.DiscardHandler), testTiming(), func(context.Context) ([]string, bool, error) {
			found, err := d.Read()
			if err != nil {
				return nil, false, err
			}
			files := map[string]string{}
			for name, f := range found.Files {
				files[name] = string(f.Content)
			}
			r.mu.Lock()
			r.found = append(r.found, files)
			r.mu.Unlock()
			return found.WatchDirs, again != nil && again(), nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})
	return r
}

// TestWatch: the directory is read at once, retried until it appears, and
// read again on each change, seen through fsnotify (the periodic read is
// an hour away), including a change of a symlink's target's directory.
func TestWatch(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "later")
	r := watch(t, Dir{Path: dir, MaxSize: 1 << 10, What: "endpoint"}, nil)

	time.Sleep(50 * time.Millisecond)
	n, _ := r.last()
	require.Zero(t, n, "no read while the directory does not exist")

	writeFile(t, filepath.Join(dir, "a.yaml"), "a")
	require.Eventually(t, func() bool { _, f := r.last(); return f["a.yaml"] == "a" }, 5*time.Second, 5*time.Millisecond)

	writeFile(t, filepath.Join(dir, "b.yaml"), "b")
	require.Eventually(t, func() bool { _, f := r.last(); return f["b.yaml"] == "b" }, 5*time.Second, 5*time.Millisecond)

	// A ConfigMap-like mount: the target's directory is watched too.
	writeFile(t, filepath.Join(dir, "..2024_01", "cm.yaml"), "v1")
	require.NoError(t, os.Symlink("..2024_01/cm.yaml", filepath.Join(dir, "cm.yaml")))
	require.Eventually(t, func() bool { _, f := r.last(); return f["cm.yaml"] == "v1" }, 5*time.Second, 5*time.Millisecond)
	writeFile(t, filepath.Join(dir, "..2024_01", "cm.yaml"), "v2")
	require.Eventually(t, func() bool { _, f := r.last(); return f["cm.yaml"] == "v2" }, 5*time.Second, 5*time.Millisecond)

	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.Eventually(t, func() bool { _, f := r.last(); _, ok := f["a.yaml"]; return !ok }, 5*time.Second, 5*time.Millisecond)
}

// TestWatchAgain: a read that asks to read again is retried, with backoff,
// until it no longer asks.
func TestWatchAgain(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	asks := 3
	r := watch(t, Dir{Path: dir, MaxSize: 1 << 10, What: "endpoint"}, func() bool {
		mu.Lock()
		defer mu.Unlock()
		asks--
		return asks >= 0
	})
	require.Eventually(t, func() bool { n, _ := r.last(); return n == 4 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	n, _ := r.last()
	require.Equal(t, 4, n, "no read once the reader stops asking and nothing changes")
}

// TestWatchStops: Watch returns when its context ends, even while a
// failing read is being retried.
func TestWatchStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan struct{}, 100)
	stopped := make(chan error)
	go func() {
		stopped <- Dir{Path: t.TempDir(), What: "endpoint"}.Watch(ctx, slog.New(slog.DiscardHandler), testTiming(),
			func(context.Context) ([]string, bool, error) {
				failed <- struct{}{}
				return nil, false, errors.New("cannot")
			})
	}()
	<-failed
	<-failed // retried
	cancel()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return when its context ended")
	}
}
