// SPDX-License-Identifier: Apache-2.0

package yamldir

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Timing is how Watch paces its reads.
type Timing struct {
	// Debounce is how long the directory must be quiet after a change
	// before it is read, so that a burst of events (an editor's save, a
	// ConfigMap swap, a copy of many files) gives one read...
	Debounce time.Duration
	// ...but a change is read at most MaxDelay after it, however busy the
	// directory is.
	MaxDelay time.Duration
	// Resync re-reads the directory periodically, for what no event tells
	// (an edit of a symlink's target in place outside the watched
	// directories, a lost event).
	Resync time.Duration
	// MinRetry and MaxRetry bound the backoff of retries while the
	// directory cannot be read, or the reader asks to read again.
	MinRetry, MaxRetry time.Duration
}

// DefaultTiming is the timing of the agent's directories.
func DefaultTiming() Timing {
	return Timing{
		Debounce: 100 * time.Millisecond,
		MaxDelay: time.Second,
		Resync:   time.Minute,
		MinRetry: 100 * time.Millisecond,
		MaxRetry: 10 * time.Second,
	}
}

// ReadFunc reads the directory (with Dir.Read) and applies what it found.
// It returns the directories to watch (Listing.WatchDirs), and whether to
// read again soon although the directory could be read (something of
// what it found could not be applied yet); or the error that kept it
// from reading the directory.
type ReadFunc func(ctx context.Context) (watchDirs []string, again bool, err error)

// Watch calls read at once, whenever the directory changes (fsnotify on
// the directory and on the directories of symlink targets, debounced),
// and every Resync, until ctx is done. A read that fails, or asks to read
// again, is retried with backoff. Without fsnotify (no inotify instance
// left), it reads every Resync only, and says so in the log.
func (d Dir) Watch(ctx context.Context, log *slog.Logger, timing Timing, read ReadFunc) error {
	w := &watcher{dir: d, log: log, watched: map[string]bool{}}
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
	)
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("Cannot watch the "+d.What+" directory for changes, re-reading it periodically only",
			"dir", d.Path, "interval", timing.Resync, "error", err)
	} else {
		defer fsw.Close()
		w.fsw = fsw
		events, errs = fsw.Events, fsw.Errors
	}

	timer := time.NewTimer(0)
	defer timer.Stop()
	resync := time.NewTicker(timing.Resync)
	defer resync.Stop()
	var (
		changedSince time.Time // the first change not read yet
		retry        = timing.MinRetry
		lastErr      string // of the last read, logged once
	)
	changed := func() {
		now := time.Now()
		if changedSince.IsZero() {
			changedSince = now
		}
		timer.Reset(max(0, min(timing.Debounce, timing.MaxDelay-now.Sub(changedSince))))
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
			log.Warn("Watching the "+d.What+" directory", "dir", d.Path, "error", err)
			changed()
		case <-resync.C:
			changed()
		case <-timer.C:
			changedSince = time.Time{}
			if w.fsw != nil {
				// Before reading: a change made after the read started
				// must make an event.
				if root, err := filepath.EvalSymlinks(d.Path); err == nil {
					w.add(root)
				}
			}
			dirs, again, err := read(ctx)
			if err != nil {
				if msg := err.Error(); msg != lastErr {
					lastErr = msg
					log.Warn("Cannot read the "+d.What+" directory, retrying", "dir", d.Path, "error", err)
				}
				timer.Reset(retry)
				retry = min(2*retry, timing.MaxRetry)
				continue
			}
			if lastErr != "" {
				lastErr = ""
				log.Info(capitalize(d.What)+" directory readable again", "dir", d.Path)
			}
			if w.fsw != nil && w.watch(dirs) {
				// A symlink target's directory is watched only now: a
				// change in it since the read would go unseen.
				changed()
			}
			if again {
				timer.Reset(retry)
				retry = min(2*retry, timing.MaxRetry)
			} else {
				retry = timing.MinRetry
			}
		}
	}
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// watcher keeps the fsnotify watches of a directory.
type watcher struct {
	dir Dir
	log *slog.Logger
	fsw *fsnotify.Watcher
	// watched says of each directory whether its watch works.
	watched map[string]bool
}

// watch makes the watched directories dirs, and reports whether one of
// them was not watched before. Every directory is added again on each
// read: a directory that was removed and created again needs a new watch.
func (w *watcher) watch(dirs []string) (added bool) {
	want := map[string]struct{}{}
	for _, dir := range dirs {
		want[dir] = struct{}{}
		added = w.add(dir) || added
	}
	for dir, worked := range w.watched {
		if _, ok := want[dir]; !ok {
			if worked {
				_ = w.fsw.Remove(dir) // fails if the directory is gone, which removed the watch
			}
			delete(w.watched, dir)
		}
	}
	return added
}

// add watches dir, and reports whether it was not watched before. A
// failure is logged when it starts.
func (w *watcher) add(dir string) (added bool) {
	err := w.fsw.Add(dir)
	worked, known := w.watched[dir]
	if err != nil && (worked || !known) {
		w.log.Warn("Cannot watch a "+w.dir.What+" directory, its changes are seen at the next periodic read",
			"dir", dir, "error", err)
	}
	w.watched[dir] = err == nil
	return err == nil && !worked
}
