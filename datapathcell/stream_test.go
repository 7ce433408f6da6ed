// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/hivetest"
	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/datapathcell/internal/mapwrite"
)

// unreadableMap is a map whose read fails.
type unreadableMap struct {
	mapwrite.Map
	err error
}

func (m unreadableMap) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, m.err
}

// A read that fails ends the stream with its error; the map's writer then
// reads the map itself.
func TestStreamEndsWithTheReadError(t *testing.T) {
	t.Parallel()
	d := newDatapath(Config{}, hivetest.Logger(t))
	stream := pinnedIPCache(d)
	broken := errors.New("broken")
	go func() { _ = d.readPinned(unreadableMap{err: broken}) }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for block, err := range stream.Blocks(ctx) {
		require.Empty(t, block)
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], broken)
	require.Nil(t, d.pinnedIPCache())
}

// A reader waiting for the read stops when its context ends.
func TestStreamWaitEndsWithTheContext(t *testing.T) {
	t.Parallel()
	d := newDatapath(Config{}, hivetest.Logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var errs []error
	for _, err := range pinnedIPCache(d).Blocks(ctx) {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], context.Canceled)
}
