// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// verdict is what `policy validate -o json` says of one file.
type verdict struct {
	Valid    bool     `json:"valid"`
	Policies []string `json:"policies"`
	Kinds    []string `json:"kinds"`
	Error    string   `json:"error"`
	Entries  int      `json:"entries"`
}

// validate runs `<agent> policy validate -o json NAME` in dir on one file
// alone, so that a policy name another corpus file also uses does not
// count against it: the corpus comes from unrelated repositories, whose
// names collide (default/deny-all) without saying anything of the file.
//
// Possible errors: ErrValidate when the command exits other than 0 or 1
// or prints no verdict for the file.
func validate(agent, dir, name string) (verdict, error) {
	cmd := exec.Command(agent, "policy", "validate", "-o", "json", name)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return verdict{}, fmt.Errorf("%w: %s: %v: %s", ErrValidate, name, err, strings.TrimSpace(stderr.String()))
	}
	var doc struct {
		Files []verdict `json:"files"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Files) != 1 {
		return verdict{}, fmt.Errorf("%w: %s: output %q", ErrValidate, name, out)
	}
	return doc.Files[0], nil
}

// Blocker names: what stands between a rejected file and the agent, by
// the field its first error names. The names are the report's rows.
const (
	blockFromEndpoints   = "fromEndpoints (peers by label)"
	blockToEndpoints     = "toEndpoints (peers by label)"
	blockPodSelector     = "NetworkPolicy podSelector peer"
	blockNamespaceSel    = "NetworkPolicy namespaceSelector peer"
	blockEntities        = "entities other than world and all"
	blockL7              = "L7 rules (toPorts.rules)"
	blockTLS             = "TLS and L7 listeners (serverNames, listener, terminatingTLS, originatingTLS)"
	blockFQDN            = "toFQDNs"
	blockServices        = "toServices"
	blockRequires        = "fromRequires/toRequires"
	blockNodes           = "fromNodes/toNodes"
	blockGroups          = "fromGroups/toGroups"
	blockAuthentication  = "authentication"
	blockNodeSelector    = "nodeSelector (host policies)"
	blockLog             = "log"
	blockCIDRGroups      = "cidrGroupRef/cidrGroupSelector"
	blockNamedPorts      = "named ports"
	blockUnsupportedKind = "apiVersion or kind missing or not read"
	blockEmptyDirection  = "a direction without a value (`egress:`)"
	blockOther           = "other"
)

// formatBlockers are the blockers that are no policy feature: the report
// lists their files one by one.
var formatBlockers = map[string]bool{
	blockUnsupportedKind: true,
	blockEmptyDirection:  true,
	blockOther:           true,
}

// fieldBlockers are the blockers a field name alone decides.
var fieldBlockers = map[string]string{
	"fromEndpoints":     blockFromEndpoints,
	"toEndpoints":       blockToEndpoints,
	"rules":             blockL7,
	"serverNames":       blockTLS,
	"listener":          blockTLS,
	"terminatingTLS":    blockTLS,
	"originatingTLS":    blockTLS,
	"toFQDNs":           blockFQDN,
	"toServices":        blockServices,
	"fromRequires":      blockRequires,
	"toRequires":        blockRequires,
	"fromNodes":         blockNodes,
	"toNodes":           blockNodes,
	"fromGroups":        blockGroups,
	"toGroups":          blockGroups,
	"authentication":    blockAuthentication,
	"nodeSelector":      blockNodeSelector,
	"log":               blockLog,
	"cidrGroupRef":      blockCIDRGroups,
	"cidrGroupSelector": blockCIDRGroups,
}

var (
	// The agent's error: `file:line:col: invalid policy file: policy "NAME": PATH: MESSAGE`.
	policyErrorPattern  = regexp.MustCompile(`invalid policy file: policy "[^"]*": ([^ :]+): (.*)$`)
	indexPattern        = regexp.MustCompile(`\[[0-9]+\]`)
	unknownFieldPattern = regexp.MustCompile(`: unknown field ("[^"]*")`)
	npPeerPattern       = regexp.MustCompile(`\.(from|to)\[[0-9]+\]\.(podSelector|namespaceSelector)$`)
)

// classify names the blocker of a rejected file from its first error.
// An unknown field is named by the field (`unknown field "description"`),
// which is then a row of its own.
func classify(message string) string {
	switch {
	case strings.Contains(message, "is not a policy this agent reads"),
		strings.Contains(message, "document: apiVersion is required"),
		strings.Contains(message, "document: kind is required"):
		return blockUnsupportedKind
	case strings.Contains(message, ": no rules (write `"):
		return blockEmptyDirection
	}
	if m := unknownFieldPattern.FindStringSubmatch(message); m != nil {
		return "unknown field " + m[1]
	}
	m := policyErrorPattern.FindStringSubmatch(message)
	if m == nil {
		return blockOther
	}
	fieldPath, text := m[1], m[2]
	if p := npPeerPattern.FindStringSubmatch(fieldPath); p != nil {
		if p[2] == "podSelector" {
			return blockPodSelector
		}
		return blockNamespaceSel
	}
	if strings.HasPrefix(text, "entity ") {
		return blockEntities
	}
	if strings.Contains(text, "named ports are not supported") {
		return blockNamedPorts
	}
	last := indexPattern.ReplaceAllString(fieldPath[strings.LastIndex(fieldPath, ".")+1:], "")
	if b, ok := fieldBlockers[last]; ok {
		return b
	}
	return blockOther
}
