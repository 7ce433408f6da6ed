// SPDX-License-Identifier: Apache-2.0

// Package ipcachetest holds script commands for tests that act as owners
// of ipcache resource handles (as policies, restore or an embedding agent
// do), so that cell tests can drive the ipcache without those cells.
package ipcachetest

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/source"
)

// OwnerCommands returns test/upsert, test/remove and test/release, which
// own handles of the IPCache that current returns. Handles are kept per
// IPCache: after an agent restart (a new IPCache), owners start over, as
// real owners do.
func OwnerCommands(current func() *ipcachecell.IPCache) map[string]script.Cmd {
	var (
		handlesOf *ipcachecell.IPCache
		handles   map[string]*ipcachecell.Handle
	)
	handle := func(resource, src string, opts ...ipcachecell.HandleOption) (*ipcachecell.Handle, error) {
		if handlesOf != current() {
			handlesOf, handles = current(), map[string]*ipcachecell.Handle{}
		}
		if h, ok := handles[resource]; ok {
			return h, nil
		}
		s, err := source.Parse(src)
		if err != nil {
			return nil, err
		}
		h, err := current().NewHandle(resource, s, opts...)
		if err == nil {
			handles[resource] = h
		}
		return h, err
	}
	existing := func(resource string) (*ipcachecell.Handle, error) {
		if handlesOf != current() || handles[resource] == nil {
			return nil, fmt.Errorf("no handle for %s", resource)
		}
		return handles[resource], nil
	}
	cmds := map[string]script.Cmd{}
	cmds["test/upsert"] = script.Command(
		script.CmdUsage{
			Summary: "Upsert metadata for prefixes through a resource's handle",
			Args:    "resource source prefix[,prefix...] [labels=l1,l2] [requested=N] [explicit=N] [shared=true] (shared: the handle, when made, has SharedIdentity)",
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 3 {
				return nil, script.ErrUsage
			}
			var opts []ipcachecell.HandleOption
			if slices.Contains(args[3:], "shared=true") {
				opts = append(opts, ipcachecell.SharedIdentity())
			}
			h, err := handle(args[0], args[1], opts...)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			var md ipcachecell.Metadata
			for _, arg := range args[3:] {
				key, value, _ := strings.Cut(arg, "=")
				switch key {
				case "labels":
					md.Labels, err = labels.Parse(value)
				case "shared":
					// An option of the resource's handle, taken when the
					// handle is made (above).
				case "requested", "explicit":
					var n uint64
					n, err = strconv.ParseUint(value, 10, 32)
					if key == "requested" {
						md.RequestedIdentity = identity.Number(n)
					} else {
						md.ExplicitIdentity = identity.Number(n)
					}
				default:
					err = fmt.Errorf("unknown argument %q", arg)
				}
				if err != nil {
					return nil, err
				}
			}
			var batch []ipcachecell.PrefixUpsert
			for p := range strings.SplitSeq(args[2], ",") {
				prefix, err := netip.ParsePrefix(p)
				if err != nil {
					return nil, err
				}
				batch = append(batch, ipcachecell.PrefixUpsert{Prefix: prefix, Metadata: md})
			}
			return scriptcmd.Result("", h.UpsertBatch(batch))
		})
	cmds["test/remove"] = script.Command(
		script.CmdUsage{Summary: "Remove a resource's metadata for a prefix", Args: "resource prefix"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 2 {
				return nil, script.ErrUsage
			}
			h, err := existing(args[0])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			prefix, err := netip.ParsePrefix(args[1])
			if err != nil {
				return nil, err
			}
			return scriptcmd.Result("", h.Remove(prefix))
		})
	cmds["test/release"] = script.Command(
		script.CmdUsage{Summary: "Release a resource's handle", Args: "resource"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			h, err := existing(args[0])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			delete(handles, args[0])
			return scriptcmd.Result("", h.Release())
		})
	return cmds
}
