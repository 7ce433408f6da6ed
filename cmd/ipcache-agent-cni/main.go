// SPDX-License-Identifier: Apache-2.0

// Command ipcache-agent-cni is the agent's CNI plugin. It is chained after
// the plugin that creates the workload's interface (ptp, bridge, ...) and
// registers the workload with the running agent as an endpoint, over the
// agent's endpoint socket (package endpointapi):
//
//   - ADD registers the endpoint and returns only once the agent says its
//     policy is in the kernel, so that its first packet is enforced; it
//     passes the previous plugin's result on unchanged.
//   - DEL removes it; it is idempotent, and succeeds with no agent running.
//   - CHECK fails unless the agent has the endpoint with the addresses,
//     labels and host-side interface this call would register.
//   - STATUS fails unless an agent serves the socket.
//   - GC removes the endpoints it registered for this network (by the
//     network configuration's name) whose attachment is not in
//     cni.dev/valid-attachments; with no agent running it does nothing.
//
// What it reads:
//
//   - The endpoint's name: K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS
//     (what Kubernetes' runtimes pass); without them, namespace "default"
//     and the container ID as the name.
//   - Its labels: the network configuration's args.cni.labels, in the CNI
//     conventions' form, a list of {"key": ..., "value": ...} objects. A
//     key given twice keeps its last value; an object without a key is an
//     error. Other entries of args are ignored, as the conventions ask.
//   - Its addresses: every address of prevResult's ips (without the prefix
//     length). Its host-side interface: prevResult's interface without a
//     sandbox (the host end of the veth ptp and bridge create; for bridge
//     the veth, not the bridge, which is listed first). Without prevResult
//     ADD fails: the plugin creates no interface of its own.
//   - The socket: the network configuration's socketPath, default
//     /run/ipcache-agent/cni.sock (the agent's --cni-sock-path).
//
// Example network configuration list:
//
//	{
//	  "cniVersion": "1.0.0",
//	  "name": "pods",
//	  "plugins": [
//	    {"type": "ptp", "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}},
//	    {"type": "ipcache-agent-cni",
//	     "args": {"cni": {"labels": [{"key": "app", "value": "web"}]}}}
//	  ]
//	}
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

func main() {
	var p plugin
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    p.add,
		Del:    p.del,
		Check:  p.check,
		Status: p.status,
		GC:     p.gc,
	}, version.All, "ipcache-agent-cni: registers workloads with ipcache-agent as endpoints")
}
