// SPDX-License-Identifier: Apache-2.0

package fqdn

// The checkpoint: the cache's pairs with their expiry, so that a restart
// restores what the endpoints resolved before the ipcache is initialized.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"time"
)

const (
	// CheckpointFileName is the checkpoint's name in the state directory.
	CheckpointFileName = "fqdn-cache.json"

	checkpointVersion = 1

	// maxCheckpointLine bounds one entry's line: a 255-byte name, the
	// longest address and time, and the JSON around them.
	maxCheckpointLine = 512
)

type checkpointFile struct {
	Version int               `json:"version"`
	Entries []checkpointEntry `json:"entries"`
}

type checkpointEntry struct {
	Name    string     `json:"name"`
	Address netip.Addr `json:"address"`
	Expires time.Time  `json:"expires"`
}

// MaxCheckpointSize is the most bytes ReadCheckpoint reads for at most
// maxEntries entries.
func MaxCheckpointSize(maxEntries int) int64 {
	return int64(max(maxEntries, 0))*maxCheckpointLine + 64
}

// WriteCheckpoint writes entries (as [Cache.Entries] lists them) as a
// checkpoint: a version and one entry per line, with its name, address
// and expiry (RFC 3339). Whether an entry was deferred is not written:
// Restore derives it from the expiry. The caller writes the file
// atomically (internal/atomicfile).
//
// Possible errors: w's.
func WriteCheckpoint(w io.Writer, entries []Entry) error {
	out := bufio.NewWriterSize(w, 1<<16)
	fmt.Fprintf(out, "{\"version\":%d,\"entries\":[", checkpointVersion)
	for i, e := range entries {
		if i > 0 {
			out.WriteByte(',')
		}
		line, err := json.Marshal(checkpointEntry{Name: e.Name, Address: e.Addr, Expires: e.Expires.UTC()})
		if err != nil {
			return fmt.Errorf("encode fqdn checkpoint entry %s %s: %w", e.Name, e.Addr, err)
		}
		out.WriteByte('\n')
		out.Write(line)
	}
	out.WriteString("\n]}\n")
	return out.Flush()
}

// ReadCheckpoint reads a checkpoint WriteCheckpoint wrote, of at most
// maxEntries entries (MaxCheckpointSize bytes), checking each entry: a
// name a selector can match, a valid address without a zone, each pair
// once. An empty input is an empty checkpoint (the agent has not run
// before).
//
// Possible errors: ErrCorruptCheckpoint (wrapped, saying what is wrong),
// and r's.
func ReadCheckpoint(r io.Reader, maxEntries int) ([]Entry, error) {
	limit := MaxCheckpointSize(maxEntries)
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read fqdn checkpoint: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, corrupt(fmt.Sprintf("larger than %d bytes (%d entries)", limit, maxEntries))
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var file checkpointFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return nil, corrupt(err.Error())
	}
	if dec.More() {
		return nil, corrupt("trailing data")
	}
	if file.Version != checkpointVersion {
		return nil, corrupt(fmt.Sprintf("version %d, want %d", file.Version, checkpointVersion))
	}
	if len(file.Entries) > maxEntries {
		return nil, corrupt(fmt.Sprintf("%d entries, more than %d", len(file.Entries), maxEntries))
	}
	type pair struct {
		name string
		addr netip.Addr
	}
	seen := make(map[pair]struct{}, len(file.Entries))
	entries := make([]Entry, 0, len(file.Entries))
	for i, e := range file.Entries {
		switch {
		case e.Name != CanonicalName(e.Name) || !validName(e.Name):
			return nil, corrupt(fmt.Sprintf("entry %d: name %q is not a canonical DNS name", i, e.Name))
		case !e.Address.IsValid() || e.Address.Zone() != "" || e.Address.Is4In6():
			return nil, corrupt(fmt.Sprintf("entry %d (%s): address %q is not an IPv4 or IPv6 address", i, e.Name, e.Address))
		case e.Expires.IsZero():
			return nil, corrupt(fmt.Sprintf("entry %d (%s %s): no expiry", i, e.Name, e.Address))
		}
		if _, dup := seen[pair{e.Name, e.Address}]; dup {
			return nil, corrupt(fmt.Sprintf("entry %d: %s %s listed twice", i, e.Name, e.Address))
		}
		seen[pair{e.Name, e.Address}] = struct{}{}
		entries = append(entries, Entry{Name: e.Name, Addr: e.Address, Expires: e.Expires.UTC()})
	}
	return entries, nil
}

func corrupt(detail string) error {
	return fmt.Errorf("decode fqdn checkpoint: %w", detailError{ErrCorruptCheckpoint, detail})
}
