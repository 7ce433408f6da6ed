// SPDX-License-Identifier: Apache-2.0

package cnicell

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// stateVersion is the state file's format; a file of another version is
// set aside as corrupt.
const stateVersion = 1

// maxStateFileSize bounds what the cell reads of its state file: far more
// than the endpoints a node holds.
const maxStateFileSize = 64 << 20

// stateFile is the state file's content.
type stateFile struct {
	Version   int      `json:"version"`
	Endpoints []record `json:"endpoints"`
}

// save writes the records to the state file. Called with mu held.
//
// Possible errors: atomicfile.Write's.
func (s *server) save() error {
	if s.statePath == "" {
		return nil
	}
	recs := slices.Collect(maps.Values(s.records))
	slices.SortFunc(recs, func(a, b record) int { return strings.Compare(a.Endpoint.ID(), b.Endpoint.ID()) })
	return atomicfile.Write(s.statePath, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(stateFile{Version: stateVersion, Endpoints: recs})
	})
}

// restore upserts the endpoints of the state file again: those the plugin
// registered before the agent stopped. It drops an endpoint whose
// host-side interface is gone (its DEL came while no agent ran, or the
// node rebooted) and one the registry refuses now (its address went to
// another endpoint meanwhile), and logs why. A file that cannot be read
// is set aside and the cell starts without it.
func (s *server) restore() {
	if s.statePath == "" {
		return
	}
	if err := atomicfile.RemoveTemps(s.statePath); err != nil {
		s.log.Warn("Could not remove temporary CNI state files", "error", err)
	}
	recs, err := readState(s.statePath)
	if errors.Is(err, ErrCorruptState) {
		aside, asideErr := statedir.SetAside(s.statePath)
		s.log.Error("CNI endpoint state file cannot be decoded: set aside, registered endpoints not restored",
			"error", err, "aside", aside, "set-aside error", asideErr)
		return
	}
	if err != nil {
		s.log.Error("CNI endpoint state file cannot be read: registered endpoints not restored", "error", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dropped := 0
	for _, rec := range recs {
		id := rec.Endpoint.ID()
		if rec.Endpoint.Interface != "" {
			if _, err := net.InterfaceByName(rec.Endpoint.Interface); err != nil {
				s.log.Info("CNI endpoint not restored: its interface is gone", "endpoint", id, "interface", rec.Endpoint.Interface)
				dropped++
				continue
			}
		}
		if _, err := s.source.Upsert(normalize(rec.Endpoint)); err != nil {
			s.log.Warn("CNI endpoint not restored", "endpoint", id, "error", err)
			dropped++
			continue
		}
		s.records[id] = rec
	}
	if dropped > 0 {
		if err := s.save(); err != nil {
			s.log.Warn("Could not save the CNI endpoints after dropping some", "error", err)
		}
	}
	s.log.Info("CNI endpoints restored", "restored", len(s.records), "dropped", dropped)
}

// readState reads the records of the state file at path; none if there is
// no file.
//
// Possible errors: ErrCorruptState (wrapped) for a file that does not
// decode, is of another version or is over maxStateFileSize; those of
// opening and reading the file.
func readState(path string) ([]record, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body, err := io.ReadAll(io.LimitReader(f, maxStateFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(body) > maxStateFileSize {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrCorruptState, path, maxStateFileSize)
	}
	var st stateFile
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorruptState, path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("%w: %s: version %d, not %d", ErrCorruptState, path, st.Version, stateVersion)
	}
	for _, rec := range st.Endpoints {
		if rec.Endpoint.Namespace == "" || rec.Endpoint.Name == "" {
			return nil, fmt.Errorf("%w: %s: an endpoint without a namespace or name", ErrCorruptState, path)
		}
	}
	return st.Endpoints, nil
}
