// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
)

// Error codes of this plugin (CNI reserves 0-99 for its own; types.Err*).
const (
	// errRejected is a request the agent refused (an address in use, too
	// many endpoints, an invalid label) or could not enforce in time.
	errRejected uint = 100
)

// netConf is the plugin's network configuration.
type netConf struct {
	types.PluginConf

	// SocketPath is the agent's endpoint socket (--cni-sock-path).
	SocketPath string `json:"socketPath,omitempty"`

	Args struct {
		CNI struct {
			Labels []label `json:"labels,omitempty"`
		} `json:"cni"`
	} `json:"args"`
}

// label is one entry of args.cni.labels, in the CNI conventions' form.
type label struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// plugin runs the CNI commands.
type plugin struct{}

func (p plugin) add(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"ipcache-agent-cni must be chained after the plugin that creates the interface: no prevResult", "")
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "convert prevResult: "+err.Error(), "")
	}
	req, err := p.request(endpointapi.Add, args, conf, prev)
	if err != nil {
		return err
	}
	if err := call(conf, req); err != nil {
		return err
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

// del removes the endpoint. With no agent running it succeeds: a runtime
// retries a failed DEL for ever and cannot tear the sandbox down until one
// succeeds, and there is nothing to remove from an agent that is not
// there. An endpoint registered before the agent stopped is not left
// behind for good: at its next start the agent drops registered endpoints
// whose host-side interface is gone, which is what the previous plugin's
// DEL does to it.
func (p plugin) del(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	req, err := p.request(endpointapi.Del, args, conf, nil)
	if err != nil {
		return err
	}
	err = endpointapi.Call(context.Background(), conf.SocketPath, req)
	if errors.Is(err, endpointapi.ErrAgentNotRunning) {
		return nil
	}
	return cniError(req, err)
}

func (p plugin) check(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult", "")
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "convert prevResult: "+err.Error(), "")
	}
	req, err := p.request(endpointapi.Check, args, conf, prev)
	if err != nil {
		return err
	}
	return call(conf, req)
}

// status reports whether an agent serves the socket: without one, ADD
// would fail.
func (p plugin) status(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	conn, err := net.DialTimeout("unix", conf.SocketPath, endpointapi.DialTimeout)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("%v: %v", endpointapi.ErrAgentNotRunning, err), "")
	}
	conn.Close()
	return nil
}

// gc removes the endpoints the plugin registered for this network whose
// attachment is not among cni.dev/valid-attachments (absent: none is
// valid, as the CNI spec's GC and cnitool have it): the agent lists this
// network's attachments and each stale one gets its own DEL, which
// removes the endpoint only if that attachment still holds it, so a name
// that another attachment registered since the list keeps its endpoint.
// An attachment added after the runtime made its list is stale to this GC,
// as to every plugin's (host-local's too): ordering GC after the ADDs it
// lists is the runtime's part. With no agent running there is
// nothing to collect: at its next start the agent drops the endpoints
// whose interface is gone.
func (p plugin) gc(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	valid := make(map[types.GCAttachment]bool, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	ctx := context.Background()
	attachments, err := endpointapi.ListAttachments(ctx, conf.SocketPath, conf.Name)
	if errors.Is(err, endpointapi.ErrAgentNotRunning) {
		return nil
	}
	if err != nil {
		return cniError(endpointapi.Request{Command: endpointapi.Attachments, Network: conf.Name}, err)
	}
	var errs []error
	for _, a := range attachments {
		if valid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			continue
		}
		req := endpointapi.Request{Command: endpointapi.Del, ContainerID: a.ContainerID, IfName: a.IfName,
			Endpoint: endpoint.Endpoint{Namespace: a.Namespace, Name: a.Name}, Network: conf.Name}
		if err := endpointapi.Call(ctx, conf.SocketPath, req); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", req, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "GC: "+err.Error(), "")
	}
	return nil
}

// parseConf decodes the network configuration and its prevResult.
func parseConf(stdin []byte) (*netConf, error) {
	conf := &netConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network configuration: "+err.Error(), "")
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult: "+err.Error(), "")
	}
	if conf.SocketPath == "" {
		conf.SocketPath = endpointapi.DefaultSockPath
	}
	return conf, nil
}

// request builds the request of cmd; prev is nil for DEL, which needs
// only the name.
func (p plugin) request(cmd endpointapi.Command, args *skel.CmdArgs, conf *netConf, prev *types100.Result) (endpointapi.Request, error) {
	namespace, name := podName(args.Args)
	if name == "" {
		namespace, name = endpoint.DefaultNamespace, args.ContainerID
	}
	req := endpointapi.Request{
		Command:     cmd,
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Endpoint:    endpoint.Endpoint{Namespace: namespace, Name: name},
		Network:     conf.Name,
	}
	if prev == nil {
		return req, nil
	}
	for _, l := range conf.Args.CNI.Labels {
		if l.Key == "" {
			return req, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("args.cni.labels: a label without a key (value %q)", l.Value), "")
		}
		if req.Endpoint.Labels == nil {
			req.Endpoint.Labels = make(map[string]string)
		}
		req.Endpoint.Labels[l.Key] = l.Value
	}
	for _, ipc := range prev.IPs {
		addr, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			return req, types.NewError(types.ErrDecodingFailure,
				fmt.Sprintf("prevResult: bad address %v", ipc.Address.IP), "")
		}
		req.Endpoint.Addresses = append(req.Endpoint.Addresses, addr.Unmap())
	}
	req.Endpoint.Addresses = endpoint.SortedAddresses(req.Endpoint.Addresses)
	req.Endpoint.Interface = hostInterface(prev)
	return req, nil
}

// hostInterface is the result's host-side interface: the last one without
// a sandbox. The last, because bridge lists the bridge first and the
// veth's host end after it, and the endpoint is behind the veth.
func hostInterface(result *types100.Result) string {
	host := ""
	for _, intf := range result.Interfaces {
		if intf != nil && intf.Sandbox == "" {
			host = intf.Name
		}
	}
	return host
}

// podName returns K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS
// ("K=V;K=V"), empty when absent. It ignores the other keys: runtimes pass
// their own (IgnoreUnknown, K8S_POD_INFRA_CONTAINER_ID, ...).
func podName(cniArgs string) (namespace, name string) {
	for pair := range strings.SplitSeq(cniArgs, ";") {
		k, v, _ := strings.Cut(pair, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	if namespace == "" {
		namespace = endpoint.DefaultNamespace
	}
	return namespace, name
}

// call sends req to the agent and turns a failure into a CNI error.
func call(conf *netConf, req endpointapi.Request) error {
	return cniError(req, endpointapi.Call(context.Background(), conf.SocketPath, req))
}

// cniError is err, the failure of req, as a CNI error.
func cniError(req endpointapi.Request, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, endpointapi.ErrAgentNotRunning):
		// Runtimes retry an ADD that failed with "try again later".
		return types.NewError(types.ErrTryAgainLater, err.Error(), req.String())
	case errors.Is(err, endpointapi.ErrRejected):
		return types.NewError(errRejected, err.Error(), req.String())
	default:
		return types.NewError(types.ErrInternal, fmt.Sprintf("%s: %v", req, err), "")
	}
}
