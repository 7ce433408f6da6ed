// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/build"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/cnicell"
	"github.com/ipcache-agent/ipcache-agent/endpointapi"
	"github.com/ipcache-agent/ipcache-agent/endpointfile"
	"github.com/ipcache-agent/ipcache-agent/metricscell"
	"github.com/ipcache-agent/ipcache-agent/policycell"
	"github.com/ipcache-agent/ipcache-agent/statedir"
)

// The packaging files, relative to this package's directory.
const (
	packagingDir     = "../../packaging"
	daemonSetFile    = packagingDir + "/kubernetes/ipcache-agent.yaml"
	dockerfile       = packagingDir + "/container/Dockerfile"
	unitFile         = packagingDir + "/systemd/ipcache-agent.service"
	unitDefaultsFile = packagingDir + "/systemd/ipcache-agent.default"
	conflistFile     = packagingDir + "/cni/ipcache-agent.conflist"
	repositoryRoot   = "../.."
)

// The packages the image builds, as its `go build` lines name them.
const (
	agentPackage  = "./cmd/ipcache-agent"
	pluginPackage = "./cmd/ipcache-agent-cni"
)

// agentConfig is a command line and environment of the agent as a
// packaging file gives them, checked against the real root command.
type agentConfig struct {
	// flags is the root command's flag set with args and env applied:
	// what the agent would run with.
	flags *pflag.FlagSet
	args  []string
	env   map[string]string
}

// parseAgentConfig checks that every argument is --flag=value naming one
// of the agent's flags with a value it accepts, and so is every
// IPCACHE_AGENT_* variable, as the agent applies them: the command line
// wins over the environment. where names the file, for failures.
func parseAgentConfig(t *testing.T, where string, args []string, env map[string]string) agentConfig {
	t.Helper()
	root := newRootCommand(io.Discard, io.Discard)
	// Merges the persistent flags (--log-level...) into root.Flags().
	require.NoError(t, root.ParseFlags(nil))
	flags := root.Flags()
	for _, arg := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		require.True(t, ok && strings.HasPrefix(arg, "--"), "%s: argument %q is not --flag=value", where, arg)
		require.NotNil(t, flags.Lookup(name), "%s: %q: the agent has no flag --%s", where, arg, name)
		require.False(t, flags.Changed(name), "%s: --%s given twice", where, name)
		require.NoError(t, flags.Set(name, value), "%s: %q", where, arg)
	}
	for variable, value := range env {
		name, ok := strings.CutPrefix(variable, cells.EnvPrefix)
		require.True(t, ok, "%s: %s is not an %s* variable", where, variable, cells.EnvPrefix)
		name = strings.ReplaceAll(strings.ToLower(name), "_", "-")
		require.NotNil(t, flags.Lookup(name), "%s: %s: the agent has no flag --%s", where, variable, name)
		// The command line wins: a variable for a flag it gives would be
		// ignored without a word.
		require.False(t, flags.Changed(name), "%s: %s is ignored: the command line gives --%s", where, variable, name)
		require.NoError(t, flags.Set(name, value), "%s: %s=%q", where, variable, value)
	}
	return agentConfig{flags: flags, args: args, env: env}
}

// value is the flag's value the agent runs with.
func (c agentConfig) value(name string) string {
	return c.flags.Lookup(name).Value.String()
}

// requireHiveAccepts runs `ipcache-agent hive` with the configuration: the
// hive is built from it, so each cell's validation of its configuration
// (--node-name, --enable-policy, a --policy-dir that is a file...) has
// its say, as when the agent starts, without starting anything.
func requireHiveAccepts(t *testing.T, where string, c agentConfig) {
	t.Helper()
	var env []string
	for variable, value := range c.env {
		env = append(env, variable+"="+value)
	}
	_, stderr, code := runAgentCommandEnv(t, env, append([]string{"hive"}, c.args...)...)
	require.Equal(t, agentcmd.ExitOK, code, "%s: the agent refuses its configuration: %s", where, stderr)
}

// Kubernetes objects, as much of them as the manifest uses: decoded with
// KnownFields, so that a misspelt field (which the API server would
// reject) fails here too.
type k8sObject struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   k8sMeta           `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	Spec       *daemonSetSpec    `yaml:"spec"`
}

type k8sMeta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

type daemonSetSpec struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	UpdateStrategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxUnavailable int `yaml:"maxUnavailable"`
		} `yaml:"rollingUpdate"`
	} `yaml:"updateStrategy"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	HostNetwork                   bool        `yaml:"hostNetwork"`
	HostPID                       bool        `yaml:"hostPID"`
	PriorityClassName             string      `yaml:"priorityClassName"`
	AutomountServiceAccountToken  *bool       `yaml:"automountServiceAccountToken"`
	Tolerations                   []yaml.Node `yaml:"tolerations"`
	TerminationGracePeriodSeconds *int        `yaml:"terminationGracePeriodSeconds"`
	InitContainers                []container `yaml:"initContainers"`
	Containers                    []container `yaml:"containers"`
	Volumes                       []volume    `yaml:"volumes"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	Command         []string `yaml:"command"`
	Args            []string `yaml:"args"`
	Env             []envVar `yaml:"env"`
	SecurityContext struct {
		Privileged bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	StartupProbe   *httpProbe    `yaml:"startupProbe"`
	LivenessProbe  *httpProbe    `yaml:"livenessProbe"`
	ReadinessProbe *httpProbe    `yaml:"readinessProbe"`
	Resources      yaml.Node     `yaml:"resources"`
	VolumeMounts   []volumeMount `yaml:"volumeMounts"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type httpProbe struct {
	HTTPGet struct {
		Host string `yaml:"host"`
		Port int    `yaml:"port"`
		Path string `yaml:"path"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

type volumeMount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	ReadOnly         bool   `yaml:"readOnly"`
	MountPropagation string `yaml:"mountPropagation"`
}

type volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
}

// readManifest decodes the DaemonSet manifest's documents.
func readManifest(t *testing.T, file string) []k8sObject {
	t.Helper()
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	decoder := yaml.NewDecoder(bytes.NewReader(content))
	decoder.KnownFields(true)
	var objects []k8sObject
	for {
		var object k8sObject
		err := decoder.Decode(&object)
		if errors.Is(err, io.EOF) {
			return objects
		}
		require.NoError(t, err, file)
		objects = append(objects, object)
	}
}

// mountOf returns the container's volume mount that holds the path (the
// deepest one) and the path relative to it; ok is false if none does.
func mountOf(c container, p string) (mount volumeMount, rel string, ok bool) {
	for _, m := range c.VolumeMounts {
		r, err := filepath.Rel(m.MountPath, p)
		if err != nil || r == ".." || strings.HasPrefix(r, "../") || !filepath.IsAbs(p) {
			continue
		}
		if !ok || len(m.MountPath) > len(mount.MountPath) {
			mount, rel, ok = m, r, true
		}
	}
	return mount, rel, ok
}

func volumeNamed(spec podSpec, name string) (volume, bool) {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return volume{}, false
}

// hostPathOf returns the path on the host that the container's path is,
// through a hostPath volume; ok is false if the path is not on one.
func hostPathOf(spec podSpec, c container, p string) (host string, mount volumeMount, ok bool) {
	mount, rel, found := mountOf(c, p)
	if !found {
		return "", mount, false
	}
	v, found := volumeNamed(spec, mount.Name)
	if !found || v.HostPath == nil {
		return "", mount, false
	}
	return filepath.Join(v.HostPath.Path, rel), mount, true
}

// TestPackagingDaemonSet checks the DaemonSet manifest against the agent:
// its flags and variables, that each directory the agent uses is on the
// volume it must be on, the probes against the metrics server, the sample
// files against the agent's parsers, and the image paths against the
// Dockerfile.
func TestPackagingDaemonSet(t *testing.T) {
	t.Parallel()
	objects := readManifest(t, daemonSetFile)
	configMaps := map[string]map[string]string{}
	var daemonSets []k8sObject
	for _, o := range objects {
		require.Equal(t, "kube-system", o.Metadata.Namespace, "%s %s", o.Kind, o.Metadata.Name)
		switch {
		case o.Kind == "ConfigMap" && o.APIVersion == "v1":
			configMaps[o.Metadata.Name] = o.Data
		case o.Kind == "DaemonSet" && o.APIVersion == "apps/v1":
			daemonSets = append(daemonSets, o)
		default:
			t.Fatalf("%s: unexpected %s %s", daemonSetFile, o.APIVersion, o.Kind)
		}
	}
	require.Len(t, daemonSets, 1)
	ds := daemonSets[0].Spec
	require.NotNil(t, ds)
	for k, v := range ds.Selector.MatchLabels {
		require.Equal(t, v, ds.Template.Metadata.Labels[k], "the selector selects the pods of the template")
	}
	require.Equal(t, "RollingUpdate", ds.UpdateStrategy.Type)
	require.Equal(t, 1, ds.UpdateStrategy.RollingUpdate.MaxUnavailable)
	pod := ds.Template.Spec
	// The agent's devices and the CNI plugin's socket are the host's.
	require.True(t, pod.HostNetwork, "hostNetwork")
	require.NotNil(t, pod.TerminationGracePeriodSeconds)

	img := readDockerfile(t, dockerfile)
	require.Len(t, pod.Containers, 1)
	agent := pod.Containers[0]
	require.Equal(t, []string{img.binaries[agentPackage]}, agent.Command, "the agent container runs the image's agent")
	require.True(t, agent.SecurityContext.Privileged, "the agent needs privileges for BPF and bpffs")

	env := map[string]string{}
	for _, e := range agent.Env {
		switch {
		case e.ValueFrom != nil:
			// The downward API's value: a node's name here.
			require.Equal(t, "spec.nodeName", e.ValueFrom.FieldRef.FieldPath, e.Name)
			env[e.Name] = "node-a"
		default:
			env[e.Name] = e.Value
		}
	}
	config := parseAgentConfig(t, daemonSetFile, agent.Args, env)
	requireHiveAccepts(t, daemonSetFile, config)

	// Pins in the host's bpffs, where `ipcache-agent cleanup` on the host
	// finds them, with mounts the agent makes there seen by the host.
	host, mount, ok := hostPathOf(pod, agent, config.value("bpf-root"))
	require.True(t, ok, "--bpf-root %s is not on a hostPath volume", config.value("bpf-root"))
	require.Equal(t, bpfmaps.DefaultRoot, host, "--bpf-root is the host's bpffs")
	require.Equal(t, "Bidirectional", mount.MountPropagation, "--bpf-root's mount")

	// The state (checkpoint, sockets) survives the pod, where `cleanup`
	// on the host finds it.
	stateDir := config.value("state-dir")
	host, _, ok = hostPathOf(pod, agent, stateDir)
	require.True(t, ok, "--state-dir %s is not on a hostPath volume", stateDir)
	require.Equal(t, statedir.DefaultConfig.StateDir, host, "--state-dir is the host's default")

	// The host's CNI plugin dials the socket the agent serves.
	sockPath := config.value("cni-sock-path")
	if sockPath == "" {
		sockPath = filepath.Join(stateDir, cnicell.DefaultSockName)
	}
	host, _, ok = hostPathOf(pod, agent, sockPath)
	require.True(t, ok, "the CNI socket %s is not on a hostPath volume", sockPath)
	conflist := readConflist(t, conflistFile)
	require.Equal(t, conflist.socketPath, host, "%s: the plugin's socketPath is where the agent serves it", conflistFile)

	maxEntries, err := strconv.Atoi(config.value("policy-map-max-entries"))
	require.NoError(t, err)
	for flag, check := range map[string]func(t *testing.T, name, content string){
		"policy-dir":   func(t *testing.T, name, content string) { requireValidPolicyFile(t, name, content, maxEntries) },
		"endpoint-dir": requireValidEndpointFile,
	} {
		dir := config.value(flag)
		mount, rel, ok := mountOf(agent, dir)
		require.True(t, ok, "--%s %s is on no volume", flag, dir)
		require.Equal(t, ".", rel, "--%s is its volume's mount", flag)
		v, ok := volumeNamed(pod, mount.Name)
		require.True(t, ok && v.ConfigMap != nil, "--%s is on a ConfigMap volume", flag)
		data, ok := configMaps[v.ConfigMap.Name]
		require.True(t, ok, "--%s: ConfigMap %s is not in the file", flag, v.ConfigMap.Name)
		require.NotEmpty(t, data, "--%s: ConfigMap %s", flag, v.ConfigMap.Name)
		for name, content := range data {
			// The agent reads *.yaml and *.yml only.
			require.True(t, strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"),
				"--%s: ConfigMap %s: %s would be ignored", flag, v.ConfigMap.Name, name)
			check(t, name, content)
		}
	}

	// The probes reach the metrics server and ask it what it serves.
	addr := config.value("prometheus-serve-addr")
	addrHost, addrPort := requireServeAddr(t, addr)
	for _, p := range []struct {
		name  string
		probe *httpProbe
		path  string
	}{
		{"startupProbe", agent.StartupProbe, metricscell.HealthzPath},
		{"livenessProbe", agent.LivenessProbe, metricscell.HealthzPath},
		{"readinessProbe", agent.ReadinessProbe, metricscell.ReadyzPath},
	} {
		require.NotNil(t, p.probe, p.name)
		get := p.probe.HTTPGet
		require.Equal(t, p.path, get.Path, p.name)
		require.Equal(t, addrPort, strconv.Itoa(get.Port), "%s: the port of --prometheus-serve-addr %s", p.name, addr)
		if a, err := netip.ParseAddr(addrHost); err == nil && a.IsLoopback() {
			// The kubelet reaches the pod's loopback only as its own: in
			// the host's network namespace, asking for it by name.
			probeHost, err := netip.ParseAddr(get.Host)
			require.True(t, err == nil && probeHost.IsLoopback(), "%s: host %q does not reach %s", p.name, get.Host, addr)
		}
	}

	// The init container installs the image's plugin on the host, where
	// the runtime looks for the conflist's plugin type.
	require.Len(t, pod.InitContainers, 1)
	install := pod.InitContainers[0]
	require.Equal(t, agent.Image, install.Image)
	require.True(t, img.hasShell, "the init container runs sh: the image's base must have one")
	require.Len(t, install.Command, 3)
	require.Equal(t, []string{"sh", "-c"}, install.Command[:2])
	commands := strings.Split(install.Command[2], "&&")
	copyCommand := strings.Fields(commands[0])
	require.Len(t, copyCommand, 3, "cp SOURCE DEST: %q", commands[0])
	require.Equal(t, "cp", copyCommand[0])
	require.Equal(t, img.binaries[pluginPackage], copyCommand[1], "the init container copies the image's plugin")
	last := strings.Fields(commands[len(commands)-1])
	installed := last[len(last)-1]
	host, _, ok = hostPathOf(pod, install, installed)
	require.True(t, ok, "the plugin is installed at %s, on no hostPath volume", installed)
	require.Equal(t, path.Join("/opt/cni/bin", conflist.pluginType), host, "the plugin is where the runtime looks for it")
}

// requireServeAddr checks a --prometheus-serve-addr the agent can listen
// on, which the agent checks only as it starts, and returns its host and
// port.
func requireServeAddr(t *testing.T, addr string) (host, port string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "--prometheus-serve-addr %q", addr)
	n, err := strconv.ParseUint(port, 10, 16)
	require.True(t, err == nil && n > 0, "--prometheus-serve-addr %q: port", addr)
	return host, port
}

// conflist is what the tests read of the sample network configuration.
type conflist struct {
	// pluginType is the agent's plugin's type, its file name.
	pluginType string
	// socketPath is the socket it dials (its default if not given).
	socketPath string
}

func readConflist(t *testing.T, file string) conflist {
	t.Helper()
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	var list struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []struct {
			Type       string `json:"type"`
			SocketPath string `json:"socketPath"`
		} `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(content, &list), file)
	require.NotEmpty(t, list.Name, file)
	require.GreaterOrEqual(t, len(list.Plugins), 2, "%s: the plugin is chained after one that makes the interface", file)
	plugin := list.Plugins[len(list.Plugins)-1]
	require.Equal(t, path.Base(pluginPackage), plugin.Type, file)
	if plugin.SocketPath == "" {
		plugin.SocketPath = endpointapi.DefaultSockPath
	}
	return conflist{pluginType: plugin.Type, socketPath: plugin.SocketPath}
}

func requireValidPolicyFile(t *testing.T, name, content string, maxEntries int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(file, []byte(content), 0o600))
	results := policycell.ValidateFiles([]string{file}, maxEntries)
	require.Len(t, results, 1)
	require.NoError(t, results[0].Err, name)
	require.Empty(t, results[0].Warnings, name)
	require.NotEmpty(t, results[0].Policies, name)
}

func requireValidEndpointFile(t *testing.T, name, content string) {
	t.Helper()
	docs, err := endpointfile.Parse(name, []byte(content))
	require.NoError(t, err, name)
	require.NotZero(t, len(docs.Endpoints)+len(docs.Namespaces)+len(docs.Nodes), "%s: no documents", name)
}

// image is what the tests read of the Dockerfile.
type image struct {
	// binaries are the paths in the final image of the binaries the
	// build stage builds, by package.
	binaries map[string]string
	// entrypoint is the final image's ENTRYPOINT (exec form).
	entrypoint []string
	// hasShell is false for a final stage from scratch or distroless.
	hasShell bool
}

// readDockerfile reads the Dockerfile as far as the tests need: the `go
// build` lines of each stage (each must build a package main of this
// repository, statically), and the final stage's COPYs from them.
func readDockerfile(t *testing.T, file string) image {
	t.Helper()
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	// Continuation lines joined, comments dropped.
	text := strings.ReplaceAll(string(content), "\\\n", " ")
	args := map[string]string{}
	expand := func(s string) string {
		return os.Expand(s, func(name string) string { return args[name] })
	}
	// outputs are the binaries each stage builds: path to package.
	outputs := map[string]map[string]string{}
	var stage string
	var stages int
	img := image{binaries: map[string]string{}}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instruction, rest, _ := strings.Cut(line, " ")
		fields := strings.Fields(rest)
		switch strings.ToUpper(instruction) {
		case "ARG":
			if stages == 0 {
				name, value, _ := strings.Cut(rest, "=")
				args[strings.TrimSpace(name)] = strings.TrimSpace(value)
			}
		case "FROM":
			stages++
			base := expand(fields[0])
			stage = strconv.Itoa(stages)
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				stage = fields[2]
			}
			outputs[stage] = map[string]string{}
			img.binaries, img.entrypoint = map[string]string{}, nil
			img.hasShell = base != "scratch" && !strings.Contains(base, "distroless")
		case "RUN":
			for _, command := range strings.Split(rest, "&&") {
				words := strings.Fields(command)
				i := slices.Index(words, "go")
				if i < 0 || i+1 >= len(words) || words[i+1] != "build" {
					continue
				}
				require.Contains(t, words[:i], "CGO_ENABLED=0", "%s: %q: a static build", file, command)
				buildArgs := words[i+2:]
				require.Contains(t, buildArgs, "-trimpath", "%s: %q", file, command)
				o := slices.Index(buildArgs, "-o")
				require.True(t, o >= 0 && o+1 < len(buildArgs), "%s: %q: -o names the binary", file, command)
				out := buildArgs[o+1]
				pkg := buildArgs[len(buildArgs)-1]
				require.True(t, strings.HasPrefix(pkg, "./"), "%s: %q: builds one package, last", file, command)
				found, err := build.ImportDir(filepath.Join(repositoryRoot, pkg), 0)
				require.NoError(t, err, "%s: %q", file, command)
				require.Equal(t, "main", found.Name, "%s: %q builds a command", file, command)
				outputs[stage][out] = pkg
			}
		case "COPY":
			from := ""
			if len(fields) > 0 && strings.HasPrefix(fields[0], "--from=") {
				from, fields = strings.TrimPrefix(fields[0], "--from="), fields[1:]
			}
			if from == "" || len(fields) != 2 {
				continue
			}
			pkg, ok := outputs[from][fields[0]]
			require.True(t, ok, "%s: COPY --from=%s %s: not a binary the stage builds", file, from, fields[0])
			img.binaries[pkg] = fields[1]
		case "ENTRYPOINT":
			require.NoError(t, json.Unmarshal([]byte(rest), &img.entrypoint), "%s: ENTRYPOINT in exec form", file)
		}
	}
	for _, pkg := range []string{agentPackage, pluginPackage} {
		require.NotEmpty(t, img.binaries[pkg], "%s: the final image has no binary of %s", file, pkg)
	}
	return img
}

// TestPackagingDockerfile checks the Dockerfile's builds (readDockerfile)
// and that the image runs the agent.
func TestPackagingDockerfile(t *testing.T) {
	t.Parallel()
	img := readDockerfile(t, dockerfile)
	require.Equal(t, []string{img.binaries[agentPackage]}, img.entrypoint)
	require.Equal(t, path.Base(pluginPackage), path.Base(img.binaries[pluginPackage]),
		"the plugin's file name is its CNI type")
}

// unit is a systemd unit file: each section's settings, in order.
type unit map[string][][2]string

func readUnit(t *testing.T, file string) unit {
	t.Helper()
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	u := unit{}
	section := ""
	text := strings.ReplaceAll(string(content), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			key, value, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s: %q", file, line)
			u[section] = append(u[section], [2]string{strings.TrimSpace(key), strings.TrimSpace(value)})
		}
	}
	return u
}

// get returns the values of a section's key, in order.
func (u unit) get(section, key string) []string {
	var values []string
	for _, kv := range u[section] {
		if kv[0] == key {
			values = append(values, kv[1])
		}
	}
	return values
}

// readEnvironmentFile returns the IPCACHE_AGENT_* assignments of an
// environment file, those commented out included (a sample's
// suggestions, which must work once uncommented).
func readEnvironmentFile(t *testing.T, file string) map[string]string {
	t.Helper()
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	env := map[string]string{}
	for _, line := range strings.Split(string(content), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		name, value, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(name, " \t") {
			continue
		}
		require.True(t, strings.HasPrefix(name, cells.EnvPrefix), "%s: %s is not the agent's", file, name)
		require.NotContains(t, value, `"`, "%s: %s: no quoting, as systemd would strip it", file, name)
		env[name] = value
	}
	require.NotEmpty(t, env, file)
	return env
}

// mountNamespaceSettings are the unit settings that give a service a
// mount (or network) namespace of its own, or run it as another user
// than root: a bpffs the agent mounted there would go with the agent,
// /sys/fs/bpf could be read-only, the devices would not be the host's, or
// the agent could not load BPF.
var mountNamespaceSettings = []string{
	"PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices", "PrivateMounts",
	"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
	"ProtectClock", "ProtectHostname", "ProtectProc", "ProcSubset", "ReadOnlyPaths",
	"ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths",
	"BindReadOnlyPaths", "MountFlags", "RootDirectory", "RootImage", "PrivateNetwork",
	"NetworkNamespacePath", "DynamicUser", "User",
}

// TestPackagingSystemdUnit checks the unit against the agent: its
// ExecStart's flags and the sample environment file's variables, the
// directories systemd makes for it, its restart policy and that it runs
// in the host's mount namespace; and has systemd-analyze verify it.
func TestPackagingSystemdUnit(t *testing.T) {
	t.Parallel()
	u := readUnit(t, unitFile)
	require.Equal(t, []string{"simple"}, u.get("Service", "Type"), "the agent does not speak sd_notify")
	execStart := u.get("Service", "ExecStart")
	require.Len(t, execStart, 1)
	require.NotContains(t, execStart[0], `"`, "this test splits ExecStart on spaces")
	require.NotContains(t, execStart[0], "$", "this test splits ExecStart on spaces")
	command := strings.Fields(execStart[0])
	require.Equal(t, "/usr/local/bin/ipcache-agent", command[0], "where packaging/README.md installs it")

	envFiles := u.get("Service", "EnvironmentFile")
	require.Equal(t, []string{"-/etc/default/ipcache-agent"}, envFiles)
	env := readEnvironmentFile(t, unitDefaultsFile)
	for _, e := range u.get("Service", "Environment") {
		name, value, _ := strings.Cut(e, "=")
		env[name] = value
	}
	config := parseAgentConfig(t, unitFile, command[1:], env)
	requireHiveAccepts(t, unitFile, config)

	// systemd makes the directories the agent uses: the state directory,
	// kept across restarts (the identity checkpoint), and the
	// configuration directories.
	require.Equal(t, []string{"ipcache-agent"}, u.get("Service", "RuntimeDirectory"))
	require.Equal(t, "/run/ipcache-agent", config.value("state-dir"), "--state-dir is the RuntimeDirectory")
	require.Equal(t, []string{"yes"}, u.get("Service", "RuntimeDirectoryPreserve"), "the checkpoint survives a restart")
	configDirs := strings.Fields(strings.Join(u.get("Service", "ConfigurationDirectory"), " "))
	for _, flag := range []string{"policy-dir", "endpoint-dir"} {
		dir, ok := strings.CutPrefix(config.value(flag), "/etc/")
		require.True(t, ok && slices.Contains(configDirs, dir), "--%s %s is a ConfigurationDirectory", flag, config.value(flag))
	}
	require.Equal(t, bpfmaps.DefaultRoot, config.value("bpf-root"))
	requireServeAddr(t, config.value("prometheus-serve-addr"))

	require.Equal(t, []string{"on-failure"}, u.get("Service", "Restart"))
	require.Equal(t, []string{"SIGTERM"}, u.get("Service", "KillSignal"), "SIGTERM is the agent's clean stop")
	require.Equal(t, []string{strconv.Itoa(agentcmd.ExitUsage)}, u.get("Service", "RestartPreventExitStatus"),
		"bad configuration is not restarted")
	for _, key := range mountNamespaceSettings {
		require.Empty(t, u.get("Service", key), "%s: the agent runs in the host's namespaces", key)
	}

	verifyUnit(t, unitFile, command[0])
}

// verifyUnit runs `systemd-analyze verify` on the unit, where it is
// installed. verify fails on an ExecStart binary that does not exist, and
// the agent is not installed where the unit runs it on a machine that runs
// the tests: the unit verified is a copy in which that path (only) is this
// test binary, an executable that exists. verify reports unknown keys and
// values it cannot parse on its output but still exits 0, so its output
// must be empty too.
func verifyUnit(t *testing.T, file, binary string) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("systemd-analyze is not installed: %v", err)
	}
	content, err := os.ReadFile(file)
	require.NoError(t, err)
	self, err := os.Executable()
	require.NoError(t, err)
	copied := strings.Replace(string(content), "ExecStart="+binary+" ", "ExecStart="+self+" ", 1)
	require.NotEqual(t, string(content), copied)
	verified := filepath.Join(t.TempDir(), filepath.Base(file))
	require.NoError(t, os.WriteFile(verified, []byte(copied), 0o644))
	out, err := exec.Command(analyze, "verify", verified).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify: %s", out)
	require.Empty(t, string(out), "systemd-analyze verify")
}
