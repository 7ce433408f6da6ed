// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"context"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/fsnotify/fsnotify"
)

// watchTiming is how the directory job paces its reads.
type watchTiming struct {
	// debounce is how long the directory must be quiet after a change
	// before it is read, so that a burst of events (an editor's save, a
	// ConfigMap swap, a copy of many files) gives one read...
	debounce time.Duration
	// ...but a change is read at most maxDelay after it, however busy the
	// directory is.
	maxDelay time.Duration
	// resync re-reads the directory periodically, for what no event tells
	// (an edit of a symlink's target in place outside the watched
	// directories, a lost event).
	resync time.Duration
	// minRetry and maxRetry bound the backoff of retries while the
	// directory cannot be read.
	minRetry, maxRetry time.Duration
}

func defaultWatchTiming() watchTiming {
	return watchTiming{
		debounce: 100 * time.Millisecond,
		maxDelay: time.Second,
		resync:   time.Minute,
		minRetry: 100 * time.Millisecond,
		maxRetry: 10 * time.Second,
	}
}

// watchDirectory reads the policy directory at start and whenever it
// changes (fsnotify on the directory and on the directories of symlink
// targets, debounced), and periodically. A directory that cannot be read,
// or a policy whose ipcache resource is taken, is retried with backoff;
// until the directory has been read once, the policy producer is not done,
// so nothing is pruned on its account.
func (l *loader) watchDirectory(ctx context.Context, health cell.Health, timing watchTiming) error {
	var (
		events  <-chan fsnotify.Event
		errs    <-chan error
		watched = map[string]bool{}
	)
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		l.log.Warn("Cannot watch the policy directory for changes, re-reading it periodically only",
			"dir", l.dir, "interval", timing.resync, "error", err)
	} else {
		defer watcher.Close()
		events, errs = watcher.Events, watcher.Errors
	}

	read := time.NewTimer(0)
	defer read.Stop()
	resync := time.NewTicker(timing.resync)
	defer resync.Stop()
	var (
		changedSince time.Time // the first change not read yet
		retry        = timing.minRetry
		lastErr      string // of the last read, logged once
	)
	changed := func() {
		now := time.Now()
		if changedSince.IsZero() {
			changedSince = now
		}
		read.Reset(max(0, min(timing.debounce, timing.maxDelay-now.Sub(changedSince))))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			changed()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflow loses events: read everything again.
			l.log.Warn("Watching the policy directory", "dir", l.dir, "error", err)
			changed()
		case <-resync.C:
			changed()
		case <-read.C:
			changedSince = time.Time{}
			if watcher != nil {
				// Before reading: a change made after the read started
				// must make an event.
				if root, err := filepath.EvalSymlinks(l.dir); err == nil {
					l.addWatch(watcher, watched, root)
				}
			}
			dirs, err := l.load(ctx)
			if err != nil {
				if msg := err.Error(); msg != lastErr {
					lastErr = msg
					l.log.Warn("Cannot read the policy directory, retrying", "dir", l.dir, "error", err)
				}
				l.reportHealth(health)
				read.Reset(retry)
				retry = min(2*retry, timing.maxRetry)
				continue
			}
			if lastErr != "" {
				lastErr = ""
				l.log.Info("Policy directory readable again", "dir", l.dir)
			}
			if watcher != nil && l.watch(watcher, watched, dirs) {
				// A symlink target's directory is watched only now: a
				// change in it since the read would go unseen.
				changed()
			}
			l.reportHealth(health)
			if len(l.handleErrs) > 0 || l.saved.failed {
				// Some policy's resource is taken, or the policies in
				// force could not be saved: try again soon.
				read.Reset(retry)
				retry = min(2*retry, timing.maxRetry)
			} else {
				retry = timing.minRetry
			}
		}
	}
}

// watch makes the watched directories dirs, and reports whether one of
// them was not watched before. Every directory is added again on each
// read: a directory that was removed and created again needs a new watch.
func (l *loader) watch(watcher *fsnotify.Watcher, watched map[string]bool, dirs []string) (added bool) {
	want := map[string]struct{}{}
	for _, dir := range dirs {
		want[dir] = struct{}{}
		added = l.addWatch(watcher, watched, dir) || added
	}
	for dir, worked := range watched {
		if _, ok := want[dir]; !ok {
			if worked {
				_ = watcher.Remove(dir) // fails if the directory is gone, which removed the watch
			}
			delete(watched, dir)
		}
	}
	return added
}

// addWatch watches dir, and reports whether it was not watched before.
// watched says of each directory whether its watch works; a failure is
// logged when it starts.
func (l *loader) addWatch(watcher *fsnotify.Watcher, watched map[string]bool, dir string) (added bool) {
	err := watcher.Add(dir)
	worked, known := watched[dir]
	if err != nil && (worked || !known) {
		l.log.Warn("Cannot watch a policy directory, its changes are seen at the next periodic read",
			"dir", dir, "error", err)
	}
	watched[dir] = err == nil
	return err == nil && !worked
}
