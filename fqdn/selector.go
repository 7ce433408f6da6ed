// SPDX-License-Identifier: Apache-2.0

package fqdn

import (
	"fmt"
	"strings"
)

// LabelSource is the source of the labels of the identities that
// toFQDNs selectors select: "fqdn:" followed by [Selector.String], as
// Cilium 1.16 labels them.
const LabelSource = "fqdn"

// maxSelectorLen is the longest matchName or matchPattern accepted, as
// Cilium's CRD bounds them.
const maxSelectorLen = 255

// Selector is one toFQDNs entry: a DNS name (MatchName) or a pattern
// (MatchPattern), never both. The zero value is not valid.
//
// A pattern's "*" alone matches every name; elsewhere "*" matches any run
// of the characters a name may hold ('-', '_', letters, digits) within
// one label, so "*.example.com" matches "a.example.com" and neither
// "a.b.example.com" nor "example.com". Names and patterns compare
// case-insensitively, with or without the final dot.
type Selector struct {
	MatchName    string `json:"matchName,omitempty" yaml:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty" yaml:"matchPattern,omitempty"`
}

// Validate reports whether the selector is one a policy may hold.
//
// Possible errors: ErrEmptySelector, ErrBothSelectors, ErrInvalidName
// (wrapped) and ErrInvalidPattern (wrapped).
func (s Selector) Validate() error {
	_, err := s.Compile()
	return err
}

// String is the selector's canonical form, the value of its identity
// label (see [Selector.Label]): the name or the pattern in lower case,
// without the final dot ("*" stays "*"). Cilium 1.16 uses the name or the
// pattern as written; folding case and the final dot here makes the
// spellings the matcher treats as one share one identity.
func (s Selector) String() string {
	if s.MatchName != "" {
		return CanonicalName(s.MatchName)
	}
	return CanonicalName(s.MatchPattern)
}

// Label is the label of the identities the selector selects:
// "fqdn:<String()>", for example "fqdn:*.example.com".
func (s Selector) Label() string { return LabelSource + ":" + s.String() }

// Compile validates the selector and returns its matcher.
//
// Possible errors: as Validate's.
func (s Selector) Compile() (Matcher, error) {
	switch {
	case s.MatchName == "" && s.MatchPattern == "":
		return Matcher{}, ErrEmptySelector
	case s.MatchName != "" && s.MatchPattern != "":
		return Matcher{}, ErrBothSelectors
	case s.MatchName != "":
		if err := checkSelectorText(s.MatchName, false); err != "" {
			return Matcher{}, detailError{ErrInvalidName, fmt.Sprintf("%q: %s", s.MatchName, err)}
		}
	default:
		if err := checkSelectorText(s.MatchPattern, true); err != "" {
			return Matcher{}, detailError{ErrInvalidPattern, fmt.Sprintf("%q: %s", s.MatchPattern, err)}
		}
	}
	canonical := s.String()
	if canonical == "*" {
		return Matcher{all: true, text: canonical}, nil
	}
	return Matcher{labels: strings.Split(canonical, "."), text: canonical}, nil
}

// checkSelectorText says what is wrong with a matchName (or, with
// wildcard, a matchPattern), or returns "". The rules are Cilium's:
// labels of the allowed characters separated by single dots, with an
// optional final dot.
func checkSelectorText(text string, wildcard bool) string {
	if len(text) > maxSelectorLen {
		return fmt.Sprintf("longer than %d characters", maxSelectorLen)
	}
	if wildcard && strings.Contains(text, "**") {
		return `"**" is not supported: "*" matches within one label`
	}
	label := 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '.':
			if label == 0 {
				return "empty label (a leading dot or two dots in a row)"
			}
			label = 0
		case nameChar(c) || (wildcard && c == '*'):
			label++
		default:
			allowed := `letters, digits, "-", "_" and "."`
			if wildcard {
				allowed = `letters, digits, "-", "_", "." and "*"`
			}
			return fmt.Sprintf("character %q at %d: only %s are allowed", c, i, allowed)
		}
	}
	return ""
}

// nameChar reports whether c may be in a label of a name a selector
// matches: the characters of Cilium's patterns.
func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// CanonicalName is name as the cache keys it and selectors compare it:
// ASCII lower case, without the final dot; the root stays ".". Escapes
// such as miekg/dns writes for unusual bytes ("\032") are kept as they
// are: such names never match a selector.
func CanonicalName(name string) string {
	if len(name) > 1 {
		name = strings.TrimSuffix(name, ".")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 'A' && c <= 'Z' {
			return asciiLower(name)
		}
	}
	return name
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Matcher is a compiled [Selector]. The zero value matches nothing.
type Matcher struct {
	all    bool
	labels []string // lower case; a label may hold '*'
	text   string
}

// String is the selector's canonical form ([Selector.String]).
func (m Matcher) String() string { return m.text }

// Match reports whether the selector matches name (in any case, with or
// without the final dot). It does not allocate.
func (m Matcher) Match(name string) bool {
	if len(name) > 1 {
		name = strings.TrimSuffix(name, ".")
	}
	if m.all {
		if name == "." {
			return true
		}
		return validName(name)
	}
	if len(m.labels) == 0 {
		return false
	}
	rest := name
	for i, pattern := range m.labels {
		label, after, found := strings.Cut(rest, ".")
		if found == (i == len(m.labels)-1) { // too many or too few labels
			return false
		}
		if !matchLabel(pattern, label) {
			return false
		}
		rest = after
	}
	return true
}

// validName reports whether name (without the final dot) is labels of
// name characters separated by single dots.
func validName(name string) bool {
	return name != "" && checkSelectorText(name, false) == ""
}

// matchLabel reports whether one label of a name matches one label of a
// pattern, where '*' matches any run of name characters. A label with any
// other character matches nothing: a pattern holds only name characters
// and '*'.
func matchLabel(pattern, label string) bool {
	for i := 0; i < len(label); i++ {
		if !nameChar(label[i]) {
			return false
		}
	}
	// Glob matching with backtracking to the last star: '*' never spans
	// a dot here, the caller split the labels.
	p, l := 0, 0
	star, starL := -1, 0
	for l < len(label) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, starL = p, l
			p++
		case p < len(pattern) && pattern[p] == lower(label[l]):
			p++
			l++
		case star >= 0:
			starL++
			p, l = star+1, starL
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
