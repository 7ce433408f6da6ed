// SPDX-License-Identifier: Apache-2.0

// Command corpus measures how much of a corpus of public network policy
// files the agent accepts and puts in force. The corpus is a manifest,
// sources.tsv: each row a file of a public repository at a commit, with
// the SHA-256 of its content. The files are not in this repository (they
// belong to their authors): corpus materializes them from git mirrors or
// stored copies into a directory outside it, runs the real
// `ipcache-agent policy validate` on each file alone, classifies each
// rejected file by its first blocking error, and with -enforce (root) loads
// the accepted files into the real agent and reads `policy/list` back.
//
// It reads: the manifest, the mirror directories, the agent binary.
// It writes: only under -out (the files, one directory per agent run with
// the agent's log, results.tsv and report.md); the agent runs it starts
// use a private bpffs mount, state directory and shell socket under -out,
// and it cleans them up (cleanup, unmount) after each run.
//
//	go build -o bin/ipcache-agent ./cmd/ipcache-agent
//	go run ./test/corpus -mirrors /work/.mirror -out /tmp/corpus -enforce
//
// See test/corpus/README.md for where the files come from and the figures.
package main
